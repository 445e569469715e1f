"""Chunked prefill in the static PyTorch engine (`prefill_chunk_tokens`), on the dev model
(CPU): greedy tokens equal HF generate's (the unchunked engine is held to the same
reference in test_pytorch_static_engine.py), prompts longer than the budget, slots handed
over while other prompts are mid-prefill, decoding rows that keep stepping while a long
prompt is prefilled, one forward per step that carries both decode rows and a chunk, an
allocation failure ending only its request, echo's prompt logprobs, aborts and the
setting's bounds."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pydantic
import pytest
import torch

from mistral_gpu_fallback.static.engine import StaticTorchEngine
from mistral_serving.engines.base import SamplingOptions
from mistral_serving.settings import Settings
from tests.static_engines import cpu_static_engine

# Mixed lengths: 3..28 tokens, and one of 150 (longer than every chunk size below).
PROMPTS = [[1] + list(range(100 + 37 * i, 100 + 37 * i + 2 + 5 * i)) for i in range(6)]
LONG = [1] + [(7 * j) % 31000 + 500 for j in range(149)]


@pytest.fixture(scope="module")
def hf_model(dev_model: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(dev_model)).eval()


def make_engine(dev_model: Path, **settings) -> StaticTorchEngine:
    return cpu_static_engine(dev_model, **settings)


async def collect(engine, rid, prompt, opts, delay=0.0):
    await asyncio.sleep(delay)
    tokens, reasons, first = [], [], None
    async for delta in engine.generate(rid, prompt, opts):
        tokens += delta.token_ids
        reasons.append(delta.finish_reason)
        first = first or delta.prompt_logprobs
    return tokens, reasons, first


def greedy_reference(model, prompt, n):
    out = model.generate(
        torch.tensor([prompt]), max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0
    )
    return out[0, len(prompt) :].tolist()


@pytest.mark.parametrize(("chunk", "slots"), [(7, 3), (16, 64), (64, 2)])
def test_chunked_greedy_equals_hf_generate(dev_model, hf_model, chunk, slots):
    # 7 requests through 2-3 slots: prompts finish their prefill while others are halfway
    # (a slot handed over to a running row), rows leave and new prompts take their slots.
    eng = make_engine(dev_model, prefill_chunk_tokens=chunk, max_batch_size=slots)
    try:
        prompts = [*PROMPTS, LONG]
        lengths = [16, 5, 23, 9, 16, 30, 12]
        refs = [greedy_reference(hf_model, p, n) for p, n in zip(prompts, lengths)]
        calls = []
        real = eng._prefill_pieces
        eng._prefill_pieces = lambda pieces: (calls.append([c for _, c in pieces]), real(pieces))

        async def main():
            return await asyncio.gather(
                *[
                    collect(eng, f"r{i}", p, SamplingOptions(max_new_tokens=n, top_k=1), 0.002 * i)
                    for i, (p, n) in enumerate(zip(prompts, lengths))
                ]
            )

        for (tokens, reasons, _), ref in zip(asyncio.run(main()), refs):
            assert tokens == ref
            assert reasons[-1] == "length"
        assert all(sum(c) <= chunk for c in calls)  # the budget holds every step
        assert len(calls) >= len(LONG) // chunk  # the long prompt took several steps
        assert eng.info.details["prefill_chunk_tokens"] == chunk
    finally:
        eng.shutdown()


def test_decoding_rows_step_while_a_long_prompt_is_prefilled(dev_model, hf_model):
    eng = make_engine(dev_model, prefill_chunk_tokens=8, max_batch_size=4)
    seen: list[tuple[int, list[int]]] = []  # per chunk step: long prompt's progress, rows
    real = eng._prefill_pieces

    def spy(pieces):
        long = [p.done for p, _ in pieces if len(p.seq.prompt) == len(LONG)]
        if long:
            seen.append((long[0], [len(s.generated) for s in eng._running]))
        real(pieces)

    eng._prefill_pieces = spy
    try:

        async def main():
            stream = eng.generate("short", PROMPTS[1], SamplingOptions(max_new_tokens=60, top_k=1))
            first = await stream.__anext__()  # the short request is decoding
            long = asyncio.ensure_future(
                collect(eng, "long", LONG, SamplingOptions(max_new_tokens=4, top_k=1))
            )
            rest = [d async for d in stream]
            return await long, [first, *rest]

        long, short = asyncio.run(main())
        assert long[0] == greedy_reference(hf_model, LONG, 4)
        assert [t for d in short for t in d.token_ids] == greedy_reference(hf_model, PROMPTS[1], 60)
        # 150 tokens at 8 a step: 19 chunk steps, and between two of them the decoding row
        # got exactly one more token (a decode step ran: the prefill did not stall it).
        assert [done for done, _ in seen] == list(range(0, len(LONG), 8))
        assert all(len(rows) == 1 for _, rows in seen)
        assert all(b[0] == a[0] + 1 for (_, a), (_, b) in zip(seen, seen[1:]))
    finally:
        eng.shutdown()


def test_chunked_echo_equals_unchunked(dev_model):
    opts = SamplingOptions(max_new_tokens=3, top_k=1, prompt_logprobs=2)

    def run(**settings):
        eng = make_engine(dev_model, **settings)
        try:

            async def main():
                return await asyncio.gather(
                    collect(eng, "a", LONG, opts), collect(eng, "b", PROMPTS[3], opts)
                )

            return asyncio.run(main())
        finally:
            eng.shutdown()

    whole, chunked = run(), run(prefill_chunk_tokens=13)
    for (t1, _, lp1), (t2, _, lp2) in zip(whole, chunked):
        assert t1 == t2
        assert len(lp1) == len(lp2) > 0
        assert [x.token_id for x in lp1] == [x.token_id for x in lp2]
        assert [x.logprob for x in lp1] == pytest.approx([x.logprob for x in lp2], abs=1e-4)
    assert len(chunked[0][2]) == len(LONG) - 1


def test_abort_mid_prefill_frees_the_slot(dev_model):
    eng = make_engine(dev_model, prefill_chunk_tokens=4, max_batch_size=1)
    try:

        async def main():
            stream = eng.generate("long", LONG, SamplingOptions(max_new_tokens=50, top_k=1))
            task = asyncio.ensure_future(stream.__anext__())
            await asyncio.sleep(0)
            eng.abort("long")
            try:
                reasons = [(await task).finish_reason] + [d.finish_reason async for d in stream]
            except StopAsyncIteration:
                reasons = []
            # The only slot is free again: a new request runs to the end.
            after = await collect(eng, "next", PROMPTS[2], SamplingOptions(max_new_tokens=3))
            return reasons, after

        reasons, after = asyncio.run(main())
        assert reasons[-1] == "abort"
        assert after[1][-1] == "length" and len(after[0]) == 3
        assert not eng._prefilling
    finally:
        eng.shutdown()


@pytest.mark.parametrize("value", [-1, 2**21 + 1])
def test_chunk_setting_is_bounded(value):
    with pytest.raises(pydantic.ValidationError):
        Settings(prefill_chunk_tokens=value)


def test_a_step_with_decode_rows_and_a_chunk_reads_the_weights_once(dev_model):
    # The short prompt finishes its prefill in the first step and decodes while the long
    # one is prefilled 8 tokens a step: those steps carry both, and each must be one
    # forward (one call of layer 0's down projection), not the decode pass plus a chunk pass.
    requests = [("short", PROMPTS[1], 40), ("long", LONG, 6)]

    def run(**settings):
        eng = make_engine(dev_model, max_batch_size=4, **settings)
        calls = [0]
        steps: list[tuple[int, bool, int]] = []  # per pass: rows before, chunk?, weight reads
        hook = eng._layers[0].mlp.down_proj.register_forward_hook(
            lambda *_: calls.__setitem__(0, calls[0] + 1)
        )
        real_pass, real_pieces = eng._pass, eng._prefill_pieces
        chunked, started = [False], [False]

        def pieces_spy(pieces):
            chunked[0] = True
            real_pieces(pieces)

        def pass_spy():
            if not started[0] and len(eng._waiting) < len(requests):
                return False  # both requests admitted together: the steps do not race them
            started[0] = True
            calls[0], chunked[0], rows = 0, False, len(eng._running)
            busy = real_pass()
            steps.append((rows, chunked[0], calls[0]))
            return busy

        eng._pass, eng._prefill_pieces = pass_spy, pieces_spy
        try:

            async def main():
                return await asyncio.gather(
                    *[
                        collect(eng, rid, p, SamplingOptions(max_new_tokens=n, top_k=1))
                        for rid, p, n in requests
                    ]
                )

            return [tokens for tokens, _, _ in asyncio.run(main())], steps
        finally:
            hook.remove()
            eng.shutdown()

    whole, _ = run()
    chunked, steps = run(prefill_chunk_tokens=8)
    assert chunked == whole  # the decode rows' tokens in mixed steps, and the long prompt's
    mixed = [reads for rows, chunk, reads in steps if rows and chunk]
    assert len(mixed) >= len(LONG) // 8 - 1  # the short row decoded beside most chunks
    assert mixed == [1] * len(mixed)
    assert all(reads <= 1 for _, _, reads in steps)


def test_an_allocation_failure_in_a_mixed_step_ends_only_its_request(dev_model):
    # Every pass holding the "bad" prompt's piece fails to allocate: the step is retried as
    # the decode alone, then piece by piece, so only "bad" ends; the others' tokens are
    # those of an engine that never saw it.
    from mistral_serving.engines.base import EngineError

    good = [("a", PROMPTS[2], 30), ("b", LONG, 5)]

    def run(with_bad: bool):
        eng = make_engine(dev_model, max_batch_size=4, prefill_chunk_tokens=16)
        real = eng._mixed_forward

        def forward(ids, positions, slots, decode, pieces):
            bad = [p.slot for p in eng._prefilling if p.seq.request_id == "bad"]
            if bad and bad[0] in pieces[0].tolist():
                raise RuntimeError("CUDA out of memory (injected)")
            return real(ids, positions, slots, decode, pieces)

        eng._mixed_forward = forward
        try:

            async def bad_request():
                with pytest.raises(EngineError, match="prefill failed"):
                    await collect(eng, "bad", PROMPTS[4], SamplingOptions(max_new_tokens=5))

            async def main():
                opts = [SamplingOptions(max_new_tokens=n, top_k=1) for _, _, n in good]
                runs = [
                    collect(eng, r, p, o, 0.002 * i)
                    for i, ((r, p, _), o) in enumerate(zip(good, opts))
                ]
                out = await asyncio.gather(*runs, *([bad_request()] if with_bad else []))
                return [tokens for tokens, _, _ in out[: len(good)]]

            return asyncio.run(main())
        finally:
            eng.shutdown()

    assert run(with_bad=True) == run(with_bad=False)


def test_an_allocation_failure_after_a_mixed_step_commits_is_not_retried(dev_model):
    # After the commit the decode rows have stepped and the pieces advanced: a retry as
    # "the decode alone" would step every running row twice. Such a failure is the
    # engine's: every request in flight gets it, and nothing is decoded again.
    eng = make_engine(dev_model, max_batch_size=4, prefill_chunk_tokens=16)
    injected, decoded_after = [], []
    real_join, real_decode = eng._join_prefilled, eng._decode

    def join(p):
        if p.seq.request_id == "long" and not injected:
            injected.append(True)
            raise RuntimeError("CUDA out of memory (injected after the commit)")
        return real_join(p)

    def decode():
        if injected:
            decoded_after.append(True)
        return real_decode()

    eng._join_prefilled, eng._decode = join, decode
    try:

        async def one(rid, prompt, delay):
            with pytest.raises(Exception, match="injected after the commit"):
                await collect(eng, rid, prompt, SamplingOptions(max_new_tokens=300, ignore_eos=True), delay)  # fmt: skip

        async def main():
            # "short" is decoding while "long" (150 tokens, 10 chunks) finishes its prefill.
            await asyncio.gather(one("short", PROMPTS[0], 0.0), one("long", LONG, 0.05))

        asyncio.run(main())
    finally:
        eng.shutdown()
    assert injected and not decoded_after
