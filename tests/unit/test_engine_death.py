"""Engine failures: a dead engine takes the process down (through the drain) so
Kubernetes restarts it; a failure while handling one request fails only that request
(the other streams finish exactly as in a clean run, the engine serves on); only a
failing forward step kills the engine."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import pytest

from mistral_serving.engines.base import EngineError, SamplingOptions
from mistral_serving.ops import shutdown
from mistral_serving.ops.shutdown import Drainer


def test_engine_death_sends_sigterm_once_and_drains(monkeypatch):
    kills: list[tuple[int, int]] = []
    monkeypatch.setattr(shutdown.os, "kill", lambda pid, sig: kills.append((pid, sig)))
    stopped: list[bool] = []

    async def main() -> None:
        drainer = Drainer(0.01, lambda: stopped.append(True), lambda: 0)
        drainer.engine_died()
        drainer.engine_died()  # readiness probes keep asking: one shutdown only
        await asyncio.sleep(0.05)
        assert drainer.draining

    asyncio.run(main())
    assert [sig for _, sig in kills] == [signal.SIGTERM]
    assert stopped == [True]


# ---- one request's failure is that request's alone (both PyTorch engines) ----

POISON_AT = 3  # the poisoned request fails after this many tokens, mid-batch
PROMPTS = [[1] + list(range(100 + 37 * i, 100 + 37 * i + 2 + 5 * i)) for i in range(5)]
KINDS = {"dynamic": {}, "static": {"pytorch_kv_cache": "static", "max_seq_len": 512}}


@pytest.fixture(scope="module", params=list(KINDS))
def torch_engine(request, dev_model: Path):
    from mistral_serving.engines.factory import start_torch_engine
    from mistral_serving.settings import Settings

    settings = Settings(artifact=str(dev_model), device="cpu", **KINDS[request.param])
    eng = start_torch_engine(dev_model, settings, 2)
    yield eng
    eng.shutdown()


def _batch(engine) -> list[tuple[list[int], BaseException | None]]:
    """Five requests decoded together: greedy ones (batched argmax), one with logprobs and
    one seeded sample (the per-row sampler); `poison` is the middle one."""
    options = [
        SamplingOptions(max_new_tokens=16, top_k=1),
        SamplingOptions(max_new_tokens=16, top_k=1, logprobs=2),
        SamplingOptions(max_new_tokens=16, top_k=1, logprobs=0),
        SamplingOptions(max_new_tokens=16, temperature=0.8, seed=7),
        SamplingOptions(max_new_tokens=12, top_k=1),
    ]
    names = ["a", "b", "poison", "c", "d"]

    async def one(name, prompt, opts):
        tokens: list[int] = []
        try:
            async for delta in engine.generate(name, prompt, opts):
                tokens += delta.token_ids
        except EngineError as exc:
            return tokens, exc
        return tokens, None

    async def main():
        return await asyncio.gather(*[one(*args) for args in zip(names, PROMPTS, options)])

    return asyncio.run(main())


def _poisoned(seq) -> bool:
    return seq.request_id == "poison" and len(seq.generated) == POISON_AT


def _check_isolated(clean, poisoned, engine, what: str) -> None:
    assert all(exc is None for _, exc in clean)
    tokens, exc = poisoned[2]
    assert isinstance(exc, EngineError) and what in str(exc)
    assert tokens == clean[2][0][:POISON_AT]
    others = [r for i, r in enumerate(poisoned) if i != 2]
    assert [t for t, _ in others] == [t for i, (t, _) in enumerate(clean) if i != 2]
    assert all(e is None for _, e in others)
    assert engine.is_healthy()


def test_a_failing_sampler_fails_only_its_request(torch_engine, monkeypatch):
    from mistral_serving.engines import sampling

    clean = _batch(torch_engine)
    real = sampling.sample_row

    def sample_row(row, seq):
        if _poisoned(seq):
            raise RuntimeError("sampler poisoned")
        return real(row, seq)

    monkeypatch.setattr(sampling, "sample_row", sample_row)
    _check_isolated(clean, _batch(torch_engine), torch_engine, "sampler poisoned")
    monkeypatch.undo()
    assert _batch(torch_engine) == clean  # the engine serves on, unchanged


def test_failing_bookkeeping_fails_only_its_request(torch_engine, monkeypatch):
    from mistral_serving.engines.pytorch.dynamic import TorchEngine

    clean = _batch(torch_engine)
    real = TorchEngine._record

    def record(seq, pick):
        if _poisoned(seq):
            raise KeyError("stop check poisoned")
        return real(seq, pick)

    monkeypatch.setattr(TorchEngine, "_record", staticmethod(record))
    _check_isolated(clean, _batch(torch_engine), torch_engine, "stop check poisoned")


def test_a_failing_forward_step_kills_the_engine_and_every_stream(dev_model: Path):
    from mistral_serving.engines.factory import start_torch_engine
    from mistral_serving.settings import Settings

    settings = Settings(artifact=str(dev_model), device="cpu", **KINDS["static"])
    eng = start_torch_engine(dev_model, settings, 2)
    try:
        clean = _batch(eng)
        assert all(exc is None for _, exc in clean)

        def broken(*args, **kwargs):
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

        eng._decode_logits = broken
        results = _batch(eng)
        assert all(isinstance(exc, EngineError) for _, exc in results)
        assert not eng.is_healthy()
    finally:
        eng.shutdown()


def test_tokens_queued_before_an_error_reach_a_consumer_that_fell_behind():
    from mistral_serving.engines.base import TokenDelta, TokenLogprob, read_stream

    async def main():
        queue: asyncio.Queue = asyncio.Queue()
        lp = TokenLogprob(5, -0.5)
        for item in (
            TokenDelta([5], None, [lp]),
            TokenDelta([6], None, [lp]),
            RuntimeError("row failed"),
        ):
            queue.put_nowait(item)  # all queued before the consumer reads: one merge
        seen = []
        with pytest.raises(EngineError, match="row failed"):
            async for delta in read_stream(queue, "test engine"):
                seen.append(delta)
        return seen

    assert asyncio.run(main()) == [TokenDelta([5, 6], None, [TokenLogprob(5, -0.5)] * 2)]
