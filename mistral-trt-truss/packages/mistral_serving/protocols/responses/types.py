"""The Responses API's answer shapes as typed structs (as protocols/openai/types.py):
the Response object, its output items, usage, and the stream's events. Field order is the
wire's key order; a field left UNSET is absent from the wire. The unit tests check what
the route builds against the openai SDK's own models (`openai.types.responses`)."""

from __future__ import annotations

from typing import Any, Literal

import msgspec
from msgspec import UNSET, UnsetType


class _Answer(msgspec.Struct, gc=False, forbid_unknown_fields=True):
    def wire(self) -> dict[str, Any]:
        return msgspec.to_builtins(self)  # type: ignore[no-any-return]


class OutputText(_Answer, kw_only=True, tag_field="type", tag="output_text"):
    text: str
    annotations: list[Any] = msgspec.field(default_factory=list)
    logprobs: list[Any] = msgspec.field(default_factory=list)


ItemStatus = Literal["in_progress", "completed", "incomplete"]


class OutputMessage(_Answer, kw_only=True, tag_field="type", tag="message"):
    id: str
    status: ItemStatus
    role: Literal["assistant"] = "assistant"
    content: list[OutputText]


class FunctionCall(_Answer, kw_only=True, tag_field="type", tag="function_call"):
    id: str
    call_id: str
    name: str
    arguments: str  # JSON text
    status: ItemStatus


OutputItem = OutputMessage | FunctionCall


class InputTokensDetails(_Answer, kw_only=True):
    cached_tokens: int = 0
    cache_write_tokens: int = 0


class OutputTokensDetails(_Answer, kw_only=True):
    reasoning_tokens: int = 0


class ResponseUsage(_Answer, kw_only=True):
    input_tokens: int
    input_tokens_details: InputTokensDetails = msgspec.field(default_factory=InputTokensDetails)
    output_tokens: int
    output_tokens_details: OutputTokensDetails = msgspec.field(default_factory=OutputTokensDetails)
    total_tokens: int


class IncompleteDetails(_Answer, kw_only=True):
    reason: Literal["max_output_tokens"]


class ResponseError(_Answer, kw_only=True):
    code: Literal["server_error"] = "server_error"
    message: str


Status = Literal["in_progress", "completed", "incomplete", "failed"]


class Response(_Answer, kw_only=True):
    id: str
    object: Literal["response"] = "response"
    created_at: int
    status: Status
    error: ResponseError | None = None
    incomplete_details: IncompleteDetails | None = None
    instructions: str | None
    max_output_tokens: int | None
    model: str
    output: list[OutputItem]
    parallel_tool_calls: bool
    previous_response_id: str | None
    store: bool
    temperature: float
    text: dict[str, Any]
    tool_choice: Any
    tools: list[dict[str, Any]]
    top_p: float
    truncation: Literal["disabled"] = "disabled"
    usage: ResponseUsage | None
    user: str | None
    metadata: dict[str, str]


class Deleted(_Answer, kw_only=True):
    id: str
    object: Literal["response"] = "response"
    deleted: Literal[True] = True


class StreamEvent(_Answer, kw_only=True):
    """Every streamed event: `type`, `sequence_number`, and the fields its type has."""

    type: str
    sequence_number: int
    response: Response | UnsetType = UNSET
    output_index: int | UnsetType = UNSET
    item_id: str | UnsetType = UNSET
    content_index: int | UnsetType = UNSET
    item: OutputItem | UnsetType = UNSET
    part: OutputText | UnsetType = UNSET
    delta: str | UnsetType = UNSET
    text: str | UnsetType = UNSET
    name: str | UnsetType = UNSET
    arguments: str | UnsetType = UNSET
    logprobs: list[Any] | UnsetType = UNSET
    code: str | None | UnsetType = UNSET
    message: str | UnsetType = UNSET
    param: str | None | UnsetType = UNSET
