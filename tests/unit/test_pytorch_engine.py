"""The PyTorch engine on the dev model (CPU): batching correctness, sampling options,
limits, abort, failure."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch

from mistral_serving.engines.base import EngineError, EngineRequestError, SamplingOptions
from mistral_serving.engines.pytorch import TorchEngine, _Sequence, sample_next_tokens
from mistral_serving.settings import Settings

EOS = 2


@pytest.fixture(scope="module")
def hf_model(dev_model: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(dev_model)).eval()


def make_engine(dev_model: Path, **settings) -> TorchEngine:
    return TorchEngine.from_pretrained(
        dev_model, Settings(artifact=str(dev_model), device="cpu", **settings), EOS
    )


@pytest.fixture(scope="module")
def engine(dev_model: Path):
    eng = make_engine(dev_model)
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
        for _ in range(100):
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


def _seq(prompt, gen_seed=0, generated=(), **opts) -> _Sequence:
    return _Sequence(
        "x",
        list(prompt),
        SamplingOptions(max_new_tokens=10, **opts),
        10,
        lambda item: None,
        torch.Generator().manual_seed(gen_seed),
        list(generated),
    )


def test_sampling_options_act_on_the_logits():
    logits = torch.tensor([[0.0, 5.0, 4.0, 3.0, -1.0]])
    assert sample_next_tokens(logits, [_seq([0], top_k=1)]) == [1]
    # Repetition penalty (HF): seen token 1 drops from 5 to 5/10.
    assert sample_next_tokens(logits, [_seq([1], top_k=1, repetition_penalty=10.0)]) == [2]
    # Presence/frequency (OpenAI) on generated tokens only: 1 seen twice, 2 once.
    seq = _seq([0], 0, [1, 1, 2], top_k=1, frequency_penalty=1.0, presence_penalty=0.1)
    assert sample_next_tokens(logits, [seq]) == [3]  # 5-2.1, 4-1.1, 3
    # top_k=2 never leaves {1, 2}; top_p tiny keeps only the best.
    picks = {
        sample_next_tokens(logits, [_seq([0], i, top_k=2, temperature=2.0)])[0] for i in range(50)
    }
    assert picks <= {1, 2} and len(picks) == 2
    picks = {
        sample_next_tokens(logits, [_seq([0], i, top_k=0, top_p=0.01, temperature=2.0)])[0]
        for i in range(20)
    }
    assert picks == {1}
    # temperature 0 is greedy whatever top_k says.
    assert sample_next_tokens(logits, [_seq([0], top_k=0, temperature=0.0)]) == [1]
