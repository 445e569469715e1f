"""OpenAI's answer shapes as typed structs: chat and text completions, their stream
chunks, usage, logprobs, the error body and `GET /v1/models`. Every OpenAI-shaped answer
we send is built from one of these.

msgspec Structs, not pydantic models: building a stream chunk with logprobs from pydantic
models (`model_construct`) cost 3x the hand-built dicts it replaced, Structs cost about
the same (bench/chunk_bench.py; docs/performance.md). Nothing is validated on the
serving path (the values come from our own code); the unit tests check what the path
builds against these same types with `msgspec.convert`.

Field order is the wire's key order. `wire()` gives the JSON object, which the route
renders with Python's `json.dumps` (msgspec's encoder writes floats its own way, `0.00001`
for `1e-05`, and the bytes on the wire must not change). A field left `UNSET` is absent
from the wire: `usage` on a chunk is absent unless `stream_options.include_usage`, then
null or the counts; a delta holds only what it carries.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec
from msgspec import UNSET, UnsetType

from mistral_serving.errors import RequestError


class _Answer(msgspec.Struct, gc=False, forbid_unknown_fields=True):
    # gc=False: an answer never refers back to itself, so the cycle collector need not
    # track it (cheaper to build). kw_only, set on each class (msgspec does not inherit
    # it), lets defaults stand anywhere, so field order can be the wire order.
    def wire(self) -> dict[str, Any]:
        """The JSON object to send (key order = field order, UNSET fields left out)."""
        return msgspec.to_builtins(self)  # type: ignore[no-any-return]


class Usage(_Answer, kw_only=True):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class TopLogprob(_Answer, kw_only=True):
    token: str
    logprob: float | None
    bytes: list[int]


class ChatTokenLogprob(_Answer, kw_only=True):
    token: str
    logprob: float | None
    bytes: list[int]
    top_logprobs: list[TopLogprob]


class ChatLogprobs(_Answer, kw_only=True):
    content: list[ChatTokenLogprob]
    refusal: None = None


class CompletionLogprobs(_Answer, kw_only=True):
    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class FunctionCall(_Answer, kw_only=True):
    name: str
    arguments: str  # JSON text


class ToolCall(_Answer, kw_only=True):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class AssistantMessage(_Answer, kw_only=True):
    role: Literal["assistant"] = "assistant"
    content: str | None  # null when the answer is only tool calls
    tool_calls: list[ToolCall] | UnsetType = UNSET  # present only when there are calls


class ChatChoice(_Answer, kw_only=True):
    index: int = 0
    message: AssistantMessage
    logprobs: ChatLogprobs | None
    finish_reason: str | None


class CompletionChoice(_Answer, kw_only=True):
    index: int = 0
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: str | None


class ChatCompletion(_Answer, kw_only=True):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class Completion(_Answer, kw_only=True):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage


class FunctionDelta(_Answer, kw_only=True):
    name: str | UnsetType = UNSET  # on a call's first delta only
    arguments: str


class ToolCallDelta(_Answer, kw_only=True):
    """A call's first delta: index, id, type and function.name (arguments ""); then
    deltas with its index and an arguments fragment."""

    index: int
    id: str | UnsetType = UNSET
    type: Literal["function"] | UnsetType = UNSET
    function: FunctionDelta


class Delta(_Answer, kw_only=True):
    """The first chunk's `{"role": "assistant", "content": ""}`, then `{"content": ...}`
    or `{"tool_calls": [...]}`, and `{}` on the chunk that ends the answer."""

    role: Literal["assistant"] | UnsetType = UNSET
    content: str | UnsetType = UNSET
    tool_calls: list[ToolCallDelta] | UnsetType = UNSET


class ChatChunkChoice(_Answer, kw_only=True):
    index: int = 0
    delta: Delta
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None


class CompletionChunkChoice(_Answer, kw_only=True):
    index: int = 0
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionChunk(_Answer, kw_only=True):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None | UnsetType = UNSET


class CompletionChunk(_Answer, kw_only=True):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChunkChoice]
    usage: Usage | None | UnsetType = UNSET


class ModelCard(_Answer, kw_only=True):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str
    max_model_len: int  # vLLM's: the engine's longest sequence


class ModelList(_Answer, kw_only=True):
    object: Literal["list"] = "list"
    data: list[ModelCard]


# OpenAI's error `type` for each status we answer with.
OPENAI_ERROR_TYPES = {
    400: "invalid_request_error",
    404: "not_found_error",
    408: "invalid_request_error",
    413: "invalid_request_error",
    431: "invalid_request_error",
    429: "rate_limit_error",
    499: "invalid_request_error",
    500: "server_error",
    503: "service_unavailable",
}


class ErrorDetail(_Answer, kw_only=True):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(_Answer, kw_only=True):
    error: ErrorDetail

    @classmethod
    def of(cls, err: RequestError) -> ErrorResponse:
        return cls(
            error=ErrorDetail(
                message=err.message,
                type=OPENAI_ERROR_TYPES.get(err.status, "server_error"),
                param=err.param,
                code=err.code,
            )
        )


def openai_error_body(err: RequestError) -> dict[str, Any]:
    """A refusal in OpenAI's error shape (the OpenAI routes, and our GET routes)."""
    return ErrorResponse.of(err).wire()
