"""What the chat-shaped wire formats (OpenAI chat, the Responses API, Anthropic's Messages)
share between a request's tools and its answer, so that each holds only its own shapes.

- request side: `constrain` (tool_choice none drops the tools; required or a named
  function puts the tool-call grammar on the output), `CallLedger` (every tool result
  answers an earlier call of the conversation);
- answer side: `read_answer` (a whole answer read by the model's tool parser) and
  `BlockStream` (a streamed answer as a sequence of output blocks: a text block, then one
  block per call, each opened, filled and closed), both over the same reader
  (`tools/parsers/stream.py`), so a stream's blocks joined are the whole answer's.

The Responses API and Anthropic's Messages answer in blocks (output items, content
blocks); each renders `BlockEvent`s in its own events. OpenAI's chat stream has no
blocks (deltas of one message) and reads calls through `CallStream` directly.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Literal

from mistral_serving.errors import RequestError
from mistral_serving.structured.constraint import GuidedDecoding
from mistral_serving.structured.grammar import tool_call_grammar
from mistral_serving.tools.parsers.stream import (
    CallDelta,
    CallStream,
    ParsedAnswer,
    new_call_id,
    parse_answer,
)
from mistral_serving.tools.tool_calls import ToolRequest

log = logging.getLogger(__name__)


# ---- request side ----


def constrain(
    tools: ToolRequest | None, guided: GuidedDecoding | None, format_param: str
) -> tuple[ToolRequest | None, GuidedDecoding | None]:
    """(the tools in play, the output's grammar). `tool_choice` none: the tools stay out of
    the prompt and the answer is text. Required or a named function: the answer is calls
    under the tool-call grammar, which an output format (`format_param`) cannot share."""
    if tools is None or tools.choice == "none" or not tools.tools:
        return None, guided
    if not tools.constrained:
        return tools, guided
    if guided is not None:
        raise RequestError(
            f"{format_param} cannot be combined with a required or named tool choice: "
            "the answer is the calls",
            param=format_param,
        )
    return tools, tool_call_grammar(tools)


class CallLedger:
    """The calls a conversation has made so far: a tool result must answer one of them."""

    def __init__(self) -> None:
        self._ids: set[str] = set()

    def called(self, call_id: str) -> None:
        self._ids.add(call_id)

    def answer(self, call_id: str, param: str) -> None:
        if call_id not in self._ids:
            raise RequestError(f"{param} {call_id!r} answers no earlier tool call", param=param)


# ---- answer side ----


def read_answer(
    text: str, tools: ToolRequest | None, tool_format: str, answer_id: str
) -> ParsedAnswer:
    """A whole answer: its content and calls (no calls without tools in play)."""
    if tools is None:
        return ParsedAnswer(text, ())
    answer = parse_answer(text, tool_format, tools.constrained)
    log_broken(answer, answer_id)
    return answer


def log_broken(answer: ParsedAnswer, answer_id: str) -> None:
    if answer.broken:
        log.warning(
            "answer %s: tool-call markup did not parse; the answer is delivered as text",
            answer_id,
        )


def calls_finish(reason: str) -> str:
    """An answer that ended in calls says so; a cut one (abort, timeout) keeps its reason."""
    return "tool_calls" if reason in ("stop", "length") else reason


BlockKind = Literal["text_start", "text_delta", "text_end", "call_start", "call_delta", "call_end"]


@dataclass(frozen=True)
class BlockEvent:
    """One step of a block answer. `block`: the block's position in the answer. `text`: a
    text delta, a call's arguments fragment, or (on an end) the block's whole text or
    arguments. A call's start carries its `name` and `call_id`."""

    kind: BlockKind
    block: int
    text: str = ""
    name: str = ""
    call_id: str = ""


@dataclass
class _Open:
    kind: Literal["text", "call"]
    block: int
    parts: list[str] = field(default_factory=list)


class BlockStream:
    """A streamed answer as blocks: text goes to a text block as it is safe to send; each
    call (read by the model's parser as it arrives) is a block of its own, opened once its
    name is known, filled with its arguments' fragments, closed when the next block opens
    or the answer ends. A whole answer read by `read_answer` has the same blocks (text
    first, if any, then the calls) with the same texts, except when call markup turned out
    not to parse: the stream then sent the call's beginning, and the text follows it in a
    block of its own, while the whole answer is that text alone."""

    def __init__(self, tools: ToolRequest | None, tool_format: str, answer_id: str) -> None:
        self._calls = CallStream(tool_format, tools.constrained) if tools is not None else None
        self._format = tool_format
        self._answer_id = answer_id
        self._text: list[str] = []  # without tools: the whole answer
        self._open: _Open | None = None
        self.blocks = 0  # opened so far
        self.call_ids: list[str] = []  # one per call, in order, made as each opens

    def feed(self, text: str) -> list[BlockEvent]:
        if self._calls is None:
            self._text.append(text)
            return self._text_events(text)
        content, deltas = self._calls.feed(text)
        return self._text_events(content) + self._call_events(deltas)

    def finish(self) -> tuple[ParsedAnswer, list[BlockEvent]]:
        """The answer read whole, and the stream's last events (every block closed; an
        answer of neither text nor calls is one empty text block)."""
        if self._calls is None:
            parsed, events = ParsedAnswer("".join(self._text), ()), []
        else:
            parsed, rest, deltas = self._calls.finish()
            log_broken(parsed, self._answer_id)
            events = self._text_events(rest) + self._call_events(deltas)
        if self.blocks == 0 and not parsed.calls:
            events += self._opening("text")
        return parsed, events + self._close()

    def _text_events(self, text: str) -> list[BlockEvent]:
        if not text:
            return []
        events = [] if self._open and self._open.kind == "text" else self._opening("text")
        assert self._open is not None
        self._open.parts.append(text)
        return [*events, BlockEvent("text_delta", self._open.block, text)]

    def _call_events(self, deltas: list[CallDelta]) -> list[BlockEvent]:
        events: list[BlockEvent] = []
        for d in deltas:
            if d.name is not None:
                self.call_ids.append(new_call_id(self._format))
                events += self._opening("call")
                assert self._open is not None
                start = BlockEvent("call_start", self._open.block, "", d.name, self.call_ids[-1])
                events.append(start)
            elif d.arguments and self._open is not None and self._open.kind == "call":
                self._open.parts.append(d.arguments)
                events.append(BlockEvent("call_delta", self._open.block, d.arguments))
        return events

    def _opening(self, kind: Literal["text", "call"]) -> list[BlockEvent]:
        events = self._close()
        self._open = _Open(kind, self.blocks)
        self.blocks += 1
        if kind == "text":  # a call's start carries its name: the caller adds it
            events.append(BlockEvent("text_start", self._open.block))
        return events

    def _close(self) -> list[BlockEvent]:
        if self._open is None:
            return []
        done, self._open = self._open, None
        kind: BlockKind = "text_end" if done.kind == "text" else "call_end"
        return [BlockEvent(kind, done.block, "".join(done.parts))]
