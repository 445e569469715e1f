r"""Per-chunk cost of the OpenAI stream encoding: `OpenAIFormat.stream_events` over N
one-word chunks, plain and with logprobs (timeit-style: several repeats, the best;
CPU time of this process).

    PYTHONPATH=mistral-trt-truss/packages .venv/bin/python bench/chunk_bench.py

`--against FILE` times another version of `protocols/openai.py` too, interleaved with this
one so that a busy machine slows both alike. The hand-built dicts before the typed answers
(docs/perf/history/round-03.md's figures) are b06b943's, whose error-body import moved since:

    git show b06b943:mistral-trt-truss/packages/mistral_serving/protocols/openai.py \
      | sed 's/^from mistral_serving.errors import RequestError, openai_error_body$/from mistral_serving.errors import RequestError\nfrom mistral_serving.protocols.openai_types import openai_error_body/' > /tmp/old.py
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

from mistral_serving.engines.base import SamplingOptions, TokenLogprob
from mistral_serving.generation.service import Chunk, GenerationRequest
from mistral_serving.ops.telemetry import RequestRecord
from mistral_serving.protocols import openai

N = 2000
REPEATS = 7


async def _chunks(logprobs: bool) -> AsyncIterator[Chunk]:
    lp = [TokenLogprob(42, -0.25, ((42, -0.25), (7, -1.5)))] if logprobs else None
    for i in range(N):
        yield Chunk(f" word{i}", lp)


def once_us(module: Any, chat: bool, logprobs: bool, usage: bool) -> float:
    """CPU time per chunk of one stream of N chunks (process time: on a busy machine the
    wall clock counts other processes' turns too)."""
    fmt = module.OpenAIFormat(chat, "model", lambda t: b"tok")
    gen = GenerationRequest(sampling=SamplingOptions(max_new_tokens=N), prompt="x")
    call = module.OpenAICall(chat, gen, True, usage, 0)
    record = RequestRecord(request_id="r", route="bench", finish_reason="length")

    async def drain() -> int:
        events = fmt.stream_events(call, _chunks(logprobs), record)
        return sum([len(e) async for e in events])

    start = time.process_time()
    asyncio.run(drain())
    return (time.process_time() - start) / N * 1e6


def best_us(modules: list[Any], chat: bool, logprobs: bool, repeats: int) -> list[float]:
    """The best of `repeats` runs of each module, the modules' runs interleaved."""
    best = [float("inf")] * len(modules)
    for _ in range(repeats):
        for i, module in enumerate(modules):
            best[i] = min(best[i], once_us(module, chat, logprobs, True))
    return best


def _load(path: str) -> Any:
    spec = importlib.util.spec_from_file_location("openai_other", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--against", help="another protocols/openai.py to time beside this one")
    parser.add_argument(
        "--repeats", type=int, default=REPEATS, help="runs of each; the best counts"
    )
    args = parser.parse_args()
    modules = [openai] + ([_load(args.against)] if args.against else [])
    for chat in (True, False):
        for logprobs in (False, True):
            name = f"{'chat' if chat else 'completions'} logprobs={logprobs}"
            times = best_us(modules, chat, logprobs, args.repeats)
            if len(times) == 1:
                print(f"{name:32s} {times[0]:6.2f} us/chunk")
            else:
                new, old = times
                print(
                    f"{name:32s} this {new:6.2f}  other {old:6.2f} us/chunk  ({new / old - 1:+.0%})"
                )
