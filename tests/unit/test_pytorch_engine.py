"""The PyTorch engines on the dev model (CPU): batching correctness, sampling options,
limits, abort, failure, request options (ignore_eos, min_tokens, logprobs), gauges and
shutdown. Behaviour both engines share runs on both (`kind`: dynamic / static KV)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch

from mistral_serving.engines.base import (
    EngineError,
    EngineRequestError,
    GuidedDecoding,
    SamplingOptions,
)
from mistral_serving.engines.factory import start_torch_engine
from mistral_serving.engines.pytorch.dynamic import TorchEngine
from mistral_serving.settings import Settings

EOS = 2


def make_engine(dev_model: Path, eos: int = EOS, **settings) -> TorchEngine:
    return start_torch_engine(
        dev_model, Settings(artifact=str(dev_model), device="cpu", **settings), eos
    )


@pytest.fixture(scope="module")
def engine(dev_model: Path):
    eng = make_engine(dev_model)
    yield eng
    eng.shutdown()


KINDS = {
    "dynamic": {},
    "static": {"pytorch_kv_cache": "static", "max_seq_len": 512},
}


@pytest.fixture(scope="module", params=list(KINDS))
def any_engine(request, dev_model: Path):
    """Each PyTorch engine in turn (dynamic, then static KV cache)."""
    eng = make_engine(dev_model, **KINDS[request.param])
    yield eng
    eng.shutdown()


def greedy_reference(model, prompt: list[int], n: int) -> list[int]:
    out = model.generate(
        torch.tensor([prompt]), max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0
    )
    return out[0, len(prompt) :].tolist()


async def collect(engine, rid, prompt, opts, delay=0.0):
    await asyncio.sleep(delay)
    tokens, reasons = [], []
    async for delta in engine.generate(rid, prompt, opts):
        tokens += delta.token_ids
        reasons.append(delta.finish_reason)
    return tokens, reasons


PROMPTS = [[1] + list(range(100 + 37 * i, 100 + 37 * i + 2 + 5 * i)) for i in range(6)]


@pytest.mark.parametrize("max_batch_size", [64, 2])
def test_batched_greedy_equals_hf_generate_with_staggered_arrivals(
    dev_model, hf_model, max_batch_size
):
    eng = make_engine(dev_model, max_batch_size=max_batch_size)
    try:
        refs = [greedy_reference(hf_model, p, 16) for p in PROMPTS]

        async def main():
            return await asyncio.gather(
                *[
                    collect(eng, f"r{i}", p, SamplingOptions(max_new_tokens=16, top_k=1), 0.002 * i)
                    for i, p in enumerate(PROMPTS)
                ]
            )

        results = asyncio.run(main())
        for (tokens, reasons), ref in zip(results, refs):
            assert tokens == ref
            assert reasons[-1] == "length" and reasons[:-1] == [None] * (len(reasons) - 1)
    finally:
        eng.shutdown()


def test_seeded_sampling_is_reproducible_and_the_seed_matters(engine):
    opts = dict(max_new_tokens=12, temperature=1.0, top_k=0)

    def run(seed):
        return asyncio.run(
            collect(engine, f"s{seed}", PROMPTS[0], SamplingOptions(**opts, seed=seed))
        )[0]

    assert run(1) == run(1)
    assert run(1) != run(2)


def test_a_stop_token_ends_generation_without_being_emitted(engine, hf_model):
    ref = greedy_reference(hf_model, PROMPTS[1], 8)
    stop = ref[3]
    tokens, reasons = asyncio.run(
        collect(
            engine,
            "stop",
            PROMPTS[1],
            SamplingOptions(max_new_tokens=8, top_k=1, stop_token_ids=(stop,)),
        )
    )
    assert tokens == ref[: ref.index(stop)] and reasons[-1] == "stop"


def test_generation_is_clamped_to_the_sequence_limit(dev_model):
    eng = make_engine(dev_model, max_seq_len=40, max_input_len=32)
    try:
        assert eng.limits.max_seq_len == 40 and eng.limits.max_input_len == 32
        prompt = [1] + list(range(200, 230))  # 31 tokens: room for 9
        tokens, reasons = asyncio.run(
            collect(eng, "c", prompt, SamplingOptions(max_new_tokens=100, top_k=1))
        )
        assert len(tokens) == 9 and reasons[-1] == "length"

        async def too_long():
            return await collect(eng, "t", [1] * 33, SamplingOptions(max_new_tokens=1))

        with pytest.raises(EngineRequestError, match="accepts 1 to 32"):
            asyncio.run(too_long())
    finally:
        eng.shutdown()


def test_abort_ends_the_stream_with_abort(engine):
    async def main():
        stream = engine.generate("a1", PROMPTS[2], SamplingOptions(max_new_tokens=3000, top_k=1))
        first = await stream.__anext__()
        engine.abort("a1")
        rest = [d async for d in stream]
        return first, rest

    first, rest = asyncio.run(main())
    assert first.finish_reason is None and rest[-1].finish_reason == "abort"
    assert len(rest) < 3000


def test_closing_the_stream_early_frees_the_engine(engine):
    async def main():
        stream = engine.generate("c1", PROMPTS[3], SamplingOptions(max_new_tokens=3000, top_k=1))
        await stream.__anext__()
        await stream.aclose()  # what a client disconnect does
        for _ in range(3000):  # up to 60 s: the engine thread frees it
            await asyncio.sleep(0.02)
            if not engine._running and not engine._waiting:
                return True
        return False

    assert asyncio.run(main())


def test_a_failing_model_marks_the_engine_unhealthy_and_fails_requests(dev_model):
    eng = make_engine(dev_model)
    assert eng.is_healthy()

    def broken(*args, **kwargs):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    eng._model.forward = broken
    with pytest.raises(EngineError, match="illegal memory access"):
        asyncio.run(collect(eng, "f", PROMPTS[0], SamplingOptions(max_new_tokens=4)))
    assert not eng.is_healthy()
    with pytest.raises(EngineError, match="not running"):
        asyncio.run(collect(eng, "g", PROMPTS[0], SamplingOptions(max_new_tokens=4)))


def masked_greedy(model, prompt: list[int], n: int, stops: set[int], min_tokens: int):
    """Greedy decoding by hand: stop tokens masked before `min_tokens`, ending after."""
    out: list[int] = []
    for _ in range(n):
        with torch.no_grad():
            logits = model(torch.tensor([prompt + out])).logits[0, -1]
        if len(out) < min_tokens:
            logits[list(stops)] = float("-inf")
        token = int(logits.argmax())
        if token in stops:
            return out, "stop"
        out.append(token)
    return out, "length"


def test_min_tokens_masks_eos_and_stop_ids_until_reached(any_engine, hf_model):
    ref = greedy_reference(hf_model, PROMPTS[4], 8)
    stop = ref[1]  # would end the answer after one token
    opts = SamplingOptions(max_new_tokens=8, top_k=1, stop_token_ids=(stop,), min_tokens=4)
    tokens, reasons = asyncio.run(collect(any_engine, "m", PROMPTS[4], opts))
    expected, reason = masked_greedy(hf_model, PROMPTS[4], 8, {stop, EOS}, 4)
    assert len(expected) >= 4 and stop not in expected[:4]
    assert (tokens, reasons[-1]) == (expected, reason)


@pytest.mark.parametrize("kind", list(KINDS))
def test_ignore_eos_generates_through_eos(dev_model, hf_model, kind):
    ref = greedy_reference(hf_model, PROMPTS[5], 10)
    # Make a token the model will produce (not as its first token) the EOS.
    at = next(i for i in range(1, 10) if ref[i] not in ref[:i])
    eng = make_engine(dev_model, eos=ref[at], **KINDS[kind])
    try:
        tokens, reasons = asyncio.run(
            collect(eng, "e1", PROMPTS[5], SamplingOptions(max_new_tokens=10, top_k=1))
        )
        assert tokens == ref[:at] and reasons[-1] == "stop"
        opts = SamplingOptions(max_new_tokens=10, top_k=1, ignore_eos=True)
        tokens, reasons = asyncio.run(collect(eng, "e2", PROMPTS[5], opts))
        assert tokens == ref and reasons[-1] == "length"
    finally:
        eng.shutdown()


def test_logprobs_match_a_separate_hf_forward_pass(any_engine, hf_model):
    prompt = PROMPTS[3]
    opts = SamplingOptions(max_new_tokens=6, top_k=1, logprobs=5)

    async def main():
        return [d async for d in any_engine.generate("lp", prompt, opts)]

    deltas = asyncio.run(main())
    tokens = [t for d in deltas for t in d.token_ids]
    logprobs = [lp for d in deltas for lp in (d.logprobs or [])]
    assert len(tokens) == 6 and len(logprobs) == 6
    for i, (token, lp) in enumerate(zip(tokens, logprobs)):
        with torch.no_grad():
            logits = hf_model(torch.tensor([prompt + tokens[:i]])).logits[0, -1]
        expected = torch.log_softmax(logits.float(), -1)
        assert lp.token_id == token and token == int(expected.argmax())
        assert lp.logprob == pytest.approx(float(expected[token]), abs=1e-4)
        top_ids = [t for t, _ in lp.top]
        assert len(top_ids) == 5 and top_ids[0] == token
        assert [v for _, v in lp.top] == pytest.approx(expected[top_ids].tolist(), abs=1e-4)


def test_no_logprobs_unless_asked(engine):
    async def main():
        return [d async for d in engine.generate("nl", PROMPTS[0], SamplingOptions(3, top_k=1))]

    assert all(d.logprobs is None for d in asyncio.run(main()))


def test_guided_decoding_and_out_of_vocabulary_ids_are_refused(any_engine):
    guided = SamplingOptions(max_new_tokens=4, guided=GuidedDecoding("json_object"))
    with pytest.raises(EngineRequestError, match="response_format is not supported"):
        asyncio.run(collect(any_engine, "g", PROMPTS[0], guided))
    with pytest.raises(EngineRequestError, match="token ids must be in 0..31999"):
        asyncio.run(collect(any_engine, "v", [1, 32000], SamplingOptions(max_new_tokens=4)))
    assert any_engine.is_healthy()


async def _wait_for(predicate, tries: int = 6000) -> bool:
    for _ in range(tries):
        if predicate():
            return True
        await asyncio.sleep(0.01)
    return False


def test_kv_cache_usage_and_running_count_follow_the_batch(any_engine):
    eng = any_engine
    cap = eng.limits.max_batch_size * eng.limits.max_seq_len
    prompts, n = PROMPTS[2:4], 200

    async def main():
        streams = [
            eng.generate(f"kv{i}", p, SamplingOptions(max_new_tokens=n, top_k=1))
            for i, p in enumerate(prompts)
        ]
        for s in streams:
            await s.__anext__()
        assert await _wait_for(lambda: eng.num_running() == 2)
        usage = eng.kv_cache_usage()
        held = sum(len(p) for p in prompts)  # at least the prompts, at most all tokens
        assert held / cap <= usage <= 2 * (max(map(len, prompts)) + n) / cap
        for i, s in enumerate(streams):
            eng.abort(f"kv{i}")
            assert [d.finish_reason async for d in s][-1] == "abort"
        assert await _wait_for(lambda: eng.num_running() == 0)
        assert eng.kv_cache_usage() == 0.0

    asyncio.run(main())


@pytest.mark.parametrize("kind", list(KINDS))
def test_shutdown_stops_the_engine_frees_the_model_and_is_idempotent(dev_model, kind):
    eng = make_engine(dev_model, **KINDS[kind])

    async def main():
        stream = eng.generate("sd", PROMPTS[1], SamplingOptions(max_new_tokens=3000, top_k=1))
        await stream.__anext__()
        await asyncio.to_thread(eng.shutdown)
        with pytest.raises(EngineError, match="shut down"):
            async for _ in stream:
                pass

    asyncio.run(main())
    assert not eng.is_healthy() and eng._model is None and eng.num_running() == 0
    assert getattr(eng, "_k", None) is None  # the static engine's KV cache is gone too
    eng.shutdown()  # again: nothing to do, no error
    with pytest.raises(EngineError, match="not running"):
        asyncio.run(collect(eng, "late", PROMPTS[0], SamplingOptions(max_new_tokens=2)))


@pytest.mark.parametrize(
    "opts",
    [
        dict(temperature=5e-324, top_k=0),
        dict(temperature=1e-300, top_p=1e-300, top_k=0, seed=3),
        dict(temperature=2.0, top_k=1 << 20, top_p=1e-300, seed=4),
        dict(temperature=2.0, repetition_penalty=5e-324, presence_penalty=-2.0, seed=5),
        dict(temperature=1e-5, repetition_penalty=10.0, frequency_penalty=2.0, seed=6),
        dict(temperature=0.7, frequency_penalty=-2.0, min_tokens=8, logprobs=20, seed=7),
    ],
)
def test_extreme_sampling_options_complete_and_leave_the_engine_healthy(any_engine, opts):
    tokens, reasons = asyncio.run(
        collect(any_engine, "x", PROMPTS[2], SamplingOptions(max_new_tokens=8, **opts))
    )
    assert reasons[-1] in ("length", "stop") and all(0 <= t < 32000 for t in tokens)
    assert any_engine.is_healthy()


def test_nan_logits_fail_only_the_request_that_got_them(any_engine, hf_model, monkeypatch):
    """A model output with NaN/inf in one row: that row still gets its best finite token;
    an all-NaN row fails that request alone."""
    from mistral_serving.engines.pytorch import dynamic as pytorch

    real = pytorch.sample_next_tokens

    def corrupt(logits, seqs):
        for i, seq in enumerate(seqs):
            if seq.request_id == "partly-nan":
                logits[i, 1000:] = float("nan")
                logits[i, 5] = float("inf")  # +inf: the largest float, so 5 wins
            elif seq.request_id == "all-nan":
                logits[i] = float("nan")
        return real(logits, seqs)

    monkeypatch.setattr(pytorch, "sample_next_tokens", corrupt)

    async def main():
        greedy = SamplingOptions(max_new_tokens=4, top_k=1)
        sampled = SamplingOptions(max_new_tokens=4, temperature=0.9, seed=1, logprobs=1)
        return await asyncio.gather(
            collect(any_engine, "partly-nan", PROMPTS[0], sampled),
            collect(any_engine, "all-nan", PROMPTS[1], greedy),
            collect(any_engine, "fine", PROMPTS[2], greedy),
            return_exceptions=True,
        )

    partly, all_nan, fine = asyncio.run(main())
    assert partly[0] == [5] * 4 and partly[1][-1] == "length"
    assert isinstance(all_nan, EngineError) and "no finite logits" in str(all_nan)
    assert fine[0] == greedy_reference(hf_model, PROMPTS[2], 4) and any_engine.is_healthy()


class OnlyTokens:
    """A stand-in structured-output decoder: allows only `allowed` tokens, records what
    it was told."""

    def __init__(self, allowed: list[int]) -> None:
        self.allowed, self.accepted = allowed, []

    def matcher(self, guided):
        def mask(row: torch.Tensor) -> None:
            keep = row[self.allowed].clone()
            row.fill_(float("-inf"))
            row[self.allowed] = keep

        return type("M", (), {"mask": staticmethod(mask), "accept": self.accepted.append})

    def matcher_later(self, guided, done) -> None:
        done(self.matcher(guided))


def test_a_guided_decoder_masks_each_row_and_is_told_each_token(any_engine):
    decoder = OnlyTokens([7, 8, 9])
    any_engine.guided = decoder
    try:
        opts = SamplingOptions(
            max_new_tokens=6, temperature=1.0, seed=2, guided=GuidedDecoding("json_object")
        )
        tokens, _ = asyncio.run(collect(any_engine, "gd", PROMPTS[1], opts))
        assert len(tokens) == 6 and set(tokens) <= {7, 8, 9}
        assert decoder.accepted == tokens
    finally:
        any_engine.guided = None
