"""Per-chunk cost of the OpenAI stream encoding: `OpenAIFormat.stream_events` over N
one-word chunks, plain and with logprobs (timeit-style: several repeats, the best).

    PYTHONPATH=mistral-trt-truss/packages .venv/bin/python tests/bench/chunk_bench.py
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

from mistral_serving.engines.base import SamplingOptions, TokenLogprob
from mistral_serving.protocols.openai import OpenAICall, OpenAIFormat
from mistral_serving.service import Chunk, GenerationRequest
from mistral_serving.telemetry import RequestRecord

N = 2000
REPEATS = 7


async def _chunks(logprobs: bool) -> AsyncIterator[Chunk]:
    lp = [TokenLogprob(42, -0.25, ((42, -0.25), (7, -1.5)))] if logprobs else None
    for i in range(N):
        yield Chunk(f" word{i}", lp)


def per_chunk_us(chat: bool, logprobs: bool, usage: bool) -> float:
    fmt = OpenAIFormat(chat, "model", lambda t: b"tok")
    gen = GenerationRequest(sampling=SamplingOptions(max_new_tokens=N), prompt="x")
    call = OpenAICall(chat, gen, True, usage, 0)
    best = float("inf")
    for _ in range(REPEATS):
        record = RequestRecord(request_id="r", route="bench", finish_reason="length")

        async def drain(record: RequestRecord = record) -> int:
            events = fmt.stream_events(call, _chunks(logprobs), record)
            return sum([len(e) async for e in events])

        start = time.perf_counter()
        asyncio.run(drain())
        best = min(best, time.perf_counter() - start)
    return best / N * 1e6


if __name__ == "__main__":
    for chat in (True, False):
        for logprobs in (False, True):
            name = f"{'chat' if chat else 'completions'} logprobs={logprobs}"
            print(f"{name:32s} {per_chunk_us(chat, logprobs, True):6.2f} us/chunk")
