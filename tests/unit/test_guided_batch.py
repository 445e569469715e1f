"""Structured output at batch speed (engines/pytorch/guided_batch.py): one bitmask for all the
constrained rows of a step, applied in one pass, gives the static engine the same tokens
as each row masking itself (dev model, CPU, real xgrammar); the torch kernel equals
xgrammar's own."""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mistral_gpu_fallback.static import guided_profile
from mistral_gpu_fallback.static.engine import StaticTorchEngine
from mistral_gpu_fallback.static.guided_batch import BatchMasker, apply_bitmask
from mistral_serving.engines.base import SamplingOptions
from mistral_serving.engines.factory import start_guided_torch_engine
from mistral_serving.settings import Settings
from mistral_serving.structured.constraint import GuidedDecoding
from mistral_serving.text.tokenizer import load_tokenizer

NESTED = json.dumps(
    {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 12},
            "address": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "zip": {"type": "integer"}},
                "required": ["city", "zip"],
            },
            "tags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 3},
        },
        "required": ["name", "address"],
    }
)
FLAT = json.dumps({"type": "object", "properties": {"a": {"type": "boolean"}}, "required": ["a"]})


def requests() -> list[tuple[list[int], SamplingOptions]]:
    """Constrained rows (greedy, seeded sampling, penalised, min_tokens, logprobs) beside
    plain ones, all in one batch."""

    def guided(schema: str, **kw) -> SamplingOptions:
        return SamplingOptions(
            max_new_tokens=40, guided=GuidedDecoding("json_schema", schema), **kw
        )

    opts = [
        guided(NESTED, top_k=1),
        guided(NESTED, top_k=1),
        guided(FLAT, top_k=1),
        guided(NESTED, temperature=0.8, seed=7),
        guided(FLAT, top_k=1, repetition_penalty=1.3),
        guided(NESTED, top_k=1, min_tokens=3),
        guided(FLAT, top_k=1, logprobs=2),
        SamplingOptions(max_new_tokens=20, top_k=1),
        SamplingOptions(max_new_tokens=20, temperature=0.7, seed=3),
    ]
    return [([1] + list(range(200 + 11 * i, 210 + 13 * i)), o) for i, o in enumerate(opts)]


def run(dev_model: Path, batch: bool, **settings) -> tuple[list[list[int]], int]:
    tok = load_tokenizer(dev_model)
    eng = start_guided_torch_engine(
        dev_model,
        Settings(
            artifact=str(dev_model),
            device="cpu",
            pytorch_kv_cache="static",
            max_seq_len=512,
            **settings,
        ),
        tok,
    )
    assert isinstance(eng, StaticTorchEngine)
    eng.batch_masks = batch  # False: the row-by-row reference path
    calls = []
    real = BatchMasker.mask

    def spy(self, logits, rows, matchers):
        calls.append(len(rows))
        return real(self, logits, rows, matchers)

    BatchMasker.mask = spy  # type: ignore[method-assign]
    try:

        async def one(i, prompt, opts):
            out = []
            async for d in eng.generate(f"r{i}", prompt, opts):
                out += d.token_ids
            return out

        async def main():
            return await asyncio.gather(*[one(i, p, o) for i, (p, o) in enumerate(requests())])

        return asyncio.run(main()), max(calls, default=0)
    finally:
        BatchMasker.mask = real  # type: ignore[method-assign]
        eng.shutdown()


@pytest.mark.parametrize("chunk", [0, 8])
def test_batched_mask_gives_the_per_row_tokens(dev_model, chunk):
    per_row, unused = run(dev_model, batch=False, prefill_chunk_tokens=chunk)
    batched, widest = run(dev_model, batch=True, prefill_chunk_tokens=chunk)
    assert unused == 0
    assert widest >= 2  # several constrained rows were masked in one call
    assert batched == per_row
    tok = load_tokenizer(dev_model)
    for tokens, (_, opts) in zip(batched, requests()):
        if opts.guided is not None and len(tokens) < opts.max_new_tokens:
            text = b"".join(tok.table.token_bytes[t] or b"" for t in tokens)
            json.loads(text.decode())  # a finished constrained answer parses


@settings(max_examples=40, deadline=None)
@given(
    rows=st.integers(1, 5),
    vocab=st.integers(1, 200),
    extra=st.integers(0, 40),
    data=st.data(),
)
def test_torch_kernel_equals_xgrammars(rows, vocab, extra, data):
    words = (vocab + 31) // 32
    bitmask = torch.tensor(
        data.draw(
            st.lists(
                st.lists(st.integers(-(2**31), 2**31 - 1), min_size=words, max_size=words),
                min_size=rows,
                max_size=rows,
            )
        ),
        dtype=torch.int32,
    )
    batch = rows + extra % 3
    picked = data.draw(
        st.lists(st.integers(0, batch - 1), min_size=rows, max_size=rows, unique=True)
    )
    logits = torch.randn(batch, vocab)
    ours, theirs = logits.clone(), logits.clone()
    apply_bitmask(ours, bitmask, picked)
    # The reference, bit by bit, as xgrammar defines its bitmask (token t is allowed when
    # bit t % 32 of word t // 32 is set). Not xgrammar's own CPU kernel: xgrammar 0.2.9's
    # apply_token_bitmask_inplace corrupts the heap on some of these inputs (glibc aborts
    # with "malloc_consolidate(): invalid chunk size"); the engine uses it only on CUDA.
    for i, row in enumerate(picked):
        for t in range(vocab):
            if not (int(bitmask[i, t // 32]) >> (t % 32)) & 1:
                theirs[row, t] = -math.inf
    assert torch.equal(ours, theirs)
    untouched = [r for r in range(batch) if r not in picked]
    assert torch.equal(ours[untouched], logits[untouched])
    assert all(
        math.isinf(v) or v == logits.view(-1)[i] for i, v in enumerate(ours.view(-1).tolist())
    )


def test_profile_times_the_parts_and_changes_no_token(dev_model, tmp_path, monkeypatch):
    """GUIDED_PROFILE_OUT (guided_profile.py, a benchmark's switch): the same tokens, and
    the file holds each part's time and count, the fallback rows (logprobs, min_tokens)
    among them."""
    plain, _ = run(dev_model, batch=True)
    path = tmp_path / "profile.json"
    monkeypatch.setenv(guided_profile.ENV, str(path))
    profiled, _ = run(dev_model, batch=True)
    assert profiled == plain
    state = json.loads(path.read_text())
    counts, seconds = state["counts"], state["seconds"]
    for part in ("fill", "h2d", "apply", "accept", "sample", "step_constrained"):
        assert counts[part] > 0 and seconds[part] >= 0, part
    assert counts["fallback_rows"] > 0 and counts["rowmask"] == counts["fallback_rows"]
    assert counts["fill_rows"] >= counts["fill"]
