"""vLLM's `stream_options.continuous_usage_stats` (guidellm sends it on every streamed
request): with `include_usage`, each content chunk and the finish chunk carry the usage so
far; without `include_usage` it changes nothing."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from mistral_serving.engines.base import TokenLogprob
from mistral_serving.generation.outcome import Outcome
from mistral_serving.generation.service import Chunk
from mistral_serving.protocols import ParseContext
from tests.doubles.generations import openai_format, scripted

CTX = ParseContext(default_max_tokens=64)
PARTS = ["Hel", "lo", " wor", "ld"]
PROMPT_TOKENS = 5


def token_bytes(token_id: int) -> bytes:
    return f"<{token_id}>".encode()


def stream(chat: bool, options: dict[str, Any], parts: list[Chunk]) -> list[dict[str, Any]]:
    fmt = openai_format(chat, "m", token_bytes)
    body: dict[str, Any] = {"stream": True, "stream_options": options, "max_tokens": 4}
    body |= {"messages": [{"role": "user", "content": "x"}]} if chat else {"prompt": "x"}
    call = fmt.parse(body, CTX)
    # As the service counts: the prompt from the start, each chunk's tokens before it is
    # yielded, the finish reason at the end.
    generation = scripted(parts, Outcome("length", "", PROMPT_TOKENS, len(parts)))

    async def run() -> list[str]:
        return [e async for e in fmt.stream_events(call, generation, "e")]

    events = asyncio.run(run())
    assert events[-1] == "data: [DONE]\n\n"
    return [json.loads(e.removeprefix("data: ")) for e in events[:-1]]


def usage(completion: int) -> dict[str, int]:
    return {
        "prompt_tokens": PROMPT_TOKENS,
        "completion_tokens": completion,
        "total_tokens": PROMPT_TOKENS + completion,
    }


@pytest.mark.parametrize("chat", [True, False])
@pytest.mark.parametrize("with_logprobs", [False, True])
def test_every_chunk_carries_the_usage_so_far(chat: bool, with_logprobs: bool) -> None:
    parts = [
        Chunk(t, [TokenLogprob(i, -0.5, ())] if with_logprobs else None)
        for i, t in enumerate(PARTS)
    ]
    events = stream(chat, {"include_usage": True, "continuous_usage_stats": True}, parts)
    if chat:
        role, *events = events
        assert role["usage"] is None  # sent before the prompt is counted
    *content, finish, last = events
    assert [e["usage"] for e in content] == [usage(n) for n in range(1, len(PARTS) + 1)]
    text = [
        e["choices"][0]["delta"]["content"] if chat else e["choices"][0]["text"] for e in content
    ]
    assert text == PARTS
    assert finish["choices"][0]["finish_reason"] == "length"
    assert finish["usage"] == usage(len(PARTS))
    assert last == last | {"choices": [], "usage": usage(len(PARTS))}


def test_without_include_usage_it_changes_nothing() -> None:
    plain = stream(True, {}, [Chunk(t) for t in PARTS])
    continuous = stream(True, {"continuous_usage_stats": True}, [Chunk(t) for t in PARTS])

    def strip(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{k: v for k, v in e.items() if k != "created"} for e in events]

    assert strip(continuous) == strip(plain)
    assert all("usage" not in e for e in continuous)


def test_include_usage_alone_keeps_usage_for_the_last_chunk() -> None:
    *events, last = stream(True, {"include_usage": True}, [Chunk(t) for t in PARTS])
    assert all(e["usage"] is None for e in events)
    assert last["usage"] == usage(len(PARTS))
