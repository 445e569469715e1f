"""A wire format's whole path without HTTP: parse a body, run the generation service over
an engine (a double), and return the answer or the stream's events, as the frontend
would. For the formats whose stream names its events (`event: <type>`)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from mistral_serving.generation.service import GenerationService
from mistral_serving.ops.record import RequestRecord
from mistral_serving.protocols import ParseContext, WireFormat

CTX = ParseContext(default_max_tokens=256)


def named_events(raw: list[str]) -> list[dict[str, Any]]:
    """Each SSE event's data, checking that its `event:` name is its `type`."""
    out = []
    for text in raw:
        assert text.endswith("\n\n") and text.count("\n") == 3, text
        head, data, _, _ = text.split("\n")
        event = json.loads(data.removeprefix("data: "))
        assert head == f"event: {event['type']}", text
        out.append(event)
    return out


async def run(fmt: WireFormat, service: GenerationService, call: Any, route: str) -> Any:
    """The answer (a dict) or, for a streaming call, the decoded events."""
    record = RequestRecord("req", route, engine_id="e1")
    prepared = await service.prepare(call.gen)
    generation = service.generate(prepared, record)
    if not call.stream:
        return fmt.response_body(call, await generation.complete(), record.engine_id)
    return named_events([e async for e in fmt.stream_events(call, generation, record.engine_id)])


def answer(fmt: WireFormat, service: GenerationService, body: dict[str, Any], route: str) -> Any:
    return asyncio.run(run(fmt, service, fmt.parse(body, CTX), route))
