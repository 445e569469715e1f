"""The launcher of several front-end processes (`frontend_group._supervise`) over real
child processes standing in for the front-ends: one that ends unasked stops the others
and fails the launcher; a stop that a front-end ignores ends in a kill of its process
group within the bound; a clean stop by the forwarded signal is a success."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from mistral_gpu_fallback import frontends as frontend_group
from tests.processes import alive

DEADLINE_S = 60  # a bound on waiting, never a speed assertion

SLEEPER = "import time; time.sleep(600)"
# Ignores SIGTERM, and so does the child it starts in its own group (the owner's engine
# process stands in the owner's group): both must be killed.
STUBBORN = (
    "import signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "child = subprocess.Popen([sys.executable, '-c', "
    "'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)']); "
    "print(child.pid, flush=True); time.sleep(600)"
)


def start(code: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, start_new_session=True
    )


@pytest.fixture
def handlers() -> Iterator[None]:
    """`_supervise` installs SIGTERM and SIGINT handlers: pytest's come back after."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    yield
    for signum, handler in saved.items():
        signal.signal(signum, handler)


def supervise(procs: list[subprocess.Popen[bytes]], where: Path, stop_s: float) -> int:
    """The launcher's exit status over these processes; none is left running after."""
    try:
        return frontend_group._supervise(procs, where, stop_s)
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def test_a_front_end_that_ends_unasked_stops_the_others_and_fails(handlers, tmp_path):
    procs = [start(SLEEPER), start("import sys; sys.exit(3)"), start(SLEEPER)]
    status = supervise(procs, tmp_path, DEADLINE_S)
    assert status == 3
    assert procs[0].returncode == procs[2].returncode == -signal.SIGTERM


def test_a_stop_by_the_forwarded_signal_is_a_success(handlers, tmp_path):
    procs = [start(SLEEPER), start(SLEEPER)]
    threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGTERM)).start()
    status = supervise(procs, tmp_path, DEADLINE_S)
    assert status == 0
    assert all(p.returncode == -signal.SIGTERM for p in procs)


def test_a_front_end_that_ignores_the_stop_is_killed_with_its_group(handlers, tmp_path):
    stubborn = start(STUBBORN)
    assert stubborn.stdout is not None
    grandchild = int(stubborn.stdout.readline())
    procs = [start(SLEEPER), stubborn]
    threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGTERM)).start()
    status = supervise(procs, tmp_path, 1.0)
    assert status == 1  # a stop that needed a kill is a failure
    assert stubborn.returncode == -signal.SIGKILL
    for _ in range(DEADLINE_S * 10):
        if not alive(grandchild):
            break
        threading.Event().wait(0.1)
    assert not alive(grandchild)  # the engine process of an owner goes with it
