"""What a benchmark result needs to be trusted later: the host it ran on and how busy it was.

A run on a busy machine can be many times slower than the same run on an idle one, so
every result records the CPU count, the 1-minute load average before and after, the
versions that matter and the git commit, and :func:`busy_warning` says when the figures
should not be compared with others.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

VERSIONED = ("torch", "transformers", "httpx")


def cpu_count() -> int:
    """CPUs this process may run on (the affinity mask, which containers narrow)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def load_average() -> float | None:
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def process_cpu_seconds(pid: int) -> float | None:
    """utime + stime of a process (Linux /proc); None where that cannot be read."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def tree_cpu_seconds(pid: int) -> float | None:
    """CPU time of a process and all its live descendants (a server may run its work in
    child processes)."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            parents[int(stat.parent.name)] = int(fields[1])
        except (OSError, IndexError, ValueError):
            continue
    tree, frontier = {pid}, [pid]
    while frontier:
        parent = frontier.pop()
        for child, ppid in parents.items():
            if ppid == parent and child not in tree:
                tree.add(child)
                frontier.append(child)
    if process_cpu_seconds(pid) is None:
        return None
    return sum(process_cpu_seconds(p) or 0.0 for p in tree)


def own_cpu_seconds() -> float:
    """CPU time of this process and its reaped children."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def package_version(name: str) -> str | None:
    # importlib.metadata, not import: importing torch costs seconds and memory.
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def git_commit(cwd: Path | None = None) -> str | None:
    """HEAD's hash, with "-dirty" when the tree has uncommitted changes; None outside git."""
    where = cwd or Path.cwd()
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=where, capture_output=True, text=True, timeout=10
        )
        if head.returncode != 0:
            return None
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=where,
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


@dataclass
class HostInfo:
    cpus: int
    load_before: float | None
    load_after: float | None = None
    benchmark_cpu_s: float | None = None  # CPU this benchmark (and a local server) used
    duration_s: float | None = None
    hostname: str = field(default_factory=platform.node)
    platform: str = field(default_factory=platform.platform)
    python: str = field(default_factory=lambda: sys.version.split()[0])
    versions: dict[str, str | None] = field(
        default_factory=lambda: {name: package_version(name) for name in VERSIONED}
    )
    git_commit: str | None = field(default_factory=git_commit)
    warning: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class HostMonitor:
    """Snapshot the host before a run, and finish the record (and its warning) after it.

    ``server_pid``: a server on this same machine; its CPU time is counted as the
    benchmark's own load, not as competition.
    """

    def __init__(self, server_pid: int | None = None) -> None:
        self.server_pid = server_pid
        self.info = HostInfo(cpus=cpu_count(), load_before=load_average())
        self._cpu0 = self._cpu()
        self._t0 = time.monotonic()

    def _cpu(self) -> float:
        total = own_cpu_seconds()
        if self.server_pid is not None:
            total += tree_cpu_seconds(self.server_pid) or 0.0
        return total

    def finish(self) -> HostInfo:
        info = self.info
        info.load_after = load_average()
        info.duration_s = time.monotonic() - self._t0
        info.benchmark_cpu_s = self._cpu() - self._cpu0
        info.warning = busy_warning(info)
        return info


def busy_warning(info: HostInfo) -> str | None:
    """Why the figures may be off, or None for a quiet machine.

    Busy when the 1-minute load average before the run exceeds half the CPUs, or when it
    rose by more than half the CPUs beyond what the benchmark itself (this process, its
    children and ``server_pid``) kept busy on average: then something else competed.
    """
    if info.load_before is None:
        return None
    limit = 0.5 * info.cpus
    reasons: list[str] = []
    if info.load_before > limit:
        reasons.append(
            f"load average {info.load_before:.2f} before the run on {info.cpus} CPUs "
            f"(more than {limit:g})"
        )
    if info.load_after is not None:
        own = 0.0
        if info.benchmark_cpu_s is not None and info.duration_s:
            own = info.benchmark_cpu_s / info.duration_s
        # Only a rise beyond our own use means competition: a short run's own load has not
        # yet shown in the 1-minute average, which is no sign of a busy machine.
        rise = info.load_after - info.load_before - own
        if rise > limit:
            reasons.append(
                f"load average went from {info.load_before:.2f} to {info.load_after:.2f} "
                f"(the benchmark itself averaged {own:.2f} busy CPUs)"
            )
    if not reasons:
        return None
    return "the machine was busy: " + "; ".join(reasons) + ". Figures may not be comparable."
