"""The engine watchdog (`mistral_serving/engines/watchdog.py`) and each engine's `stalled_for`:
readiness fails past the first limit and comes back, the exit fires past the second; the
PyTorch engine (both KV caches) with a blocked step, the replay engine with a stopped step
thread, and the engine-process proxy fed silence or a wedged child's own report.
Waits are bounded polls, never speed assertions."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from mistral_gpu_fallback.process import ipc
from mistral_gpu_fallback.process.client import ProcessEngine
from mistral_gpu_fallback.replay import ReplayEngine
from mistral_serving.engines.base import EngineLimits, SamplingOptions
from mistral_serving.engines.factory import start_torch_engine
from mistral_serving.engines.watchdog import Watchdog
from mistral_serving.generation.service import GenerationService
from mistral_serving.http.frontend import Frontend
from mistral_serving.ops.metrics import Metrics
from mistral_serving.settings import Settings
from mistral_serving.text.tokenizer import load_tokenizer
from tests.doubles.process_proxy import FakeProc, process_proxy
from tests.doubles.scripted_engine import ScriptedEngine

DEADLINE_S = 60.0
LIMITS = EngineLimits(max_input_len=32, max_seq_len=64, max_batch_size=4)


def wait_until(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


pytestmark = pytest.mark.usefixtures("restore_sigterm")


# ---- the watchdog itself ----


def test_stall_is_none_below_the_first_limit_and_a_reason_past_it() -> None:
    engine = ScriptedEngine()
    dog = Watchdog(engine, unready_s=5, exit_s=10)
    assert dog.stall() is None
    engine.stalled_s = 4.9
    assert dog.stall() is None
    engine.stalled_s = 5.0
    assert "no progress for 5.0s" in (dog.stall() or "")


def test_the_exit_fires_once_past_the_second_limit_and_not_before() -> None:
    engine = ScriptedEngine()
    exits: list[str] = []
    fired = threading.Event()

    def exit_fn(eng: object, reason: str) -> None:
        exits.append(reason)
        fired.set()

    dog = Watchdog(engine, unready_s=0.04, exit_s=0.08, exit_fn=exit_fn)
    engine.stalled_s = 0.06  # unready, not yet past the exit limit
    dog.start()
    try:
        time.sleep(0.3)  # several polls (0.01 s each): none may exit
        assert exits == []
        engine.stalled_s = 0.08
        assert fired.wait(DEADLINE_S)
    finally:
        dog.stop()
    assert len(exits) == 1
    assert "engine stalled: no progress for 0.1s" in exits[0]
    assert "engine_stall_exit_seconds=0.08" in exits[0] and "status 1" in exits[0]


def test_readiness_fails_while_stalled_and_comes_back_without_a_drain(dev_model: Path) -> None:
    engine = ScriptedEngine(limits=LIMITS)
    metrics = Metrics(CollectorRegistry())
    settings = Settings(engine_stall_unready_seconds=2, engine_stall_exit_seconds=3600)
    frontend = Frontend(settings, metrics)
    frontend.attach(GenerationService(settings, load_tokenizer(dev_model), engine, metrics))
    frontend.drainer._installed = True  # no SIGTERM handler in a unit test
    assert asyncio.run(frontend.is_healthy()) is True and frontend.ready
    engine.stalled_s = 2.5
    assert asyncio.run(frontend.is_healthy()) is False and not frontend.ready
    assert not frontend.drainer.draining  # hung is not dead: no drain, no SIGTERM
    engine.stalled_s = 0.0
    assert asyncio.run(frontend.is_healthy()) is True and frontend.ready


# ---- each engine's stalled_for ----


def _submit(engine, prompt: list[int], n: int) -> tuple[asyncio.AbstractEventLoop, asyncio.Queue]:
    loop = asyncio.new_event_loop()
    queue: asyncio.Queue = asyncio.Queue()
    engine.submit("r1", prompt, SamplingOptions(max_new_tokens=n, top_k=1), loop, queue)
    return loop, queue


@pytest.mark.parametrize("kind", ["dynamic", "static"])
def test_a_torch_engine_whose_step_blocks_reports_its_stall(dev_model: Path, kind: str) -> None:
    extra = {"pytorch_kv_cache": "static", "max_seq_len": 128} if kind == "static" else {}
    settings = Settings(artifact=str(dev_model), device="cpu", **extra)
    engine = start_torch_engine(dev_model, settings, 2)
    release = threading.Event()
    entered = threading.Event()
    real_prefill = engine._prefill

    def blocking_prefill(seqs: list) -> None:
        entered.set()
        release.wait(DEADLINE_S)  # a step that hangs (a slow compile, a wedged kernel)
        real_prefill(seqs)

    engine._prefill = blocking_prefill  # type: ignore[method-assign]
    try:
        assert engine.stalled_for() == 0.0  # idle
        loop, _ = _submit(engine, [1, 5, 6, 7], 3)
        assert entered.wait(DEADLINE_S)
        wait_until(lambda: engine.stalled_for() > 0.3, "the stall to grow")
        assert engine.is_healthy()  # alive all along: only stalled_for tells
        release.set()
        wait_until(lambda: engine.num_running() == 0 and not engine._waiting, "the request")
        wait_until(lambda: engine.stalled_for() == 0.0, "idle again")
        loop.close()
    finally:
        release.set()
        engine.shutdown()


def test_the_replay_engine_reports_a_stall_when_its_step_thread_stops() -> None:
    engine = ReplayEngine([5, 6, 7], 2, LIMITS, step_s=0.001)
    try:
        assert engine.stalled_for() == 0.0

        async def main() -> None:
            stream = engine.generate("r1", [1, 2], SamplingOptions(max_new_tokens=50))
            await anext(stream)
            engine._closed.set()  # the step thread stops with the request still live
            engine._thread.join(DEADLINE_S)
            await asyncio.to_thread(wait_until, lambda: engine.stalled_for() > 0.2, "stall")
            await stream.aclose()

        asyncio.run(main())
        assert engine.stalled_for() == 0.0  # its stream closed: nothing pending
    finally:
        engine.shutdown()


@pytest.fixture
def proxy() -> Iterator[tuple[ProcessEngine, Connection, FakeProc]]:
    with process_proxy(LIMITS) as parts:
        yield parts


def _pending_request(engine: ProcessEngine, child: Connection) -> tuple[asyncio.Task, int]:
    """Start a request on a fresh loop in a thread; return its task and the key the child
    got."""
    box: dict[str, object] = {}
    started = threading.Event()

    def run() -> None:
        async def consume() -> None:
            async for _ in engine.generate("r1", [1, 2], SamplingOptions(max_new_tokens=4)):
                pass

        loop = asyncio.new_event_loop()
        box["loop"] = loop
        task = loop.create_task(consume())
        box["task"] = task
        started.set()
        loop.run_until_complete(asyncio.wait([task]))
        loop.close()

    threading.Thread(target=run, daemon=True).start()
    assert started.wait(DEADLINE_S)
    message = ipc.decode_to_engine(child.recv_bytes())
    assert isinstance(message, ipc.Add)
    return box["task"], message.key  # type: ignore[return-value]


def test_a_silent_engine_process_is_stalled(proxy) -> None:
    engine, child, _ = proxy
    assert engine.stalled_for() == 0.0  # no request pending: silence is fine
    _, key = _pending_request(engine, child)
    wait_until(lambda: engine.stalled_for() > 0.3, "silence to count")  # SIGSTOPped: no word
    child.send_bytes(ipc.encode(ipc.Beat(0.0)))  # it speaks again: alive, progressing
    wait_until(lambda: engine.stalled_for() < 0.3, "the beat to count")
    child.send_bytes(ipc.encode(ipc.Step([ipc.Event(key, [7], "length")], 0.0, 0)))
    wait_until(lambda: engine.stalled_for() == 0.0, "the request to finish")


def test_a_wedged_engine_in_a_live_process_is_stalled_by_its_own_report(proxy) -> None:
    engine, child, _ = proxy
    _, key = _pending_request(engine, child)
    child.send_bytes(ipc.encode(ipc.Beat(50.0)))  # its monitor beats; its step loop is stuck
    wait_until(lambda: engine.stalled_for() >= 50.0, "the reported stall")
    child.send_bytes(ipc.encode(ipc.Step([ipc.Event(key, [7])], 0.0, 1)))
    wait_until(lambda: engine.stalled_for() < 50.0, "a step to reset it")
    child.send_bytes(ipc.encode(ipc.Step([ipc.Event(key, [], "length")], 0.0, 0)))


def test_shutdown_kills_a_silent_engine_process_at_once(proxy) -> None:
    engine, child, proc = proxy
    engine._heard_at -= 60  # not heard from for a minute (stopped)
    engine.shutdown()
    assert proc.returncode == -9  # killed, not waited on for SHUTDOWN_TIMEOUT_S


def test_the_worker_monitor_beats_with_its_engines_own_stall() -> None:
    """The engine process's monitor thread (alive while the step loop is wedged) sends
    a Beat with engine.stalled_for() every HEARTBEAT_S, idle or busy."""
    from mistral_gpu_fallback.process import worker

    engine = ScriptedEngine(limits=LIMITS)
    engine.stalled_s = 42.0
    sent: list[ipc.FromEngine] = []

    class Outbox:
        def send(self, message: ipc.FromEngine) -> None:
            sent.append(message)

        def send_gauges_if_changed(self) -> None:
            pass

    stopping = threading.Event()
    monitor = threading.Thread(
        target=worker._monitor, args=(engine, Outbox(), stopping), daemon=True
    )
    monitor.start()
    try:
        wait_until(lambda: ipc.Beat(42.0) in sent, "a beat")
    finally:
        stopping.set()
        monitor.join(DEADLINE_S)
