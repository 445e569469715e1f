"""Drainer: stop admitting at once, abort what is left after the grace period, once; and
its SIGTERM handler chained in front of the previous one (on the main thread)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading

from mistral_serving.ops.shutdown import Drainer


class Calls:
    def __init__(self) -> None:
        self.stop_admitting = 0
        self.abort_all = 0

    def stop(self) -> None:
        self.stop_admitting += 1

    def abort(self) -> int:
        self.abort_all += 1
        return 3


def test_begin_stops_admitting_now_and_aborts_after_the_grace() -> None:
    calls = Calls()
    drainer = Drainer(0.1, calls.stop, calls.abort)

    async def main() -> None:
        drainer.begin()
        assert drainer.draining
        assert calls.stop_admitting == 1  # at once, before any await
        assert calls.abort_all == 0
        await asyncio.sleep(0.03)
        assert calls.abort_all == 0  # still inside the grace period
        await asyncio.sleep(0.15)
        assert calls.abort_all == 1

    asyncio.run(main())


def test_begin_is_idempotent() -> None:
    calls = Calls()
    drainer = Drainer(0.02, calls.stop, calls.abort)

    async def main() -> None:
        drainer.begin()
        drainer.begin()
        await asyncio.sleep(0.01)
        drainer.begin()
        await asyncio.sleep(0.1)

    asyncio.run(main())
    assert (calls.stop_admitting, calls.abort_all) == (1, 1)


def test_zero_grace_aborts_on_the_next_loop_turn() -> None:
    calls = Calls()
    drainer = Drainer(0, calls.stop, calls.abort)

    async def main() -> None:
        drainer.begin()
        assert calls.abort_all == 0  # scheduled, not called inline
        await asyncio.sleep(0.01)
        assert calls.abort_all == 1

    asyncio.run(main())


def test_sigterm_begins_draining_and_chains_to_the_previous_handler(restore_sigterm: None) -> None:
    calls = Calls()
    previous_calls: list[tuple[int, bool]] = []
    drainer = Drainer(0.05, calls.stop, calls.abort)

    def previous(signum: int, frame: object) -> None:
        # Ours ran first: begin() is already scheduled on the loop (not run yet).
        previous_calls.append((signum, drainer.draining))

    signal.signal(signal.SIGTERM, previous)

    async def main() -> None:
        drainer.install()
        assert signal.getsignal(signal.SIGTERM) is not previous
        signal.raise_signal(signal.SIGTERM)
        await asyncio.sleep(0.01)
        assert previous_calls == [(signal.SIGTERM, False)]
        assert drainer.draining and calls.stop_admitting == 1
        await asyncio.sleep(0.1)
        assert calls.abort_all == 1

    asyncio.run(main())


def test_install_twice_chains_once(restore_sigterm: None) -> None:
    calls = Calls()
    previous_calls: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, frame: previous_calls.append(signum))
    drainer = Drainer(10, calls.stop, calls.abort)

    async def main() -> None:
        drainer.install()
        ours = signal.getsignal(signal.SIGTERM)
        drainer.install()
        assert signal.getsignal(signal.SIGTERM) is ours
        signal.raise_signal(signal.SIGTERM)
        await asyncio.sleep(0.01)

    asyncio.run(main())
    assert previous_calls == [signal.SIGTERM]
    assert calls.stop_admitting == 1


def test_sigterm_with_ignored_previous_handler(restore_sigterm: None) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    calls = Calls()
    drainer = Drainer(10, calls.stop, calls.abort)

    async def main() -> None:
        drainer.install()
        signal.raise_signal(signal.SIGTERM)  # SIG_IGN is not callable: nothing to chain
        await asyncio.sleep(0.01)

    asyncio.run(main())
    assert drainer.draining and calls.stop_admitting == 1


def test_install_off_the_main_thread_does_nothing(restore_sigterm: None) -> None:
    def marker(signum: int, frame: object) -> None:
        pass

    signal.signal(signal.SIGTERM, marker)
    drainer = Drainer(10, Calls().stop, Calls().abort)
    errors: list[BaseException] = []

    async def install() -> None:
        drainer.install()

    def run() -> None:
        try:
            asyncio.run(install())
        except BaseException as exc:  # reported below
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(5)
    assert errors == []
    assert signal.getsignal(signal.SIGTERM) is marker


def test_engine_died_signals_the_process_and_drains_once(restore_sigterm: None) -> None:
    received: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, frame: received.append(signum))
    calls = Calls()
    drainer = Drainer(10, calls.stop, calls.abort)

    async def main() -> None:
        drainer.engine_died()
        drainer.engine_died()  # already draining: not a second signal
        await asyncio.sleep(0.01)

    asyncio.run(main())
    assert received == [signal.SIGTERM]  # the container is restarted through the drain
    assert drainer.draining and calls.stop_admitting == 1


def listening_drainer(listen: float) -> tuple[Drainer, Calls, list[tuple[int, bool]]]:
    """A drainer with a listen window over a recording 'uvicorn' handler: each call says
    whether the drain had begun when the listener was told to close."""
    calls = Calls()
    drainer = Drainer(10, calls.stop, calls.abort, listen_seconds=listen)
    closed: list[tuple[int, bool]] = []
    signal.signal(signal.SIGTERM, lambda signum, frame: closed.append((signum, drainer.draining)))
    return drainer, calls, closed


async def until(check: object, bound_s: float = 10.0) -> None:
    """Yield to the loop until `check()` holds (a bound, not a measurement)."""
    for _ in range(int(bound_s / 0.005)):
        if check():  # type: ignore[operator]
            return
        await asyncio.sleep(0.005)
    raise AssertionError("not reached within the bound")


def test_sigterm_makes_the_server_unready_before_its_listener_closes(
    restore_sigterm: None,
) -> None:
    drainer, calls, closed = listening_drainer(0.05)

    async def main() -> None:
        drainer.install()
        signal.raise_signal(signal.SIGTERM)
        await until(lambda: drainer.draining)
        assert calls.stop_admitting == 1 and closed == []  # unready, still listening
        await until(lambda: closed)
        assert closed == [(signal.SIGTERM, True)]  # told to close only once draining

    asyncio.run(main())


def test_a_second_sigterm_closes_at_once_and_only_once(restore_sigterm: None) -> None:
    drainer, _, closed = listening_drainer(3600)  # the window would outlast the test

    async def main() -> None:
        drainer.install()
        signal.raise_signal(signal.SIGTERM)
        await until(lambda: drainer.draining)
        assert closed == []
        signal.raise_signal(signal.SIGTERM)
        assert closed == [(signal.SIGTERM, True)]  # in the handler itself

    asyncio.run(main())


def test_a_dead_engine_closes_without_the_listen_window(restore_sigterm: None) -> None:
    drainer, calls, closed = listening_drainer(3600)

    async def main() -> None:
        drainer.install()
        drainer.engine_died()  # SIGTERMs the process: nothing left to drain towards
        await until(lambda: closed)
        assert drainer.draining and calls.stop_admitting == 1

    asyncio.run(main())
    assert len(closed) == 1


def test_the_listen_window_never_outlasts_the_grace_period() -> None:
    assert Drainer(2, Calls().stop, Calls().abort, listen_seconds=30).listen_seconds == 2
    assert Drainer(60, Calls().stop, Calls().abort, listen_seconds=5).listen_seconds == 5
    assert Drainer(60, Calls().stop, Calls().abort).listen_seconds == 0  # the default: at once


EXIT_SCRIPT = """
import logging, sys, threading, time
from mistral_serving.ops.shutdown import exit_now

class SlowOnTheReason(logging.StreamHandler):
    # A slow stdout pipe, where it hurts: writing the reason lets the other threads run.
    def emit(self, record):
        super().emit(record)
        if record.getMessage() == "the reason":
            time.sleep(0.05)

handler = SlowOnTheReason(sys.stdout)
handler.setFormatter(logging.Formatter("%(message)s"))
logging.basicConfig(handlers=[handler], level=logging.INFO)
chatter = logging.getLogger("chatter")
started = threading.Barrier(5)

def chat(n):
    started.wait()
    while True:
        chatter.info("line from thread %d", n)

for n in range(4):
    threading.Thread(target=chat, args=(n,), daemon=True).start()
started.wait()
exit_now(3, "the reason")
"""


def test_exit_now_writes_the_reason_last_while_other_threads_log() -> None:
    # Four threads log in a tight loop while the process exits, and writing the reason is
    # slow: the reason is still the last line, once, and the status is the one asked for.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    for _ in range(5):
        done = subprocess.run(
            [sys.executable, "-c", EXIT_SCRIPT],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
        )
        assert done.returncode == 3, done.stderr
        lines = done.stdout.strip().splitlines()
        assert lines[-1] == "the reason", lines[-3:]
        assert lines.count("the reason") == 1


LOAD_SCRIPT = r"""
import logging, sys, types
from mistral_serving.ops.shutdown import exit_if_load_fails

class Refusal(ValueError):
    pass

logging.basicConfig(stream=sys.stdout, format="%(message)s")
raised = {"refusal": Refusal("no artifact there"), "bug": KeyError("oops")}[sys.argv[1]]

def load():
    try:
        raise raised
    except KeyError as exc:  # as a retry wraps it
        raise RuntimeError("retries exhausted") from exc

wrapper = types.SimpleNamespace(_load_impl=load)
exit_if_load_fails(wrapper, lambda exc: str(exc), expected=(Refusal,))
wrapper._load_impl()
"""


def test_a_failed_load_logs_a_traceback_only_when_unexpected() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}

    def run(kind: str) -> list[str]:
        done = subprocess.run(
            [sys.executable, "-c", LOAD_SCRIPT, kind],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
        )
        assert done.returncode == 1, done.stderr
        return done.stdout.strip().splitlines()

    refused = run("refusal")
    assert refused == ["load failed: no artifact there"]  # the reason says it all
    crashed = run("bug")
    assert "Traceback (most recent call last):" in crashed
    assert "KeyError: 'oops'" in crashed  # the cause too
    assert crashed[-1] == "load failed: retries exhausted"
