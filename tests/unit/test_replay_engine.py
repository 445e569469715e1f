"""The replay engine (benchmarks only): token stream, limits, abort, request options,
gauges, shutdown, and that it runs without torch."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading

import pytest

from mistral_gpu_fallback.replay import ReplayEngine
from mistral_serving.engines.base import (
    EngineError,
    EngineLimits,
    EngineRequestError,
    GuidedDecoding,
    SamplingOptions,
    TokenLogprob,
)

TOKENS = [10, 11, 12, 13, 14]
LIMITS = EngineLimits(max_input_len=16, max_seq_len=32, max_batch_size=4)


@pytest.fixture
def engine():
    eng = ReplayEngine(TOKENS, eos_token_id=2, limits=LIMITS, step_s=0.001)
    yield eng
    eng.shutdown()


async def collect(engine, rid, prompt, opts):
    return [d async for d in engine.generate(rid, prompt, opts)]


def test_it_replays_its_tokens_and_ends_with_length(engine):
    deltas = asyncio.run(collect(engine, "r", [1, 2], SamplingOptions(max_new_tokens=7)))
    tokens = [t for d in deltas for t in d.token_ids]
    assert tokens == [12, 13, 14, 10, 11, 12, 13]  # starts at len(prompt) % len(TOKENS)
    assert deltas[-1].finish_reason == "length"
    assert all(d.finish_reason is None for d in deltas[:-1])
    assert all(d.logprobs is None for d in deltas)


def test_options_eos_min_tokens_and_logprobs(engine):
    opts = SamplingOptions(max_new_tokens=4, ignore_eos=True, min_tokens=4, logprobs=3)
    deltas = asyncio.run(collect(engine, "o", [1], opts))
    tokens = [t for d in deltas for t in d.token_ids]
    logprobs = [lp for d in deltas for lp in d.logprobs]
    assert len(tokens) == 4 and deltas[-1].finish_reason == "length"
    assert logprobs == [TokenLogprob(t, 0.0, ((t, 0.0),)) for t in tokens]
    deltas = asyncio.run(collect(engine, "o0", [1], SamplingOptions(2, logprobs=0)))
    assert [lp.top for d in deltas for lp in d.logprobs] == [(), ()]


def test_refusals(engine):
    with pytest.raises(EngineRequestError, match="response_format is not supported"):
        asyncio.run(
            collect(engine, "g", [1], SamplingOptions(4, guided=GuidedDecoding("json_object")))
        )
    with pytest.raises(EngineRequestError, match="accepts 1 to 16"):
        asyncio.run(collect(engine, "l", [1] * 17, SamplingOptions(4)))


def test_gauges_follow_the_live_requests_and_abort_ends_a_stream():
    eng = ReplayEngine(TOKENS, eos_token_id=2, limits=LIMITS, step_s=0.02)
    cap = LIMITS.max_batch_size * LIMITS.max_seq_len

    async def main():
        streams = [eng.generate(f"g{i}", [1] * 5, SamplingOptions(1000)) for i in range(2)]
        for s in streams:
            await s.__anext__()
        assert eng.num_running() == 2
        usage = eng.kv_cache_usage()
        assert 2 * 6 / cap <= usage <= 1.0  # prompts + at least the first token each
        for i, s in enumerate(streams):
            eng.abort(f"g{i}")
            assert [d.finish_reason async for d in s][-1] == "abort"
        assert eng.num_running() == 0
        for _ in range(6000):  # the step thread clears the gauge on its next turn
            if eng.kv_cache_usage() == 0.0:
                break
            await asyncio.sleep(0.01)
        assert eng.kv_cache_usage() == 0.0

    try:
        asyncio.run(main())
    finally:
        eng.shutdown()


def test_shutdown_is_idempotent_and_refuses_new_requests(engine):
    engine.shutdown()
    engine.shutdown()
    assert not engine.is_healthy()
    with pytest.raises(EngineError, match="not running"):
        asyncio.run(collect(engine, "late", [1], SamplingOptions(2)))


def test_the_replay_engine_does_not_import_torch():
    code = (
        "import sys\n"
        "import mistral_gpu_fallback.replay\n"
        "import mistral_serving.engines.factory\n"
        "bad = [m for m in ('torch', 'transformers', 'mistral_serving.engines.pytorch.dynamic')"
        " if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": ":".join(sys.path)},
        check=False,
    )
    assert result.returncode == 0, result.stderr


class _Loop:
    """The engine process's stand-in for an event loop (worker.Outbox): runs each
    delivery at once, in the engine's thread, and counts the calls."""

    def __init__(self) -> None:
        self.calls = 0

    def call_soon_threadsafe(self, callback, *args) -> None:
        self.calls += 1
        callback(*args)


class _Sink:
    def __init__(self) -> None:
        self.items: list = []

    def put_nowait(self, item) -> None:
        self.items.append(item)


def test_submit_delivers_what_generate_yields_through_any_loop(engine):
    opts = SamplingOptions(max_new_tokens=6, logprobs=1, prompt_logprobs=1)
    loop, sink = _Loop(), _Sink()
    engine.submit("s", [1, 2, 3], opts, loop, sink)
    for _ in range(6000):  # a bound on waiting, not a speed assertion
        if sink.items and sink.items[-1].finish_reason is not None:
            break
        threading.Event().wait(0.01)
    assert sink.items == asyncio.run(collect(engine, "g", [1, 2, 3], opts))
    assert loop.calls == len(sink.items)  # one delivery per step
    # A prefill only is delivered at once, prompt logprobs and all.
    loop, sink = _Loop(), _Sink()
    engine.submit("p", [1, 2, 3], SamplingOptions(0, prompt_logprobs=0), loop, sink)
    assert [(d.token_ids, d.finish_reason) for d in sink.items] == [([], "length")]
    assert [lp.token_id for lp in sink.items[0].prompt_logprobs] == [2, 3]
    with pytest.raises(EngineRequestError, match="accepts 1 to 16"):
        engine.submit("l", [1] * 17, SamplingOptions(4), _Loop(), _Sink())
    assert engine.num_running() == 0
