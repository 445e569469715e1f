"""What the tests read of live processes (Linux /proc): whether one is still running, and
a process's children by command line."""

from __future__ import annotations

from pathlib import Path


def _stat(pid: int) -> tuple[str, int, bytes] | None:
    """(state, parent pid, command line), or None once the process is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()  # after the command name, which may hold ")"
    return fields[0], int(fields[1]), cmdline


def alive(pid: int) -> bool:
    """Running: not gone, and not a zombie (which has exited)."""
    info = _stat(pid)
    return info is not None and info[0] != "Z"


def children(pid: int, marker: bytes) -> list[int]:
    """The live children of `pid` whose command line holds `marker`, lowest pid first."""
    found = []
    for entry in Path("/proc").iterdir():
        info = _stat(int(entry.name)) if entry.name.isdigit() else None
        if info is not None and info[0] != "Z" and info[1] == pid and marker in info[2]:
            found.append(int(entry.name))
    return sorted(found)
