r"""Per-chunk cost of the OpenAI stream encoding: each route's `stream_events` over N
one-word chunks, plain and with logprobs (timeit-style: several repeats, the best; CPU
time of this process).

    PYTHONPATH=mistral-trt-truss/packages .venv/bin/python bench/chunk_bench.py
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any, cast

from mistral_serving.engines.base import SamplingOptions, TokenLogprob
from mistral_serving.generation.outcome import Outcome
from mistral_serving.generation.service import Chunk, Generation, GenerationRequest
from mistral_serving.protocols.openai.base import OpenAICall, OpenAIRoute
from mistral_serving.protocols.openai.chat import ChatCall, ChatCompletionsFormat
from mistral_serving.protocols.openai.completions import CompletionCall, CompletionsFormat

N = 2000
REPEATS = 7


class _Chunks:
    """A generation's surface (chunks, then an outcome) without a model."""

    def __init__(self, logprobs: bool) -> None:
        self.logprobs = logprobs
        self.prompt_tokens, self.completion_tokens = 1, 0
        self.outcome: Outcome | None = None

    async def _run(self) -> AsyncIterator[Chunk]:
        lp = [TokenLogprob(42, -0.25, ((42, -0.25), (7, -1.5)))] if self.logprobs else None
        for i in range(N):
            self.completion_tokens += 1
            yield Chunk(f" word{i}", lp)
        self.outcome = Outcome("length", "", 1, N)

    def __aiter__(self) -> AsyncIterator[Chunk]:
        return self._run()


def once_us(chat: bool, logprobs: bool, usage: bool) -> float:
    """CPU time per chunk of one stream of N chunks (process time: on a busy machine the
    wall clock counts other processes' turns too)."""
    gen = GenerationRequest(sampling=SamplingOptions(max_new_tokens=N), prompt="x")
    fmt: OpenAIRoute[Any]
    call: OpenAICall
    if chat:
        fmt, call = ChatCompletionsFormat("model", lambda t: b"tok"), ChatCall(gen, True, usage, 0)
    else:
        fmt, call = (
            CompletionsFormat("model", lambda t: b"tok"),
            CompletionCall(gen, True, usage, 0),
        )

    async def drain() -> int:
        events = fmt.stream_events(call, cast(Generation, _Chunks(logprobs)), "r")
        return sum([len(e) async for e in events])

    start = time.process_time()
    asyncio.run(drain())
    return (time.process_time() - start) / N * 1e6


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--repeats", type=int, default=REPEATS, help="runs of each; the best counts"
    )
    args = parser.parse_args()
    for chat in (True, False):
        for logprobs in (False, True):
            name = f"{'chat' if chat else 'completions'} logprobs={logprobs}"
            best = min(once_us(chat, logprobs, True) for _ in range(args.repeats))
            print(f"{name:32s} {best:6.2f} us/chunk")
