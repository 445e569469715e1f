"""OpenAI's answer shapes as typed models: chat and text completions, their stream
chunks, usage, logprobs, the error body and `GET /v1/models`.

Field order is the wire's key order. Answers are rendered with `wire()` (the model's
dump, then the route's own `json.dumps`), never `model_dump_json`: pydantic writes floats
its own way (`1e-5`, not Python's `1e-05`), and the bytes on the wire must not change.
`usage` on a chunk is a three-way field: absent unless `stream_options.include_usage`,
then null or the counts; `wire(usage=False)` drops it.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from mistral_serving.errors import RequestError


class _Answer(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    def wire(self, usage: bool = True) -> dict[str, Any]:
        """The JSON object to send (key order = field order)."""
        return self.model_dump(exclude=None if usage else {"usage"})


class Usage(_Answer):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class TopLogprob(_Answer):
    token: str
    logprob: float | None
    bytes: list[int]


class ChatTokenLogprob(_Answer):
    token: str
    logprob: float | None
    bytes: list[int]
    top_logprobs: list[TopLogprob]


class ChatLogprobs(_Answer):
    content: list[ChatTokenLogprob]
    refusal: None = None


class CompletionLogprobs(_Answer):
    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class AssistantMessage(_Answer):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(_Answer):
    index: int = 0
    message: AssistantMessage
    logprobs: ChatLogprobs | None
    finish_reason: str | None


class CompletionChoice(_Answer):
    index: int = 0
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: str | None


class ChatCompletion(_Answer):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class Completion(_Answer):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage


class RoleDelta(_Answer):
    role: Literal["assistant"] = "assistant"
    content: str = ""


class ContentDelta(_Answer):
    content: str


class EmptyDelta(_Answer):
    pass


class ChatChunkChoice(_Answer):
    index: int = 0
    delta: RoleDelta | ContentDelta | EmptyDelta
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None


class CompletionChunkChoice(_Answer):
    index: int = 0
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionChunk(_Answer):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class CompletionChunk(_Answer):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChunkChoice]
    usage: Usage | None = None


class ModelCard(_Answer):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str
    root: str
    max_model_len: int  # vLLM's: the engine's longest sequence


class ModelList(_Answer):
    object: Literal["list"] = "list"
    data: list[ModelCard]


# OpenAI's error `type` for each status we answer with.
OPENAI_ERROR_TYPES = {
    400: "invalid_request_error",
    404: "not_found_error",
    408: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    499: "invalid_request_error",
    500: "server_error",
    503: "service_unavailable",
}


class ErrorDetail(_Answer):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(_Answer):
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
