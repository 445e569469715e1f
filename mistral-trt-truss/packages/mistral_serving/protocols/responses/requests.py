"""The Responses API's request body, read strictly: anything not declared is refused by
name, and fields this server cannot honour are accepted only at their default. `input`
items become the conversation's messages (`text/chat.py`'s types) with each bad item
named by its place (`input[2].call_id`)."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from mistral_serving.errors import RequestError
from mistral_serving.protocols.answers import CallLedger
from mistral_serving.protocols.fields import (
    MaxTokens,
    StrictModel,
    Temperature,
    text_of,
    validate_at,
)
from mistral_serving.protocols.openai.requests import MAX_TOOLS
from mistral_serving.structured.constraint import GuidedDecoding
from mistral_serving.text.chat import (
    ChatMessage,
    HistoryCall,
    Message,
    ToolCallsMessage,
    ToolResultMessage,
)

MAX_INPUT_ITEMS = 4096
MAX_METADATA_KEYS = 16  # OpenAI's bounds on `metadata`
ItemStatus = Literal["in_progress", "completed", "incomplete"]


class TextFormat(StrictModel):
    """`text.format`: plain text, any JSON object, or JSON following a schema."""

    type: Literal["text", "json_object", "json_schema"]
    name: str | None = Field(None, min_length=1, max_length=64)
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    description: str | None = None
    strict: bool | None = None

    @model_validator(mode="after")
    def _schema_when_asked(self) -> TextFormat:
        if (self.type == "json_schema") != (self.schema_ is not None and self.name is not None):
            raise ValueError("name and schema are required with type json_schema, and only then")
        return self

    def guided(self) -> GuidedDecoding | None:
        if self.type == "json_object":
            return GuidedDecoding("json_object")
        if self.type == "json_schema":
            return GuidedDecoding("json_schema", json.dumps(self.schema_))
        return None


class TextConfig(StrictModel):
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None  # accepted, no effect


class Reasoning(StrictModel):
    """Accepted only as "no reasoning": these models have no reasoning mode."""

    effort: Literal["none"] | None = None
    summary: None = None
    generate_summary: None = None


class StreamOptions(StrictModel):
    include_obfuscation: bool = False  # no obfuscation field is sent either way


class ResponsesRequest(StrictModel):
    model: str | None = Field(None, max_length=256)  # any name; the served name is returned
    input: Any  # a string or a list of items: read by `input_messages`, each item named
    instructions: str | None = None
    # Read (and refused by name) by tools.tool_calls before this model.
    tools: list[Any] | None = Field(None, max_length=MAX_TOOLS)
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    max_output_tokens: MaxTokens | None = None
    temperature: Temperature | None = None
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    stream: bool = False
    stream_options: StreamOptions | None = None
    store: bool = True
    previous_response_id: str | None = Field(None, min_length=1, max_length=256)
    metadata: dict[str, Annotated[str, Field(max_length=512)]] | None = None
    user: str | None = Field(None, max_length=256)
    prompt_cache_key: str | None = Field(None, max_length=256)  # accepted, no effect
    safety_identifier: str | None = Field(None, max_length=256)  # accepted, no effect
    service_tier: Literal["auto", "default"] | None = None
    truncation: Literal["disabled"] | None = None  # "auto" would drop input: refused
    include: list[str] | None = Field(None, max_length=0)  # no includable extras here
    reasoning: Reasoning | None = None
    background: Literal[False] | None = None
    top_logprobs: Literal[0] | None = None

    @field_validator("metadata")
    @classmethod
    def _metadata_bounds(cls, meta: dict[str, str] | None) -> dict[str, str] | None:
        if meta is not None and (len(meta) > MAX_METADATA_KEYS or any(len(k) > 64 for k in meta)):
            raise ValueError(f"at most {MAX_METADATA_KEYS} keys of at most 64 characters")
        return meta


# ---- input items ----


class InputText(StrictModel):
    type: Literal["input_text"]
    text: str


class OutputText(StrictModel):
    """An earlier answer's text, sent back as it was given."""

    type: Literal["output_text"]
    text: str
    annotations: list[Any] = Field(default_factory=list, max_length=0)
    logprobs: list[Any] | None = None


class Refusal(StrictModel):
    type: Literal["refusal"]
    refusal: str


_PARTS: dict[str, type[StrictModel]] = {
    "input_text": InputText,
    "output_text": OutputText,
    "refusal": Refusal,
}


class MessageItem(StrictModel):
    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: Any  # read by `text_of`
    id: str | None = Field(None, max_length=256)
    status: ItemStatus | None = None
    phase: Literal["commentary", "final_answer"] | None = None


class FunctionCallItem(StrictModel):
    type: Literal["function_call"]
    call_id: str = Field(min_length=1, max_length=256)
    name: str = Field(min_length=1, max_length=64)
    arguments: str  # JSON text, as the answer gave it
    id: str | None = Field(None, max_length=256)
    status: ItemStatus | None = None


class FunctionCallOutputItem(StrictModel):
    type: Literal["function_call_output"]
    call_id: str = Field(min_length=1, max_length=256)
    output: Any  # read by `text_of`
    id: str | None = Field(None, max_length=256)
    status: ItemStatus | None = None


_ITEMS: dict[str, type[StrictModel]] = {
    "message": MessageItem,
    "function_call": FunctionCallItem,
    "function_call_output": FunctionCallOutputItem,
}


def read_item(raw: Any, where: str) -> StrictModel:
    """One input item by its `type` (a message may leave it out)."""
    kind = raw.get("type", "message") if isinstance(raw, dict) else None
    model = _ITEMS.get(kind) if isinstance(kind, str) else None
    if model is None:
        raise RequestError(
            f"{where}.type: only message, function_call and function_call_output items "
            "are supported",
            param=f"{where}.type",
        )
    return validate_at(model, raw, where)


class _Conversation:
    """Messages as the items come: an assistant's text and the calls right after it are
    one turn (text, then calls)."""

    def __init__(self, ledger: CallLedger) -> None:
        self.ledger = ledger
        self.messages: list[Message] = []
        self._said: list[str] = []  # the assistant's text not yet in a message
        self._calls: list[HistoryCall] = []

    def add(self, item: StrictModel, where: str) -> None:
        """Add one item; `where` names it in refusals."""
        if isinstance(item, FunctionCallItem):
            self._calls.append(
                HistoryCall(id=item.call_id, name=item.name, arguments=item.arguments)
            )
            self.ledger.called(item.call_id)
            return
        assert isinstance(item, MessageItem | FunctionCallOutputItem)
        if isinstance(item, FunctionCallOutputItem):
            self.close_turn()
            self.ledger.answer(item.call_id, f"{where}.call_id")
            output = text_of(item.output, f"{where}.output", {"input_text": InputText})
            self.messages.append(ToolResultMessage(content=output, tool_call_id=item.call_id))
            return
        text = text_of(item.content, f"{where}.content", _PARTS)
        if item.role != "assistant" or self._calls:
            self.close_turn()  # an assistant's text after its calls is a turn of its own
        if item.role == "assistant":
            self._said.append(text)
        else:
            role = "user" if item.role == "user" else "system"
            self.messages.append(ChatMessage(role=role, content=text))

    def close_turn(self) -> None:
        said = "\n\n".join(t for t in self._said if t)
        if self._calls:
            calls = tuple(self._calls)
            self.messages.append(ToolCallsMessage(content=said, tool_calls=calls))
        elif said:  # an empty answer adds nothing a chat format could encode
            self.messages.append(ChatMessage(role="assistant", content=said))
        self._said, self._calls = [], []


def input_messages(value: Any, ledger: CallLedger) -> list[Message]:
    """`input` as messages; every function_call_output answers a call made earlier
    (`ledger` holds the calls of a continued conversation)."""
    if isinstance(value, str):
        return [ChatMessage(role="user", content=value)]
    if not isinstance(value, list) or not 1 <= len(value) <= MAX_INPUT_ITEMS:
        raise RequestError(
            f"input must be a string or a list of 1 to {MAX_INPUT_ITEMS} items", param="input"
        )
    conversation = _Conversation(ledger)
    for i, raw in enumerate(value):
        where = f"input[{i}]"
        conversation.add(read_item(raw, where), where)
    conversation.close_turn()
    return conversation.messages
