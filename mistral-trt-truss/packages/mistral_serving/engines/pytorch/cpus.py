"""How many CPUs this process may really use.

`os.cpu_count()` is the host's core count. In a container the usable share is smaller:
the CPU affinity mask (cpusets, `taskset`) and the cgroup CPU quota (Kubernetes CPU
limits) both cap it. A torch that starts one thread per host core inside a 2-CPU quota
spends its time descheduled, and every step waits for its slowest thread.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


def available_cpus(cgroup_root: Path = CGROUP_ROOT) -> int:
    """min(CPU affinity, cgroup quota rounded up), at least 1."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cpus = os.cpu_count() or 1
    quota = cgroup_cpu_quota(cgroup_root)
    if quota is not None:
        cpus = min(cpus, math.ceil(quota))
    return max(1, cpus)


def cgroup_cpu_quota(root: Path = CGROUP_ROOT) -> float | None:
    """CPUs the cgroup's quota allows (quota / period), or None when unlimited/unknown.
    cgroup v2: `cpu.max` holds "<quota|max> <period>"; v1: `cpu.cfs_quota_us` (-1:
    unlimited) and `cpu.cfs_period_us` under `cpu/` or `cpu,cpuacct/`."""
    v2 = _read(root / "cpu.max")
    if v2 is not None:
        parts = v2.split()
        if len(parts) == 2 and parts[0] != "max":
            return _ratio(parts[0], parts[1])
        return None
    for sub in ("cpu", "cpu,cpuacct"):
        quota, period = (
            _read(root / sub / "cpu.cfs_quota_us"),
            _read(root / sub / "cpu.cfs_period_us"),
        )
        if quota is not None and period is not None:
            return _ratio(quota, period)
    return None


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _ratio(quota: str, period: str) -> float | None:
    try:
        q, p = int(quota), int(period)
    except ValueError:
        return None  # unreadable: better the affinity count than a wrong guess
    return q / p if q > 0 and p > 0 else None


def default_torch_threads(cpus: int) -> int:
    """torch's intra-op threads when `torch_threads` is unset: one CPU is left to the
    server's event loop (HTTP, tokenization, streaming). On a busy machine torch's threads
    spin-wait for each other while the loop and other processes hold the cores, so more
    threads than free CPUs decode many times slower (bench/threads_bench.py;
    docs/perf/history/cpu-torch-threads.md)."""
    return max(1, cpus - 1)
