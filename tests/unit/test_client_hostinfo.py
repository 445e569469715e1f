"""Host details in benchmark results, and the busy-machine warning."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from client import hostinfo
from client.hostinfo import HostInfo, HostMonitor, busy_warning, process_cpu_seconds


def info(before: float | None, after: float | None, cpu_s: float = 0.0, dur: float = 10.0):
    return HostInfo(
        cpus=4, load_before=before, load_after=after, benchmark_cpu_s=cpu_s, duration_s=dur
    )


def test_quiet_machine_has_no_warning() -> None:
    assert busy_warning(info(0.5, 1.0)) is None
    assert busy_warning(info(None, None)) is None  # no load average on this system


def test_busy_before_the_run() -> None:
    warning = busy_warning(info(2.5, 2.5))
    assert warning is not None and "load average 2.50 before the run on 4 CPUs" in warning


def test_load_that_rose_beyond_the_benchmark_itself() -> None:
    # +3 load over the run, but the benchmark (and its server) kept 2.5 CPUs busy: fine.
    assert busy_warning(info(0.2, 3.2, cpu_s=25.0, dur=10.0)) is None
    # The same rise with the benchmark nearly idle: something else competed.
    warning = busy_warning(info(0.2, 3.2, cpu_s=1.0, dur=10.0))
    assert warning is not None and "from 0.20 to 3.20" in warning


def test_a_short_run_whose_own_load_has_not_shown_yet_is_quiet() -> None:
    # 0.51 -> 0.63 on 2 CPUs while the benchmark kept ~2 CPUs busy for a second or two:
    # the 1-minute average lags; nothing else competed.
    quiet = HostInfo(cpus=2, load_before=0.51, load_after=0.63, benchmark_cpu_s=4.3, duration_s=2.2)
    assert busy_warning(quiet) is None


def test_monitor_records_host_versions_and_commit(monkeypatch: pytest.MonkeyPatch) -> None:
    loads = iter([0.25, 0.75])
    monkeypatch.setattr(hostinfo, "load_average", lambda: next(loads))
    monitor = HostMonitor(server_pid=os.getpid())
    sum(i * i for i in range(200_000))  # some CPU of our own
    data = monitor.finish().to_dict()
    assert data["load_before"] == 0.25 and data["load_after"] == 0.75
    assert data["cpus"] >= 1 and data["benchmark_cpu_s"] >= 0 and data["duration_s"] > 0
    assert data["python"].count(".") == 2
    assert set(data["versions"]) == {"torch", "transformers", "httpx"}
    assert data["versions"]["httpx"] == "0.28.1"
    commit = data["git_commit"]
    assert commit is None or len(commit.removesuffix("-dirty")) == 40


def test_git_commit_outside_a_repository_is_none(tmp_path) -> None:
    assert hostinfo.git_commit(tmp_path) is None


def test_process_cpu_seconds() -> None:
    assert (process_cpu_seconds(os.getpid()) or 0) > 0
    assert process_cpu_seconds(2**22 + 12345) is None  # no such process


def test_tree_cpu_seconds_counts_child_processes() -> None:
    child = subprocess.Popen([sys.executable, "-c", "sum(i * i for i in range(3_000_000)); input()"],
                             stdin=subprocess.PIPE)  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while (process_cpu_seconds(child.pid) or 0) < 0.05 and time.monotonic() < deadline:
            time.sleep(0.05)
        own = process_cpu_seconds(os.getpid()) or 0
        tree = hostinfo.tree_cpu_seconds(os.getpid()) or 0
        assert tree >= own + (process_cpu_seconds(child.pid) or 0) - 0.02
        assert tree > own
    finally:
        child.communicate(b"\n", timeout=30)
    assert hostinfo.tree_cpu_seconds(2**22 + 12345) is None
