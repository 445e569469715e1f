"""The static-KV fast path of the PyTorch engine (pytorch_kv_cache=static) on the dev
model (CPU, so without CUDA graphs): same tokens as HF generate, slots reused. What it
shares with the dynamic engine (options, logprobs, gauges, shutdown) is tested on both in
test_pytorch_engine.py; failure isolation in test_engine_death.py."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
import torch

from mistral_gpu_fallback.static.engine import StaticTorchEngine
from mistral_serving.engines.base import SamplingOptions
from mistral_serving.engines.factory import start_torch_engine
from mistral_serving.settings import Settings

EOS = 2
PROMPTS = [[1] + list(range(100 + 37 * i, 100 + 37 * i + 2 + 5 * i)) for i in range(6)]


def make_engine(dev_model: Path, **settings) -> StaticTorchEngine:
    eng = start_torch_engine(
        dev_model,
        Settings(artifact=str(dev_model), device="cpu", pytorch_kv_cache="static", **settings),
        EOS,
    )
    assert isinstance(eng, StaticTorchEngine)
    return eng


async def collect(engine, rid, prompt, opts, delay=0.0):
    await asyncio.sleep(delay)
    tokens, reasons = [], []
    async for delta in engine.generate(rid, prompt, opts):
        tokens += delta.token_ids
        reasons.append(delta.finish_reason)
    return tokens, reasons


def greedy_reference(model, prompt, n):
    out = model.generate(
        torch.tensor([prompt]), max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0
    )
    return out[0, len(prompt) :].tolist()


@pytest.mark.parametrize("max_batch_size", [64, 2])
def test_static_batched_greedy_equals_hf_generate(dev_model, hf_model, max_batch_size):
    eng = make_engine(dev_model, max_batch_size=max_batch_size, max_seq_len=512)
    try:
        lengths = [16, 5, 23, 9, 16, 30]  # rows finish at different steps: holes get filled
        refs = [greedy_reference(hf_model, p, n) for p, n in zip(PROMPTS, lengths)]

        async def main():
            return await asyncio.gather(
                *[
                    collect(eng, f"r{i}", p, SamplingOptions(max_new_tokens=n, top_k=1), 0.002 * i)
                    for i, (p, n) in enumerate(zip(PROMPTS, lengths))
                ]
            )

        for (tokens, reasons), ref in zip(asyncio.run(main()), refs):
            assert tokens == ref
            assert reasons[-1] == "length"
        for _ in range(6000):  # the engine thread drops finished rows after delivering
            if not eng._running:
                break
            time.sleep(0.01)
        assert not eng._running and eng.limits.max_seq_len == 512
    finally:
        eng.shutdown()


def test_static_kv_columns_fit_the_memory_budget(dev_model):
    eng = make_engine(dev_model)
    try:
        assert eng.limits.max_seq_len == 4096  # the dev model's positions; 8 GiB on CPU
        assert eng.info.details["kv_cache"] == "static"
    finally:
        eng.shutdown()
