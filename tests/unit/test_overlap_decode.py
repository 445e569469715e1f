"""Overlapped decode in the static engine (`overlap_decode`): a step's greedy tokens are fed to
the next step on the device and read by the host one step late. On the dev model (CPU, so the
"device" is the host and nothing really overlaps) these check what the overlap must not
change: the same tokens and finish reasons as reading every step before the next, a row that
ends on a stop token riding one extra step without a trace, the last column of the cache,
aborts, and one row's failure staying its own."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
import torch

from mistral_gpu_fallback.static import engine as static
from mistral_gpu_fallback.static.engine import StaticTorchEngine
from mistral_serving.engines.base import EngineError, SamplingOptions
from tests.static_engines import cpu_static_engine

PROMPTS = [[1] + list(range(100 + 37 * i, 100 + 37 * i + 2 + 5 * i)) for i in range(6)]


def make_engine(dev_model: Path, overlap: bool, **settings) -> StaticTorchEngine:
    return cpu_static_engine(dev_model, overlap_decode=overlap, **settings)


class StepCount:
    """How many decode steps took the overlapped path, and how many read their tokens first."""

    def __init__(self, eng: StaticTorchEngine, monkeypatch: pytest.MonkeyPatch) -> None:
        self.overlapped = self.stepwise = 0
        overlap_step, advance = eng._overlap_step, eng._advance

        def counted_overlap(logits):
            self.overlapped += 1
            return overlap_step(logits)

        def counted_advance(seqs, logits, first_row, failures=None):
            self.stepwise += first_row == 0 and seqs == eng._running  # a decode step's rows
            return advance(seqs, logits, first_row, failures)

        monkeypatch.setattr(eng, "_overlap_step", counted_overlap)
        monkeypatch.setattr(eng, "_advance", counted_advance)


async def collect(engine, rid, prompt, opts, delay=0.0):
    await asyncio.sleep(delay)
    tokens, reasons = [], []
    try:
        async for delta in engine.generate(rid, prompt, opts):
            tokens += delta.token_ids
            reasons.append(delta.finish_reason)
    except EngineError as exc:
        return tokens, f"error: {exc}"
    return tokens, reasons[-1]  # how deltas group depends on timing; the tokens do not


def run_all(eng, requests):
    async def main():
        return await asyncio.gather(
            *[collect(eng, f"r{i}", p, o, d) for i, (p, o, d) in enumerate(requests)]
        )

    return asyncio.run(main())


def wait_idle(eng) -> None:
    for _ in range(3000):
        if not eng._running and eng._launched is None:
            return
        time.sleep(0.01)
    raise AssertionError("the engine kept rows after every stream ended")


def greedy(n: int, **kw) -> SamplingOptions:
    return SamplingOptions(max_new_tokens=n, top_k=1, **kw)


def mixed_workload(stop_token: int) -> list[tuple[list[int], SamplingOptions, float]]:
    """Greedy rows of different lengths (holes filled at different steps), one ending on a
    stop token, one with min_tokens, and a seeded sampled row arriving in the middle (the
    engine leaves the overlap while it runs, and comes back to it after)."""
    return [
        (PROMPTS[0], greedy(40), 0.0),
        (PROMPTS[1], greedy(7), 0.0),
        (PROMPTS[2], greedy(30, stop_token_ids=(stop_token,)), 0.0),
        (PROMPTS[3], greedy(25, min_tokens=3, stop_token_ids=(stop_token,)), 0.0),
        (PROMPTS[4], SamplingOptions(max_new_tokens=6, temperature=0.9, seed=11), 0.05),
        (PROMPTS[5], greedy(18, ignore_eos=True), 0.01),
    ]


def test_overlapped_steps_give_the_stepwise_tokens(dev_model, monkeypatch):
    results, counts = {}, {}
    stop_token = None
    for overlap in (False, True):
        eng = make_engine(dev_model, overlap)
        try:
            if stop_token is None:  # a token row 2 really produces mid-way, from the engine
                ((probe, _),) = run_all(eng, [(PROMPTS[2], greedy(30), 0.0)])
                stop_token = probe[9]
            counter = StepCount(eng, monkeypatch)
            results[overlap] = run_all(eng, mixed_workload(stop_token))
            counts[overlap] = (counter.overlapped, counter.stepwise)
            wait_idle(eng)
            monkeypatch.undo()
        finally:
            eng.shutdown()
    assert results[True] == results[False]
    tokens, reason = results[True][2]
    assert reason == "stop" and stop_token not in tokens and len(tokens) < 30
    assert counts[False][0] == 0 and counts[False][1] > 0
    # Both paths ran with the overlap on: the sampled row's steps read their tokens first.
    assert counts[True][0] > 10 and counts[True][1] > 0


def test_a_row_ending_on_a_stop_token_leaves_its_slot_clean(dev_model, hf_model):
    eng = make_engine(dev_model, True, max_batch_size=2)
    try:
        out = hf_model.generate(
            torch.tensor([PROMPTS[1]]), max_new_tokens=20, do_sample=False, pad_token_id=0
        )
        ref = out[0, len(PROMPTS[1]) :].tolist()
        stop = ref[4]
        before_stop = ref[: ref.index(stop)]
        (tokens, reason), (long_tokens, _) = run_all(
            eng,
            [
                (PROMPTS[1], greedy(20, stop_token_ids=(stop,)), 0.0),
                (PROMPTS[0], greedy(20), 0.0),
            ],
        )
        assert tokens == before_stop and reason == "stop"
        wait_idle(eng)
        # The slot the stopped row rode its extra step in serves the next request exactly.
        ((again, _),) = run_all(eng, [(PROMPTS[1], greedy(20), 0.0)])
        assert again == ref
        ((long_again, _),) = run_all(eng, [(PROMPTS[0], greedy(20), 0.0)])
        assert long_again == long_tokens
    finally:
        eng.shutdown()


def test_a_row_filling_the_last_column(dev_model, hf_model):
    """prompt + max_new = max_seq_len: the row's last token is fed at the last column in the
    step it rides after it ended, never past it."""
    eng = make_engine(dev_model, True, max_seq_len=256)
    try:
        prompt = [1] + [100 + (7 * i) % 900 for i in range(245)]
        out = hf_model.generate(
            torch.tensor([prompt]), max_new_tokens=10, do_sample=False, pad_token_id=0
        )
        ref = out[0, len(prompt) :].tolist()
        (tokens, reason), (short, _) = run_all(
            eng, [(prompt, greedy(10), 0.0), (PROMPTS[0], greedy(30), 0.0)]
        )
        assert tokens == ref and reason == "length"
        assert len(prompt) + len(tokens) == eng.limits.max_seq_len
        assert len(short) == 30 and eng.is_healthy()
    finally:
        eng.shutdown()


def test_an_abort_under_overlap_ends_only_its_stream(dev_model):
    eng = make_engine(dev_model, True)
    try:
        ((clean, _),) = run_all(eng, [(PROMPTS[0], greedy(60), 0.0)])

        async def main():
            async def cut():
                tokens = []
                async for delta in eng.generate("cut", PROMPTS[2], greedy(200)):
                    tokens += delta.token_ids
                    if len(tokens) >= 5:
                        break  # the consumer leaves: the engine aborts the row
                return tokens

            return await asyncio.gather(collect(eng, "keep", PROMPTS[0], greedy(60)), cut())

        (kept, reason), cut_tokens = asyncio.run(main())
        assert kept == clean and reason == "length" and len(cut_tokens) >= 5
        wait_idle(eng)
        assert eng.is_healthy()
    finally:
        eng.shutdown()


POISON_AT = 6


def test_bookkeeping_failing_under_overlap_fails_only_its_request(dev_model, monkeypatch):
    from mistral_serving.engines.pytorch.dynamic import TorchEngine

    eng = make_engine(dev_model, True)
    try:
        work = [(p, greedy(16), 0.0) for p in PROMPTS[:4]]
        clean = run_all(eng, work)
        real = TorchEngine._record

        def record(seq, pick):
            if seq.request_id == "r2" and len(seq.generated) == POISON_AT:
                raise KeyError("stop check poisoned")
            return real(seq, pick)

        monkeypatch.setattr(TorchEngine, "_record", staticmethod(record))
        counter = StepCount(eng, monkeypatch)
        poisoned = run_all(eng, work)
        assert counter.overlapped > 0
        tokens, reason = poisoned[2]
        assert tokens == clean[2][0][:POISON_AT] and "stop check poisoned" in reason
        assert [r for i, r in enumerate(poisoned) if i != 2] == [
            r for i, r in enumerate(clean) if i != 2
        ]
        assert eng.is_healthy()
    finally:
        eng.shutdown()


def test_a_row_without_a_finite_logit_under_overlap_fails_alone(dev_model, monkeypatch):
    eng = make_engine(dev_model, True)
    try:
        work = [(p, greedy(16), 0.0) for p in PROMPTS[:3]]
        clean = run_all(eng, work)
        real = static.greedy_tokens

        def no_finite_for_r1(logits):
            tokens = real(logits)
            rows = [r for r, s in enumerate(eng._running) if s.request_id == "r1"]
            if rows and len(eng._running[rows[0]].generated) >= POISON_AT:
                tokens[rows[0]] = -1
            return tokens

        monkeypatch.setattr(static, "greedy_tokens", no_finite_for_r1)
        poisoned = run_all(eng, work)
        tokens, reason = poisoned[1]
        assert "no finite logits" in reason
        # Its tokens up to the bad step arrive; it fails there (the count it is poisoned at
        # is read one step late, so one more token may come first).
        assert tokens == clean[1][0][: len(tokens)] and POISON_AT <= len(tokens) <= POISON_AT + 1
        assert poisoned[0] == clean[0] and poisoned[2] == clean[2]
        assert eng.is_healthy()
    finally:
        eng.shutdown()


def test_overlap_is_reported_and_can_be_turned_off(dev_model):
    for overlap in (True, False):
        eng = make_engine(dev_model, overlap)
        try:
            assert eng.info.details["overlap_decode"] is overlap
        finally:
            eng.shutdown()
