"""The prefill's memory bounds in both PyTorch engines (dynamic, static KV), measured by
what the prefill materialises, not by time: every call of lm_head is recorded, and an
echo (prompt logprobs) request beside short ones must project only its own positions, at
most `chunk` at a time, with the exact logprobs. The admission rule (padded rows x width,
last-position logits) is fuzzed. A prefill that fails (an allocation) fails its request
alone: its bystanders complete, the engine stays healthy."""

from __future__ import annotations

import asyncio
import collections
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mistral_serving.engines.base import EngineError, SamplingOptions, TokenDelta
from mistral_serving.engines.factory import start_torch_engine
from mistral_serving.engines.pytorch.dynamic import TorchEngine
from mistral_serving.engines.pytorch.prefill import (
    PrefillBudget,
    is_allocation_failure,
    take_admissible,
)
from mistral_serving.settings import Settings
from tests.unit.test_prompt_logprobs import check_against_hf

EOS = 2
VOCAB = 32000
CHUNK = 16  # prompt positions per projection in these tests
# float32 logits: 4 bytes each, plus 12 of float32 work (engines/pytorch/prefill.py)
LOGITS_BYTES = CHUNK * VOCAB * (4 + 12)
KINDS = {
    "dynamic": {},
    "static": {"pytorch_kv_cache": "static", "max_seq_len": 512},
}
ECHO_PROMPT = [1, *[(i * 7919) % 31000 + 500 for i in range(299)]]  # 300 tokens
SHORT = [[1, 415, 5565, 302], [1, 22557, 9], [1, 3195], [1, 77, 12, 500, 31999]] * 2


@pytest.fixture(scope="module", params=list(KINDS))
def engine(request, dev_model: Path):
    eng = start_torch_engine(
        dev_model,
        Settings(
            artifact=str(dev_model),
            device="cpu",
            prefill_logits_bytes=LOGITS_BYTES,
            **KINDS[request.param],
        ),
        EOS,
    )
    yield eng
    eng.shutdown()


@dataclass
class HeadCalls:
    """Positions (rows x columns) of every lm_head input, in call order."""

    positions: list[int] = field(default_factory=list)
    shapes: list[tuple[int, ...]] = field(default_factory=list)

    def __call__(self, _module: torch.nn.Module, args: tuple, _out: torch.Tensor) -> None:
        (x,) = args
        self.shapes.append(tuple(x.shape))
        self.positions.append(x.numel() // x.shape[-1])


def lm_head(engine: TorchEngine) -> torch.nn.Module:
    return engine._model.lm_head


async def drain(engine, rid: str, prompt: list[int], opts: SamplingOptions) -> list[TokenDelta]:
    return [d async for d in engine.generate(rid, prompt, opts)]


def greedy(n: int) -> SamplingOptions:
    return SamplingOptions(max_new_tokens=n, top_k=1)


def echo(n: int, k: int = 2) -> SamplingOptions:
    return SamplingOptions(max_new_tokens=n, top_k=1, logprobs=k, prompt_logprobs=k)


def tokens(deltas: list[TokenDelta]) -> list[int]:
    return [t for d in deltas for t in d.token_ids]


def run_together(engine, jobs) -> list[list[TokenDelta]]:
    async def main():
        return await asyncio.gather(*(drain(engine, *job) for job in jobs))

    return asyncio.run(main())


def test_the_engine_reports_the_chunk(engine) -> None:
    assert engine._budget.chunk == CHUNK
    assert engine.info.details["prefill_logits_chunk"] == CHUNK


def test_echo_beside_short_requests_projects_only_its_own_positions_in_chunks(
    engine, hf_model, monkeypatch: pytest.MonkeyPatch
) -> None:
    alone = [tokens(asyncio.run(drain(engine, f"a{i}", p, greedy(5)))) for i, p in enumerate(SHORT)]
    calls, projections = HeadCalls(), HeadCalls()
    head = engine._head  # what the prompt-logprob chunks go through

    def projection(x: torch.Tensor) -> torch.Tensor:
        projections(head, (x,), None)
        return head(x)

    monkeypatch.setattr(engine, "_head", projection)
    handle = lm_head(engine).register_forward_hook(calls)
    try:
        jobs = [(f"s{i}", p, greedy(5)) for i, p in enumerate(SHORT)]
        jobs.insert(3, ("echo", ECHO_PROMPT, echo(2)))
        results = run_together(engine, jobs)
    finally:
        handle.remove()
    echo_deltas = results.pop(3)
    # Bystanders: the same tokens as alone.
    assert [tokens(r) for r in results] == alone
    # The echo request: exact prompt logprobs.
    check_against_hf(hf_model, ECHO_PROMPT, echo_deltas[0].prompt_logprobs, k=2)
    # Its 299 logprob positions (of its own row only) were projected once, in chunks of
    # CHUNK positions: 18 of 16 and one of 11.
    assert projections.shapes == [(CHUNK, 64)] * 18 + [(11, 64)]
    # No lm_head call at all held more positions than a chunk or one per batch row (the
    # last-position logits of a prefill or decode step); the old prefill projected
    # rows x the echo prompt's 300 positions at once.
    assert max(calls.positions) <= max(CHUNK, len(SHORT) + 1)


@dataclass
class Waiting:
    prompt: list[int]
    sampling: SamplingOptions = SamplingOptions(max_new_tokens=1)


@settings(max_examples=300, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 5000), max_size=40),
    room=st.integers(0, 70),
    max_tokens=st.integers(16, 20000),
    rows_of_logits=st.integers(0, 80),
)
def test_admission_takes_a_fitting_prefix_of_the_queue(
    lengths: list[int], room: int, max_tokens: int, rows_of_logits: int
) -> None:
    position = VOCAB * (2 + 12)
    budget = PrefillBudget(max_tokens, max(1, rows_of_logits * position), VOCAB, 2)
    queue = collections.deque(Waiting([1] * n) for n in lengths)
    before = list(queue)
    taken = take_admissible(queue, room, budget)
    assert before == taken + list(queue)  # a prefix, in order; nothing lost
    if not before or room == 0:
        assert taken == []
        return
    assert len(taken) >= 1  # the head never starves
    assert len(taken) <= room
    width = max(len(w.prompt) for w in taken)
    if len(taken) > 1:
        assert len(taken) * width <= max_tokens
        assert len(taken) * position <= budget.logits_bytes
    if queue and len(taken) < room:  # the next one would not have fitted
        wider = max(width, len(queue[0].prompt))
        assert not budget.fits(len(taken) + 1, wider)


def test_admission_counts_padding_not_prompt_tokens() -> None:
    """32 two-token prompts and one of 2,000: 66 prompt tokens plus 2,000 is under 8192,
    but prefilled together they are 33 rows x 2,000 columns."""
    budget = PrefillBudget(8192, 2**40, VOCAB, 4)
    queue = collections.deque([Waiting([1] * 2000), *(Waiting([1, 2]) for _ in range(32))])
    assert len(take_admissible(queue, 64, budget)) == 4  # 4 x 2000 <= 8192 < 5 x 2000
    queue = collections.deque([*(Waiting([1, 2]) for _ in range(32)), Waiting([1] * 2000)])
    assert len(take_admissible(queue, 64, budget)) == 32  # the long one waits its turn


def test_a_failed_projection_fails_the_echo_request_alone(engine, monkeypatch) -> None:
    alone = tokens(asyncio.run(drain(engine, "b0", SHORT[0], greedy(5))))

    def out_of_memory(_x: torch.Tensor) -> torch.Tensor:
        raise torch.OutOfMemoryError("CUDA out of memory (simulated)")

    monkeypatch.setattr(engine, "_head", out_of_memory)  # the prompt-logprob projection

    async def main():
        bystander = asyncio.ensure_future(drain(engine, "b1", SHORT[0], greedy(5)))
        with pytest.raises(EngineError, match="out of memory"):
            await drain(engine, "e1", ECHO_PROMPT, echo(3))
        return await bystander

    assert tokens(asyncio.run(main())) == alone
    assert engine.is_healthy()
    monkeypatch.undo()
    deltas = asyncio.run(drain(engine, "e2", ECHO_PROMPT, echo(0)))
    assert len(deltas[0].prompt_logprobs) == len(ECHO_PROMPT) - 1


def test_a_failed_prefill_fails_its_own_request_alone(engine, monkeypatch) -> None:
    """A prefill batch that fails (an allocation) is retried one request at a time: the
    request that cannot be prefilled gets EngineError, the rest of its batch and the
    running requests complete, and the engine stays healthy."""
    alone = [tokens(asyncio.run(drain(engine, f"c{i}", p, greedy(8)))) for i, p in enumerate(SHORT)]
    rows = engine._prefill_rows

    def fragile(seqs) -> None:
        if any(len(s.prompt) >= len(ECHO_PROMPT) for s in seqs):
            raise RuntimeError("DefaultCPUAllocator: not enough memory (simulated)")
        rows(seqs)

    monkeypatch.setattr(engine, "_prefill_rows", fragile)

    async def main():
        running = asyncio.ensure_future(drain(engine, "r", SHORT[1], greedy(40)))
        await asyncio.sleep(0)
        others = [
            asyncio.ensure_future(drain(engine, f"d{i}", p, greedy(8))) for i, p in enumerate(SHORT)
        ]
        with pytest.raises(EngineError, match="prefill failed"):
            await drain(engine, "big", ECHO_PROMPT, echo(2))
        return await asyncio.gather(*others), await running

    others, running = asyncio.run(main())
    assert [tokens(r) for r in others] == alone
    assert running[-1].finish_reason in ("length", "stop")
    assert engine.is_healthy()


@pytest.mark.parametrize(
    ("exc", "alloc"),
    [
        (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 8.45 GiB"), True),
        (RuntimeError("DefaultCPUAllocator: not enough memory: you tried to allocate 8"), True),
        (RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory"), True),
        (MemoryError(), True),
        (RuntimeError("CUDA error: an illegal memory access was encountered"), False),
        (ValueError("out of memory"), False),
    ],
)  # fmt: skip
def test_only_allocation_failures_are_a_requests_own(exc: BaseException, alloc: bool) -> None:
    """A broken device or model (any other error) still stops the engine."""
    assert is_allocation_failure(exc) is alloc
