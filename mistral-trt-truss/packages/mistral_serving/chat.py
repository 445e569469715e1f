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
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict

from mistral_serving.tokenizer import ChatTemplateRefused, Tokenizer

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


def encode_chat(messages: Sequence[ChatMessage], tokenizer: Tokenizer) -> list[int]:
    """Prompt token ids for a conversation that ends with a user (or system) turn, in
    the chat format of the artifact's tokenizer. Raises ChatFormatError (a 400)."""
    if tokenizer.chat_format == "mistral":
        return encode_mistral_chat(messages, tokenizer)
    if tokenizer.chat_format == "template":
        return encode_template_chat(messages, tokenizer)
    raise ChatFormatError(
        "this model has no chat template, so it cannot take messages; send a prompt instead"
    )


def encode_template_chat(messages: Sequence[ChatMessage], tokenizer: Tokenizer) -> list[int]:
    """The checkpoint's own chat template with the assistant's turn opened. The order of
    roles is the template's business (it may refuse with its own message); the two rules
    here hold for every template this service can answer."""
    if not messages:
        raise ChatFormatError("messages must hold at least one message")
    if messages[-1].role == "assistant":
        raise ChatFormatError("the last message must not be from the assistant")
    from jinja2 import TemplateError

    try:
        return tokenizer.apply_chat_template([m.model_dump() for m in messages])
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
