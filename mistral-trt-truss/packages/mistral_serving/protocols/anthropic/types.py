"""Anthropic's Messages answer shapes as typed structs (as protocols/openai/types.py): the
Message, its content blocks, usage, the stream's events and the error body. Field order is
the wire's key order; a field left UNSET is absent from the wire. The unit tests check
what the route builds against the anthropic SDK's own models (`anthropic.types`)."""

from __future__ import annotations

from typing import Any, Literal

import msgspec
from msgspec import UNSET, UnsetType

from mistral_serving.errors import RequestError


class _Answer(msgspec.Struct, gc=False, forbid_unknown_fields=True):
    def wire(self) -> dict[str, Any]:
        return msgspec.to_builtins(self)  # type: ignore[no-any-return]


class TextContent(_Answer, kw_only=True, tag_field="type", tag="text"):
    text: str


class ToolUseContent(_Answer, kw_only=True, tag_field="type", tag="tool_use"):
    id: str
    name: str
    input: dict[str, Any]


ContentBlock = TextContent | ToolUseContent


class Usage(_Answer, kw_only=True):
    input_tokens: int
    output_tokens: int
    cache_creation_input_tokens: int = 0  # no prompt caching here: always 0
    cache_read_input_tokens: int = 0


StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"]


class Message(_Answer, kw_only=True, tag_field="type", tag="message"):
    id: str
    role: Literal["assistant"] = "assistant"
    model: str
    content: list[ContentBlock]
    stop_reason: StopReason | None
    stop_sequence: str | None
    usage: Usage


class TokenCount(_Answer, kw_only=True):
    input_tokens: int


# ---- stream events (each SSE event is named by its `type`) ----


class MessageStart(_Answer, kw_only=True, tag_field="type", tag="message_start"):
    message: Message


class BlockStart(_Answer, kw_only=True, tag_field="type", tag="content_block_start"):
    index: int
    content_block: ContentBlock


class TextDelta(_Answer, kw_only=True, tag_field="type", tag="text_delta"):
    text: str


class InputJsonDelta(_Answer, kw_only=True, tag_field="type", tag="input_json_delta"):
    partial_json: str


class BlockDelta(_Answer, kw_only=True, tag_field="type", tag="content_block_delta"):
    index: int
    delta: TextDelta | InputJsonDelta


class BlockStop(_Answer, kw_only=True, tag_field="type", tag="content_block_stop"):
    index: int


class StopDelta(_Answer, kw_only=True):
    stop_reason: StopReason | None
    stop_sequence: str | None


class DeltaUsage(_Answer, kw_only=True):
    input_tokens: int | UnsetType = UNSET
    output_tokens: int


class MessageDelta(_Answer, kw_only=True, tag_field="type", tag="message_delta"):
    delta: StopDelta
    usage: DeltaUsage


class MessageStop(_Answer, kw_only=True, tag_field="type", tag="message_stop"):
    pass


# ---- errors ----

# Anthropic's error `type` for each status we answer with.
ANTHROPIC_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    408: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    431: "invalid_request_error",
    499: "invalid_request_error",
    500: "api_error",
    503: "overloaded_error",
    504: "timeout_error",
}


class ErrorDetail(_Answer, kw_only=True):
    type: str
    message: str


class ErrorBody(_Answer, kw_only=True, tag_field="type", tag="error"):
    error: ErrorDetail


def anthropic_error_body(err: RequestError) -> dict[str, Any]:
    """A refusal in Anthropic's error shape (also the stream's `error` event)."""
    kind = ANTHROPIC_ERROR_TYPES.get(err.status, "api_error" if err.status >= 500 else
                                     "invalid_request_error")  # fmt: skip
    return ErrorBody(error=ErrorDetail(type=kind, message=err.message)).wire()
