"""`fallback_json`: models without a tool format of their own are asked (text.chat, in the
system turn) to answer `TOOL_CALLS: [{"name": ..., "arguments": {...}}]`."""

from __future__ import annotations

from mistral_serving.tools.parsers.base import MarkerParser

MARKER = "TOOL_CALLS:"  # text.chat.FALLBACK_CALLS asks for it


class FallbackJsonParser(MarkerParser):
    name = "fallback_json"
    marker = MARKER
