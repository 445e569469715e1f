"""OpenAI's request bodies for `/v1/chat/completions` and `/v1/completions`, read strictly:
anything not declared is refused by name."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag, model_validator

from mistral_serving.errors import RequestError
from mistral_serving.protocols.fields import (
    MAX_TOKENS_LIMIT,
    AdditivePenalty,
    MaxTokens,
    MinTokens,
    RepetitionPenalty,
    Seed,
    Stop,
    StrictModel,
    Temperature,
    TopK,
)
from mistral_serving.structured.constraint import GuidedDecoding
from mistral_serving.text.chat import (
    ChatMessage,
    HistoryCall,
    Message,
    ToolCallsMessage,
    ToolResultMessage,
)

MAX_TOP_LOGPROBS = 20
MAX_TOOLS = 128  # OpenAI's own limit on `tools`
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default on /v1/completions


class StreamOptions(StrictModel):
    include_usage: bool = False
    # vLLM's: with include_usage, every chunk carries the usage so far (guidellm asks).
    continuous_usage_stats: bool = False


class TextPart(StrictModel):
    type: Literal["text"]
    text: str


class FunctionCallIn(StrictModel):
    name: str = Field(max_length=64)
    arguments: str  # JSON text, as OpenAI sends it


class ToolCallIn(StrictModel):
    id: str = Field(min_length=1, max_length=256)
    type: Literal["function"] = "function"
    function: FunctionCallIn


class OpenAIMessage(StrictModel):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = Field(None, max_length=256)  # accepted; Mistral's format has no names
    tool_calls: list[ToolCallIn] | None = Field(None, max_length=128)
    tool_call_id: str | None = Field(None, max_length=256)

    def to_chat(self, where: str) -> Message:
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise RequestError(f"{where}.content is required", param=f"{where}.content")
        content = (
            self.content
            if isinstance(self.content, str) or self.content is None
            else "\n\n".join(p.text for p in self.content)
        ) or ""
        if self.tool_call_id is not None and self.role != "tool":
            raise RequestError(
                f"{where}.tool_call_id is only for tool messages", param=f"{where}.tool_call_id"
            )
        if self.role == "tool":
            assert self.tool_call_id is not None  # check_history has made sure
            return ToolResultMessage(content=content, tool_call_id=self.tool_call_id)
        if self.tool_calls:
            calls = tuple(
                HistoryCall(id=c.id, name=c.function.name, arguments=c.function.arguments)
                for c in self.tool_calls
            )
            return ToolCallsMessage(content=content, tool_calls=calls)
        role = "system" if self.role == "developer" else self.role
        return ChatMessage(role=role, content=content)


class JsonSchemaFormat(StrictModel):
    name: str = Field(max_length=256)
    schema_: dict[str, Any] = Field(default_factory=dict, alias="schema")
    description: str | None = None
    strict: bool | None = None


class ResponseFormat(StrictModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_when_asked(self) -> ResponseFormat:
        if (self.type == "json_schema") != (self.json_schema is not None):
            raise ValueError("json_schema is required with type json_schema, and only then")
        return self

    def guided(self) -> GuidedDecoding | None:
        if self.type == "json_object":
            return GuidedDecoding("json_object")
        if self.type == "json_schema" and self.json_schema is not None:
            return GuidedDecoding("json_schema", json.dumps(self.json_schema.schema_))
        return None


class CommonRequest(StrictModel):
    """Fields both routes share; anything not declared is refused by name."""

    model: str | None = Field(None, max_length=256)  # any name; the served name is returned
    max_tokens: MaxTokens | None = None
    temperature: Temperature = 1.0
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    stop: Stop | None = None
    seed: Seed | None = None
    presence_penalty: AdditivePenalty = 0.0
    frequency_penalty: AdditivePenalty = 0.0
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = Field(None, max_length=256)
    n: Literal[1] = 1
    response_format: ResponseFormat | None = None
    # vLLM's extensions.
    top_k: TopK = 0
    repetition_penalty: RepetitionPenalty = 1.0
    ignore_eos: bool = False
    min_tokens: MinTokens = 0


class ChatCompletionRequest(CommonRequest):
    messages: list[OpenAIMessage] = Field(min_length=1, max_length=4096)
    max_completion_tokens: MaxTokens | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    # Read (and refused by name) by tool_calls.parse_tool_request before this model.
    tools: list[Any] | None = Field(None, max_length=MAX_TOOLS)
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None


# 0 is allowed on completions with echo: the prompt's logprobs, nothing generated.
CompletionMaxTokens = Annotated[int, Field(ge=0, le=MAX_TOKENS_LIMIT)]


def _prompt_kind(value: Any) -> str:
    """Which of the prompt's forms to check `value` against, from its first element: a
    plain union tries each form in turn, and each failed form costs a check of every
    element (most of a long token-id prompt's parse)."""
    if not isinstance(value, list):
        return "text"  # a string, or refused as not one
    first = value[0] if value else 0
    if isinstance(first, list):
        return "batch"
    return "texts" if isinstance(first, str) else "ids"


# `batch`: a batch of token-id prompts (lm-evaluation-harness sends one).
CompletionPrompt = Annotated[
    Annotated[str, Tag("text")]
    | Annotated[list[str], Tag("texts")]
    | Annotated[list[int], Tag("ids")]
    | Annotated[list[list[int]], Tag("batch")],
    Discriminator(_prompt_kind),
]


class CompletionRequest(CommonRequest):
    prompt: CompletionPrompt
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    best_of: Literal[1] | None = None
    suffix: None = None
    max_tokens: CompletionMaxTokens | None = COMPLETIONS_DEFAULT_MAX_TOKENS


def completion_prompt(
    prompt: str | list[str] | list[int] | list[list[int]],
) -> tuple[str | None, tuple[int, ...] | None]:
    # Validated as one of its forms (CompletionPrompt): the first element tells which.
    if isinstance(prompt, str):
        return prompt, None
    if prompt and isinstance(prompt[0], int):
        return None, tuple(prompt)  # token ids, used as given (range-checked later)
    if len(prompt) == 1 and isinstance(prompt[0], list) and prompt[0]:
        return None, tuple(prompt[0])  # a batch of one token-id prompt
    if len(prompt) == 1 and isinstance(prompt[0], str):
        return prompt[0], None
    raise RequestError(
        "prompt must be one string or one list of token ids (batches are not supported)",
        param="prompt",
    )
