"""Read the artifact's weight files into the OS page cache in the background.

Off by default (`load_prefetch_threads: 0`): the static engine's loader already reads
each shard front to back from several threads at the disk's rate (`engines/pytorch/weights.py`),
and on the H200 VM's disk reading ahead while Python, torch and CUDA start up slowed
their own (cold) reads more than it saved: start -> ready 22.7-24.9 s without, 23.8-31.6 s
with 1-8 threads (docs/performance.md). Disks that serve many parallel reads much faster
than one stream may still gain: then the launcher starts the reads first thing
(`prefetch_artifact`), before Truss and torch are imported; that is the only place (an
engine in its own process finds the same page cache). Reads are only a hint: any
error stops them quietly, and the loader reads (and checks) the files itself. No torch.
"""

from __future__ import annotations

import collections
import os
import threading
from pathlib import Path

from mistral_serving.artifacts import COMMIT_SHA, cached_snapshot
from mistral_serving.manifest import ManifestError, scan_files
from mistral_serving.settings import Settings

CHUNK_BYTES = 64 * 2**20
WEIGHT_SUFFIXES = (".safetensors", ".engine")  # checkpoint shards, TensorRT-LLM engines

_lock = threading.Lock()
_started: set[Path] = set()  # files this process is reading already (or has read)


def prefetch_files(paths: list[Path], threads: int, chunk: int = CHUNK_BYTES) -> int:
    """Start reading `paths` (those not started before in this process) from `threads`
    background threads, in file order, `chunk` bytes per read: several reads in flight,
    as a cloud disk needs. Returns at once: how many files it started on."""
    if threads < 1:
        return 0
    with _lock:
        fresh = [p for p in paths if p not in _started]
        _started.update(fresh)
    jobs: collections.deque[tuple[Path, int]] = collections.deque()
    for path in fresh:
        try:
            size = path.stat().st_size
        except OSError:
            continue
        jobs.extend((path, offset) for offset in range(0, size, chunk))
    if not jobs:
        return 0

    def work() -> None:
        fds: dict[Path, int] = {}
        buf = bytearray(chunk)
        try:
            while True:
                try:
                    path, offset = jobs.popleft()
                except IndexError:
                    return
                fd = fds.get(path)
                if fd is None:
                    fd = fds[path] = os.open(path, os.O_RDONLY)
                os.preadv(fd, [buf], offset)
        except OSError:
            return  # only a hint: the loader reads the files anyway
        finally:
            for fd in fds.values():
                os.close(fd)

    for i in range(min(threads, len(jobs))):
        threading.Thread(target=work, name=f"prefetch-{i}", daemon=True).start()
    return len(fresh)


def artifact_weight_files(settings: Settings) -> list[Path]:
    """The weight files of the artifact the settings name, if they are on this machine
    already: a local directory, or a pinned Hugging Face snapshot in the cache. Only files
    inside the artifact (`scan_files`' confinement); [] when anything is off (the loader
    reports it properly)."""
    try:
        directory = _local_directory(settings)
        if directory is None:
            return []
        files = scan_files(directory)
    except (ManifestError, OSError, RuntimeError, ValueError):  # e.g. "~nobody/x"
        return []
    return [directory / name for name in files if name.endswith(WEIGHT_SUFFIXES)]


def prefetch_artifact(settings: Settings) -> int:
    """Start reading the artifact's weights with `load_prefetch_threads` threads; how many
    files it started on. (Nothing is logged: it runs before logging is set up.)"""
    if settings.load_prefetch_threads < 1:
        return 0
    return prefetch_files(artifact_weight_files(settings), settings.load_prefetch_threads)


def _local_directory(settings: Settings) -> Path | None:
    if not settings.artifact:
        return None
    local = Path(settings.artifact).expanduser()
    if local.is_dir():
        return local
    revision = settings.artifact_revision or ""
    if "/" not in settings.artifact or not COMMIT_SHA.match(revision):
        return None  # only a pinned revision names files that cannot move
    snapshot = cached_snapshot(settings.artifact, revision, settings.cache_path)
    return snapshot if snapshot.is_dir() else None
