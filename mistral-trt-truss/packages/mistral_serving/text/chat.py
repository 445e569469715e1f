"""Chat messages -> prompt token ids. `encode_chat` is the one entry point; the
artifact's tokenizer says which encoding applies (`Tokenizer.chat_format`):

- "mistral" (the artifact ships tokenizer.model): exactly as Mistral's reference encoder
  does it, described below;
- "template" (any other checkpoint with a chat template, e.g. SmolLM2's ChatML): the
  checkpoint's own template, rendered by transformers with the assistant turn opened;
  message content is encoded as text, so content that spells a control token
  ("<|im_start|>system ...") cannot forge a turn (as on the Mistral path);
- "none": refused with a clear message (send a prompt instead).

Mistral-7B-Instruct-v0.2 uses `mistral-common`'s instruct tokenizer v1:
  <s>[INST] {system}\n\n{user} [/INST]{assistant}</s>[INST] {user} [/INST]
where every piece is encoded on its own by SentencePiece (so each `[INST]` after `</s>`
keeps its leading "▁" token, which a whole-string chat template loses). System messages
are gathered into one system prompt (non-empty ones, joined by a blank line) and put before the first
user message; consecutive messages of one role are joined by a blank line. The rules on
message order are mistral-common's own validator's (serving mode); the unit tests hold
this module to mistral-common token for token.

Tools (the chat route's `tools` and tool history) take the model's own format
(`Tokenizer.tool_format`, docs/tool-calling.md):

- "mistral": a tokenizer with tool tokens (v3: `[AVAILABLE_TOOLS]`, `[TOOL_CALLS]`,
  `[TOOL_RESULTS]`) is encoded as mistral-common's InstructTokenizerV3 does, whether or not
  the request has tools (its `[INST]` is a control token, the system prompt goes before the
  last user message);
- "hermes", "llama3_json": the checkpoint's template, given `tools=` and the history in
  OpenAI's shape (arguments as objects, as transformers documents);
- "fallback_json": the tools are described in a system turn that asks for
  `TOOL_CALLS: [...]`; past calls become assistant text in that form and results user
  turns starting `TOOL_RESULTS:`. Never a silent drop.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from mistral_serving.text.tokenizer import ChatTemplateRefused, Tokenizer
from mistral_serving.tools.tool_calls import Tool

JOIN = "\n\n"
Role = Literal["system", "user", "assistant"]

# Which role may follow which (mistral-common's validator, without tool messages).
_ALLOWED_NEXT: dict[str, set[str]] = {
    "system": {"system", "user", "assistant"},
    "user": {"system", "user", "assistant"},
    "assistant": {"user", "assistant"},
}


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Role
    content: str


class HistoryCall(BaseModel):
    """A call an earlier assistant turn made; `arguments` is the JSON text as sent."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    name: str
    arguments: str


class ToolCallsMessage(BaseModel):
    """An assistant turn that called tools (`content` is the text before the calls)."""

    model_config = ConfigDict(extra="forbid")

    role: Literal["assistant"] = "assistant"
    content: str = ""
    tool_calls: tuple[HistoryCall, ...]


class ToolResultMessage(BaseModel):
    """A `tool` message: one call's result."""

    model_config = ConfigDict(extra="forbid")

    role: Literal["tool"] = "tool"
    content: str
    tool_call_id: str
    name: str | None = None


Message = ChatMessage | ToolCallsMessage | ToolResultMessage

FALLBACK_CALLS = "TOOL_CALLS:"  # parsers.fallback_json.MARKER: what the fallback asks for
FALLBACK_RESULTS = "TOOL_RESULTS:"


def message_texts(messages: Sequence[Message]) -> Iterator[str]:
    """Every text of `messages` that reaches the prompt: contents, and the ids, names and
    arguments of earlier calls and of their results (what the length bound counts)."""
    for m in messages:
        yield m.content
        if isinstance(m, ToolCallsMessage):
            for call in m.tool_calls:
                yield call.id
                yield call.name
                yield call.arguments
        elif isinstance(m, ToolResultMessage):
            yield m.tool_call_id
            yield m.name or ""


class ChatFormatError(ValueError):
    """The conversation cannot be encoded; the message says why (a 400 for the client)."""


def validate_conversation(messages: Sequence[ChatMessage]) -> None:
    if not messages:
        raise ChatFormatError("messages must hold at least one message")
    if len(messages) == 1 and messages[0].role == "assistant":
        raise ChatFormatError("a conversation must start with a user or system message")
    if len(messages) > 1 and messages[-1].role == "assistant":
        raise ChatFormatError("the last message must not be from the assistant")
    for i, (prev, cur) in enumerate(zip(messages, messages[1:]), start=1):
        if cur.role not in _ALLOWED_NEXT[prev.role]:
            raise ChatFormatError(f"messages[{i}]: role {cur.role!r} cannot follow {prev.role!r}")
    for i, m in enumerate(messages):
        if m.role == "assistant" and not m.content:
            raise ChatFormatError(f"messages[{i}]: {m.role} message must have content")


def _turns(messages: Sequence[ChatMessage]) -> tuple[str | None, list[tuple[str, str]]]:
    """(system prompt, [(role, content)]) with runs of one role merged; a system message
    ends a run without joining it."""
    # Empty contents are dropped before joining, as mistral-common's normalizer does.
    systems = [m.content for m in messages if m.role == "system" and m.content]
    turns: list[tuple[str, list[str]]] = []
    previous: str | None = None
    for m in messages:
        if m.role != "system":
            if previous == m.role:
                turns[-1][1].append(m.content)
            else:
                turns.append((m.role, [m.content]))
        previous = m.role
    merged = [(role, JOIN.join(p for p in parts if p)) for role, parts in turns]
    if not merged or merged[0][0] != "user":
        merged.insert(0, ("user", ""))
    return (JOIN.join(systems) if systems else None), merged


def encode_chat(
    messages: Sequence[Message], tokenizer: Tokenizer, tools: Sequence[Tool] = ()
) -> list[int]:
    """Prompt token ids for a conversation that ends with a user (or system, or tool)
    turn, in the chat format of the artifact's tokenizer, with the offered `tools` in the
    model's tool format. Raises ChatFormatError (a 400)."""
    if tokenizer.chat_format == "mistral" and tokenizer.tool_format == "mistral":
        return encode_mistral_v3_chat(messages, tokenizer, tools)
    if tokenizer.chat_format == "template" and tokenizer.tool_format != "fallback_json":
        return encode_template_chat(messages, tokenizer, tools)
    plain = fallback_messages(messages, tools)
    if tokenizer.chat_format == "mistral":
        return encode_mistral_chat(plain, tokenizer)
    if tokenizer.chat_format == "template":
        return encode_template_chat(plain, tokenizer)
    raise ChatFormatError(
        "this model has no chat template, so it cannot take messages; send a prompt instead"
    )


def _arguments_value(text: str) -> Any:
    # mistral-common's normalizer: "" is "{}"; JSON is re-dumped; anything else stays text.
    if not text:
        return {}
    try:
        return json.loads(text)
    except ValueError:
        return text


def tool_definitions(tools: Sequence[Tool]) -> list[dict[str, Any]]:
    """The tools in OpenAI's (and mistral-common's `model_dump`) shape, `strict` left out."""
    return [
        {
            "type": "function",
            "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
        }
        for t in tools
    ]


def fallback_instructions(tools: Sequence[Tool]) -> str:
    """The system text of the fallback format: the tools, and how to call them."""
    example = json.dumps([{"name": tools[0].name, "arguments": {}}])
    return (
        "You can call these functions (each given with its JSON schema):\n"
        + json.dumps(tool_definitions(tools), ensure_ascii=False)
        + f"\nTo call functions, answer with only {FALLBACK_CALLS} and a JSON list of calls, "
        f"for example: {FALLBACK_CALLS} {example}\n"
        f"A call's result comes back in a message that starts with {FALLBACK_RESULTS}. "
        "Otherwise answer normally."
    )


def fallback_messages(messages: Sequence[Message], tools: Sequence[Tool]) -> list[ChatMessage]:
    """The conversation in plain system/user/assistant turns (the fallback format)."""
    out: list[ChatMessage] = []
    if tools:
        out.append(ChatMessage(role="system", content=fallback_instructions(tools)))
    for m in messages:
        if isinstance(m, ToolCallsMessage):
            calls = [
                {"name": c.name, "arguments": _arguments_value(c.arguments)} for c in m.tool_calls
            ]
            text = f"{FALLBACK_CALLS} {json.dumps(calls, ensure_ascii=False)}"
            out.append(
                ChatMessage(
                    role="assistant", content=(m.content + JOIN if m.content else "") + text
                )
            )
        elif isinstance(m, ToolResultMessage):
            result = {"call_id": m.tool_call_id, "content": m.content}
            out.append(
                ChatMessage(
                    role="user",
                    content=f"{FALLBACK_RESULTS} {json.dumps(result, ensure_ascii=False)}",
                )
            )
        else:
            out.append(m)
    if tools and len(out) > 1 and out[1].role == "system":
        # One system turn: templates that place a system message only first (SmolLM2's).
        out[:2] = [ChatMessage(role="system", content=out[0].content + JOIN + out[1].content)]
    return out


def _template_dict(m: Message) -> dict[str, Any]:
    if isinstance(m, ToolCallsMessage):
        return {
            "role": "assistant",
            "content": m.content,
            "tool_calls": [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": _arguments_value(c.arguments)},
                }
                for c in m.tool_calls
            ],
        }
    if isinstance(m, ToolResultMessage):
        d: dict[str, Any] = {"role": "tool", "content": m.content, "tool_call_id": m.tool_call_id}
        return d | ({"name": m.name} if m.name else {})
    return {"role": m.role, "content": m.content}


def encode_template_chat(
    messages: Sequence[Message], tokenizer: Tokenizer, tools: Sequence[Tool] = ()
) -> list[int]:
    """The checkpoint's own chat template with the assistant's turn opened. The order of
    roles is the template's business (it may refuse with its own message); the two rules
    here hold for every template this service can answer."""
    if not messages:
        raise ChatFormatError("messages must hold at least one message")
    if messages[-1].role == "assistant":
        raise ChatFormatError("the last message must not be from the assistant")
    from jinja2 import TemplateError

    try:
        return tokenizer.apply_chat_template(
            [_template_dict(m) for m in messages], tool_definitions(tools) or None
        )
    except TemplateError as exc:  # a template's raise_exception(...) lands here
        raise ChatFormatError(f"the model's chat template refused the messages: {exc}") from None
    except ChatTemplateRefused as exc:
        raise ChatFormatError(str(exc)) from None


def encode_mistral_chat(messages: Sequence[ChatMessage], tokenizer: Tokenizer) -> list[int]:
    """Mistral's instruct encoding (module docstring), token for token."""
    validate_conversation(messages)
    system, turns = _turns(messages)
    if tokenizer.bos_id is None:
        raise ChatFormatError("the tokenizer has no BOS token; this chat format needs one")
    ids = [tokenizer.bos_id]
    first_user = True
    for role, content in turns:
        if role == "user":
            if first_user and system:
                content = system + JOIN + content
            first_user = False
            ids += tokenizer.encode(f"[INST] {content} [/INST]")
        else:
            ids += tokenizer.encode(content) + [tokenizer.eos_id]
    return ids


# Which role may follow which with tool messages (mistral-common's validator).
_V3_NEXT: dict[str, set[str]] = {
    "system": {"system", "user", "assistant"},
    "user": {"system", "user", "assistant"},
    "assistant": {"user", "assistant", "tool"},
    "tool": {"user", "assistant", "tool"},
}
_V3_CALL_ID = re.compile(r"^[a-zA-Z0-9]{9}$")  # mistral-common's MistralRequestValidatorV3


def validate_v3_conversation(messages: Sequence[Message]) -> None:
    """mistral-common's serving-mode validator for v3 (MistralRequestValidatorV3)."""
    if not messages:
        raise ChatFormatError("messages must hold at least one message")
    if len(messages) == 1 and messages[0].role not in ("user", "system"):
        raise ChatFormatError("a conversation must start with a user or system message")
    if len(messages) > 1 and messages[-1].role not in ("user", "tool"):
        raise ChatFormatError("the last message must be from the user or a tool")
    for i, (prev, cur) in enumerate(zip(messages, messages[1:]), start=1):
        if cur.role not in _V3_NEXT[prev.role]:
            raise ChatFormatError(f"messages[{i}]: role {cur.role!r} cannot follow {prev.role!r}")
    expected = 0  # tool results still owed to the last assistant turn that called
    for i, m in enumerate(messages):
        if isinstance(m, ToolResultMessage):
            if not _V3_CALL_ID.match(m.tool_call_id):
                raise ChatFormatError(
                    f"messages[{i}].tool_call_id must be 9 letters or digits for this model"
                )
            expected -= 1
        elif m.role == "assistant":
            if expected:
                raise ChatFormatError(
                    f"messages[{i}]: the previous tool calls did not each get one tool result"
                )
            if isinstance(m, ToolCallsMessage):
                if m.content:
                    raise ChatFormatError(
                        f"messages[{i}]: this model's format takes content or tool_calls "
                        "in one assistant message, not both"
                    )
                for c in m.tool_calls:
                    if not _V3_CALL_ID.match(c.id):
                        raise ChatFormatError(
                            f"messages[{i}]: tool call id {c.id!r} must be 9 letters or digits "
                            "for this model"
                        )
                expected = len(m.tool_calls)
            elif not m.content:
                raise ChatFormatError(f"messages[{i}]: assistant message must have content")
    if expected:
        raise ChatFormatError("every tool call must be answered by one tool message")


def encode_mistral_v3_chat(
    messages: Sequence[Message], tokenizer: Tokenizer, tools: Sequence[Tool] = ()
) -> list[int]:
    """mistral-common's InstructRequestNormalizer then InstructTokenizerV3, token for token."""
    validate_v3_conversation(messages)
    if tokenizer.bos_id is None:
        raise ChatFormatError("the tokenizer has no BOS token; this chat format needs one")
    sp = tokenizer.special_ids
    systems = [m.content for m in messages if m.role == "system" and m.content]
    system = JOIN.join(systems) if systems else None
    # Runs of one role merged (a system message ends a run); tool results stay one each.
    turns: list[tuple[str, list[Message]]] = []
    previous: str | None = None
    for m in messages:
        if m.role in ("user", "assistant") and previous == m.role:
            turns[-1][1].append(m)
        elif m.role != "system":
            turns.append((m.role, [m]))
        previous = m.role
    if not turns or turns[0][0] != "user":
        turns.insert(0, ("user", []))
    last_user = max(i for i, (role, _) in enumerate(turns) if role == "user")
    ids = [tokenizer.bos_id]
    for i, (role, group) in enumerate(turns):
        if role == "user":
            content = JOIN.join(m.content for m in group if m.content)
            if i == last_user and tools:
                defs = json.dumps(tool_definitions(tools), ensure_ascii=False)
                ids += [sp["[AVAILABLE_TOOLS]"], *tokenizer.encode(defs), sp["[/AVAILABLE_TOOLS]"]]
            if i == last_user and system:
                content = system + JOIN + content
            ids += [sp["[INST]"], *tokenizer.encode(content), sp["[/INST]"]]
        elif role == "assistant":
            calls = [c for m in group if isinstance(m, ToolCallsMessage) for c in m.tool_calls]
            content = JOIN.join(m.content for m in group if m.content)
            if calls and content:
                raise ChatFormatError(
                    "this model's format takes content or tool_calls in one assistant turn, "
                    "not both"
                )
            if calls:
                dumped = [
                    {"name": c.name, "arguments": _arguments_value(c.arguments), "id": c.id}
                    for c in calls
                ]
                ids += [
                    sp["[TOOL_CALLS]"],
                    *tokenizer.encode(json.dumps(dumped, ensure_ascii=False)),
                ]
            else:
                ids += tokenizer.encode(content.rstrip(" "))
            ids.append(tokenizer.eos_id)
        else:
            (result,) = group
            assert isinstance(result, ToolResultMessage)
            body = {"content": _arguments_value(result.content), "call_id": result.tool_call_id}
            text = json.dumps(body, ensure_ascii=False)
            ids += [sp["[TOOL_RESULTS]"], *tokenizer.encode(text), sp["[/TOOL_RESULTS]"]]
    return ids
