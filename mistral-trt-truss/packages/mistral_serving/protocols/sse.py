"""Server-sent events as every streaming wire format writes them: one JSON object per
event, on one line. OpenAI's chat and completions send bare `data:` events; the Responses
API and Anthropic's Messages API name each event (`event: <type>`) as well."""

from __future__ import annotations

import json
from typing import Any

# JSON leaves U+0085, U+2028 and U+2029 unescaped, and line splitters that follow Unicode
# (Python's str.splitlines, which some SSE clients use) end a line there, cutting an event
# in two. Escaped, the event is the same JSON and one line for every client.
_UNICODE_LINE_BREAKS = {0x85: "\\u0085", 0x2028: "\\u2028", 0x2029: "\\u2029"}


def event_json(value: object) -> str:
    """`value` as the JSON of one SSE event: non-ASCII as is, but never a line break."""
    return json.dumps(value, ensure_ascii=False).translate(_UNICODE_LINE_BREAKS)


def sse(data: dict[str, Any]) -> str:
    return f"data: {event_json(data)}\n\n"


def named_sse(event: str, data: dict[str, Any]) -> str:
    """An event with its name on an `event:` line (the name is the data's `type`)."""
    return f"event: {event}\ndata: {event_json(data)}\n\n"
