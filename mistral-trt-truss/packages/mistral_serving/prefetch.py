"""Read the artifact's files into the page cache while the process is still importing.

On a cold node the engine's loader reads the weights (or the TensorRT-LLM engine file)
only after torch and transformers, or TensorRT-LLM, are imported: 8-9 s on the H200 image
with the page cache empty, during which the disk is idle, and then 7.6 s at the disk's
rate during which the CPU waits. `start` reads the artifact's files front to back on
background threads from the moment the launcher knows the directory, so the loader later
copies from memory. It only reads (the loader still checks and parses every file); it
never makes a start fail: any error is one log line and the prefetch ends.

What is read: the regular files `manifest.scan_files` admits (no symlink out of the
artifact, no device or FIFO) of at least `MIN_FILE_BYTES`, in name order (the loader's
order), and only when they fit in `FIT_SHARE` of the memory the page cache may use (the
machine's `MemAvailable`, capped by the cgroup's limit): pages evicted before the loader
gets to them would be read twice.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from mistral_serving.manifest import ManifestError, scan_files

log = logging.getLogger(__name__)

CHUNK_BYTES = 32 * 2**20  # one read; several in flight keep a fast disk busy
READERS = 4
MIN_FILE_BYTES = 2**20  # config and tokenizer files are read when needed anyway
FIT_SHARE = 0.8
MEMINFO = Path("/proc/meminfo")
CGROUP_V2 = Path("/sys/fs/cgroup")
CGROUP_V1 = Path("/sys/fs/cgroup/memory")


@dataclass
class Prefetch:
    """A prefetch under way: its threads, and what they have read so far."""

    files: list[tuple[Path, int]]  # (path, size) in reading order
    threads: list[threading.Thread] = field(default_factory=list)
    bytes_read: int = 0
    started: float = field(default_factory=time.monotonic)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def total_bytes(self) -> int:
        return sum(size for _, size in self.files)

    def wait(self, timeout: float | None = None) -> bool:
        """True when every reader has ended (within `timeout` seconds)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for t in self.threads:
            t.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in self.threads)

    def _add(self, n: int) -> None:
        with self._lock:
            self.bytes_read += n


def start(directory: Path) -> Prefetch | None:
    """Begin reading `directory`'s large files on background threads; None (logged) when
    there is nothing to read, the files cannot be listed, or they do not fit."""
    try:
        listed = scan_files(directory)
    except (ManifestError, OSError) as exc:
        log.info("prefetch skipped: %s", exc)
        return None
    files = [
        (directory / name, st.size)
        for name, st in sorted(listed.items())
        if st.size >= MIN_FILE_BYTES
    ]
    total = sum(size for _, size in files)
    if not files:
        return None
    room = page_cache_room()
    if room is not None and total > FIT_SHARE * room:
        log.info(
            "prefetch skipped: the artifact's %.2f GB would not stay in the page cache "
            "(%.2f GB of memory free for it)",
            total / 1e9,
            room / 1e9,
        )
        return None
    job = Prefetch(files)
    work: queue.SimpleQueue[tuple[Path, int, int]] = queue.SimpleQueue()
    for path, size in files:
        for offset in range(0, size, CHUNK_BYTES):
            work.put((path, offset, min(CHUNK_BYTES, size - offset)))
    job.threads = [
        threading.Thread(target=_reader, args=(job, work), name=f"prefetch-{i}", daemon=True)
        for i in range(READERS)
    ]
    for t in job.threads:
        t.start()
    threading.Thread(target=_report, args=(job,), name="prefetch-report", daemon=True).start()
    log.info("prefetch: reading %d files, %.2f GB, into the page cache", len(files), total / 1e9)
    return job


def _reader(job: Prefetch, work: queue.SimpleQueue[tuple[Path, int, int]]) -> None:
    buffer = bytearray(CHUNK_BYTES)
    view = memoryview(buffer)
    fds: dict[Path, int] = {}
    try:
        while True:
            try:
                path, offset, length = work.get_nowait()
            except queue.Empty:
                return
            if path not in fds:
                fds[path] = os.open(path, os.O_RDONLY)
            got = 0
            while got < length:
                n = os.preadv(fds[path], [view[got:length]], offset + got)
                if n == 0:  # shorter than listed: the loader will say so
                    break
                got += n
            job._add(got)
    except OSError as exc:
        log.info("prefetch stopped: %s", exc)
        while not work.empty():  # the other readers stop too
            try:
                work.get_nowait()
            except queue.Empty:
                break
    finally:
        for fd in fds.values():
            os.close(fd)


def _report(job: Prefetch) -> None:
    job.wait()
    seconds = time.monotonic() - job.started
    log.info(
        "prefetch: %.2f GB read in %.1f s (%.2f GB/s)",
        job.bytes_read / 1e9,
        seconds,
        job.bytes_read / 1e9 / max(seconds, 1e-6),
    )


# ---- how much memory the page cache may use ----


def page_cache_room() -> int | None:
    """Bytes the page cache may grow by without evicting (None: unknown): the machine's
    MemAvailable, capped by this cgroup's memory limit less its usage."""
    room = [
        r
        for r in (
            mem_available(_read(MEMINFO)),
            cgroup_room(_read(CGROUP_V2 / "memory.max"), _read(CGROUP_V2 / "memory.current")),
            cgroup_room(
                _read(CGROUP_V1 / "memory.limit_in_bytes"),
                _read(CGROUP_V1 / "memory.usage_in_bytes"),
            ),
        )
        if r is not None
    ]
    return min(room) if room else None


def mem_available(meminfo: str | None) -> int | None:
    """`MemAvailable` of /proc/meminfo's text, in bytes (None: absent or malformed)."""
    for line in (meminfo or "").splitlines():
        name, _, rest = line.partition(":")
        if name == "MemAvailable":
            parts = rest.split()
            kb = _count(parts[0]) if len(parts) == 2 and parts[1] == "kB" else None
            return None if kb is None else kb * 1024
    return None


def cgroup_room(limit: str | None, usage: str | None) -> int | None:
    """A cgroup's limit less its usage (files' texts), in bytes; None without a limit
    ("max", v1's huge sentinel) or with either malformed."""
    lim, use = _count((limit or "").strip()), _count((usage or "").strip())
    if lim is None or use is None or lim >= 2**62:  # v1 writes ~2**63 for "no limit"
        return None
    return max(0, lim - use)


def _count(text: str) -> int | None:
    """A plain ASCII decimal count (int() would also take '²', '+1', '1_0' or ' 1')."""
    if not (0 < len(text) <= 20 and text.isascii() and text.isdigit()):
        return None
    return int(text)


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="ascii", errors="replace")[:65536]
    except OSError:
        return None
