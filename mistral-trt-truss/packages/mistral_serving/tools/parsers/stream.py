"""Reading tool calls out of an answer as the text arrives, the same for every format.

The format comes from the loaded model (its tokenizer or chat template), never from a
setting; its parser (registry.parser_for) says where a call may start and reads the call
text. The stream splits the text into `content` (the text before the calls) and the
calls; markup never stays in `content`. Text whose call markup does not parse is handed
back whole as `content` (and the caller logs it): a broken call is never dropped.

One reader serves the stream and the whole answer (`parse_answer` feeds it the answer in
one piece), so a call's streamed `arguments` fragments, joined, are the non-streamed
`arguments` byte for byte (the canonical text of json_tokens).
"""

from __future__ import annotations

from dataclasses import dataclass

from mistral_serving.tools.parsers.base import CallText
from mistral_serving.tools.parsers.constrained import ConstrainedCalls
from mistral_serving.tools.parsers.registry import parser_for


@dataclass(frozen=True)
class ParsedCall:
    """One call; `arguments` is the JSON text sent as `function.arguments`."""

    name: str
    arguments: str


@dataclass(frozen=True)
class ParsedAnswer:
    content: str
    calls: tuple[ParsedCall, ...]
    broken: bool = False  # markup was there but did not parse

    @property
    def finish_reason(self) -> str | None:
        return "tool_calls" if self.calls else None


@dataclass(frozen=True)
class CallDelta:
    """A streamed piece of call `index`: `name` on its first piece only (never empty),
    then fragments of its `arguments`."""

    index: int
    name: str | None
    arguments: str


class CallStream:
    """Streamed text split into content that is safe to send now, and the calls read as
    they arrive once a call may have started. `parse_answer` is this same reader fed the
    whole answer, so the content sent, joined, equals its `content`, and each call's
    fragments, joined, its `arguments`. `constrained`: the answer is the tool-call
    grammar's JSON list of calls (constrained.py), a call from the first character."""

    def __init__(self, fmt: str, constrained: bool = False) -> None:
        self._parser = parser_for(fmt)  # refuses an unknown format, constrained or not
        self._sent = ""
        self._held = ""
        self._after: list[str] = []  # the text fed once a call has started (for `finish`)
        self._head = ""  # the text before the call's start (content if it parses)
        self._calls: CallText | None = ConstrainedCalls() if constrained else None

    def feed(self, text: str) -> tuple[str, list[CallDelta]]:
        """(the content that can go out now, "" if none; the call pieces read so far)."""
        if self._calls is not None:
            self._after.append(text)  # joined once, in `finish`
            self._calls.feed(text)
            return "", _drain(self._calls)
        self._held += text
        keep, start = self._parser.split(self._held, self._sent)
        if start is not None:
            self._head = self._sent + self._held[:start]
            self._calls = self._parser.call_text()
            self._calls.feed(self._held[start:])
        out, self._held = self._held[:keep], self._held[keep:]
        self._sent += out
        return out, _drain(self._calls) if self._calls is not None else []

    def finish(self) -> tuple[ParsedAnswer, str, list[CallDelta]]:
        """(the parse of the whole answer, the content still to send, the last pieces)."""
        whole = self._sent + self._held + "".join(self._after)
        reader = self._calls
        if reader is not None and reader.finish():
            calls = tuple(ParsedCall(c.name or "", "".join(c.arguments)) for c in reader.calls)
            answer = ParsedAnswer(self._head.rstrip(), calls)
            return answer, answer.content[len(self._sent) :], _drain(reader)
        broken = reader is not None and reader.broken
        return ParsedAnswer(whole, (), broken=broken), whole[len(self._sent) :], []


def _drain(reader: CallText) -> list[CallDelta]:
    """What went out of the calls since the last drain: a call's name once it is known,
    then its arguments written since."""
    out: list[CallDelta] = []
    if reader.broken:
        return out  # nothing more goes out of a text that stopped parsing
    for index, call in enumerate(reader.calls):
        if call.name is None:
            break  # arguments before the name wait for it
        if not call.announced:
            call.announced = True
            out.append(CallDelta(index, call.name, ""))
        fragment = "".join(call.arguments[call.sent :])
        call.sent = len(call.arguments)
        if fragment:
            out.append(CallDelta(index, None, fragment))
    return out


def parse_answer(text: str, fmt: str, constrained: bool = False) -> ParsedAnswer:
    """The parser of `fmt` (registry.FORMATS) on a finished answer; `constrained`: the
    answer was generated under the tool-call grammar (the JSON list of calls itself, no
    markup: structured.grammar.tool_call_schema)."""
    stream = CallStream(fmt, constrained)
    stream.feed(text)
    return stream.finish()[0]


def new_call_id(fmt: str) -> str:
    """A fresh call id in `fmt`'s style (ToolParser.new_call_id)."""
    return parser_for(fmt).new_call_id()
