"""What a start costs before `load()` runs: the process's age, read from Linux's /proc.

A cold pod's start is the container runtime's (image pull, mounts), then the process's own
(interpreter, imports of torch / TensorRT-LLM / Truss, the server's start), then `load()`
(artifact, tokenizer, engine). The last is timed by the service itself; the process's part
is how old the process already is when `load()` begins.
"""

from __future__ import annotations

import os
from pathlib import Path

PROC_STAT = Path("/proc/self/stat")
PROC_UPTIME = Path("/proc/uptime")


def process_age_seconds() -> float | None:
    """Seconds since this process started; None where /proc does not say (not Linux)."""
    try:
        # `pid (comm) state ...`: comm may hold spaces or ')', so split after the last ')'.
        after_comm = PROC_STAT.read_text().rsplit(")", 1)[1].split()
        start_ticks = int(after_comm[19])  # field 22, starttime, in clock ticks since boot
        uptime = float(PROC_UPTIME.read_text().split()[0])
        return round(max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK")), 3)
    except (OSError, ValueError, IndexError):
        return None
