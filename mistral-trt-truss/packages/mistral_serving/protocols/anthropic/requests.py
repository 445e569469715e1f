"""Anthropic's Messages request body, read strictly: anything not declared is refused by
name; `messages` become the conversation's messages (`text/chat.py`'s types) with each bad
block named by its place (`messages[2].content[0].tool_use_id`)."""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import Field, model_validator

from mistral_serving.errors import RequestError
from mistral_serving.protocols.answers import CallLedger
from mistral_serving.protocols.fields import MaxTokens, Stop, StrictModel, text_of, validate_at
from mistral_serving.protocols.openai.requests import MAX_TOOLS
from mistral_serving.text.chat import (
    ChatMessage,
    HistoryCall,
    Message,
    ToolCallsMessage,
    ToolResultMessage,
)
from mistral_serving.tools.tool_calls import (
    ANTHROPIC_TOOLS,
    ToolRequest,
    parse_tools,
)

MAX_MESSAGES = 4096
MAX_BLOCKS = 4096


class CacheControl(StrictModel):
    type: Literal["ephemeral"]
    ttl: Literal["5m", "1h"] | None = None


class TextBlock(StrictModel):
    type: Literal["text"]
    text: str
    cache_control: CacheControl | None = None  # accepted, no effect
    citations: None = None


class ToolUseBlock(StrictModel):
    type: Literal["tool_use"]
    id: str = Field(min_length=1, max_length=256)
    name: str = Field(min_length=1, max_length=64)
    input: dict[str, Any]
    cache_control: CacheControl | None = None


class ToolResultBlock(StrictModel):
    type: Literal["tool_result"]
    tool_use_id: str = Field(min_length=1, max_length=256)
    content: Any = ""  # read by `text_of`
    is_error: bool = False
    cache_control: CacheControl | None = None


_BLOCKS: dict[str, type[StrictModel]] = {
    "text": TextBlock,
    "tool_use": ToolUseBlock,
    "tool_result": ToolResultBlock,
}


class MessageParam(StrictModel):
    role: Literal["user", "assistant"]
    content: Any  # a string or a list of blocks, each read by its place


class ToolChoice(StrictModel):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = Field(None, min_length=1, max_length=64)
    disable_parallel_tool_use: bool = False

    @model_validator(mode="after")
    def _name_for_tool(self) -> ToolChoice:
        if (self.type == "tool") != (self.name is not None):
            raise ValueError("name is required with type tool, and only then")
        return self


class ThinkingDisabled(StrictModel):
    type: Literal["disabled"]  # these models have no extended thinking


class Metadata(StrictModel):
    user_id: str | None = Field(None, max_length=256)


class CountTokensRequest(StrictModel):
    """`POST /v1/messages/count_tokens`: what decides the prompt, nothing about sampling."""

    model: str = Field(min_length=1, max_length=256)  # any name; the served name is returned
    messages: list[Any] = Field(min_length=1, max_length=MAX_MESSAGES)
    system: Any = None  # a string or a list of text blocks: read by `system_messages`
    # Read (and refused by name) by `tool_request` before this model.
    tools: list[Any] | None = Field(None, max_length=MAX_TOOLS)
    tool_choice: Any = None
    thinking: ThinkingDisabled | None = None


class MessagesRequest(CountTokensRequest):
    max_tokens: MaxTokens
    stop_sequences: Stop | None = None
    temperature: float = Field(1.0, ge=0.0, le=1.0)  # Anthropic's range
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0, le=1 << 20)
    stream: bool = False
    metadata: Metadata | None = None
    service_tier: Literal["auto", "standard_only"] | None = None


def tool_request(body: dict[str, Any]) -> ToolRequest | None:
    """`tools` and `tool_choice` in Anthropic's words, as the one tool request every route
    makes: `any` is OpenAI's required, `tool` a named function."""
    tools = parse_tools(body.get("tools"), ANTHROPIC_TOOLS)
    raw = body.get("tool_choice")
    if raw is None:
        return ToolRequest(tools, "auto", None, True) if tools else None
    choice = validate_at(ToolChoice, raw, "tool_choice")
    assert isinstance(choice, ToolChoice)
    if not tools and choice.type != "none":
        raise RequestError(f"tool_choice {choice.type!r} needs tools", param="tool_choice")
    if choice.name is not None and choice.name not in {t.name for t in tools}:
        raise RequestError(
            f"tool_choice names {choice.name!r}, which is not in tools", param="tool_choice.name"
        )
    kind = {"auto": "auto", "any": "required", "tool": "named", "none": "none"}[choice.type]
    return ToolRequest(tools, kind, choice.name, not choice.disable_parallel_tool_use)


_TEXT = {"text": TextBlock}


def system_messages(system: Any) -> list[Message]:
    text = "" if system is None else text_of(system, "system", _TEXT)
    return [ChatMessage(role="system", content=text)] if text else []


def read_block(raw: Any, where: str) -> StrictModel:
    kind = raw.get("type") if isinstance(raw, dict) else None
    model = _BLOCKS.get(kind) if isinstance(kind, str) else None
    if model is None:
        raise RequestError(
            f"{where}.type: only text, tool_use and tool_result blocks are supported",
            param=f"{where}.type",
        )
    return validate_at(model, raw, where)


def conversation(raw_messages: list[Any], ledger: CallLedger) -> list[Message]:
    """`messages` as the chat encoder's messages: a user turn's tool results (which come
    first) answer the calls made before them; an assistant turn's text and calls are one
    turn."""
    out: list[Message] = []
    for i, raw in enumerate(raw_messages):
        where = f"messages[{i}]"
        message = validate_at(MessageParam, raw, where)
        assert isinstance(message, MessageParam)
        if isinstance(message.content, str):
            out.append(ChatMessage(role=message.role, content=message.content))
            continue
        if not isinstance(message.content, list) or len(message.content) > MAX_BLOCKS:
            raise RequestError(
                f"{where}.content must be a string or a list of at most {MAX_BLOCKS} blocks",
                param=f"{where}.content",
            )
        blocks = [read_block(b, f"{where}.content[{j}]") for j, b in enumerate(message.content)]
        if message.role == "user":
            out += _user_turn(blocks, where, ledger)
        else:
            out += _assistant_turn(blocks, where, ledger)
    return out


def _user_turn(blocks: list[StrictModel], where: str, ledger: CallLedger) -> list[Message]:
    out: list[Message] = []
    texts: list[str] = []
    for j, block in enumerate(blocks):
        at = f"{where}.content[{j}]"
        if isinstance(block, ToolResultBlock):
            if texts:
                raise RequestError(
                    f"{at}: tool_result blocks must come before any text in a user message",
                    param=f"{at}.type",
                )
            ledger.answer(block.tool_use_id, f"{at}.tool_use_id")
            text = text_of(block.content, f"{at}.content", _TEXT)
            text = f"Error: {text}" if block.is_error else text
            out.append(ToolResultMessage(content=text, tool_call_id=block.tool_use_id))
        elif isinstance(block, TextBlock):
            texts.append(block.text)
        else:
            raise RequestError(f"{at}: tool_use blocks are the assistant's", param=f"{at}.type")
    if texts:
        out.append(ChatMessage(role="user", content="\n\n".join(texts)))
    return out


def _assistant_turn(blocks: list[StrictModel], where: str, ledger: CallLedger) -> list[Message]:
    texts: list[str] = []
    calls: list[HistoryCall] = []
    for j, block in enumerate(blocks):
        if isinstance(block, ToolUseBlock):
            arguments = json.dumps(block.input, ensure_ascii=False)
            calls.append(HistoryCall(id=block.id, name=block.name, arguments=arguments))
            ledger.called(block.id)
        elif isinstance(block, TextBlock):
            texts.append(block.text)
        else:
            at = f"{where}.content[{j}]"
            raise RequestError(f"{at}: tool_result blocks are the user's", param=f"{at}.type")
    said = "\n\n".join(t for t in texts if t)
    if calls:
        return [ToolCallsMessage(content=said, tool_calls=tuple(calls))]
    return [ChatMessage(role="assistant", content=said)] if said else []
