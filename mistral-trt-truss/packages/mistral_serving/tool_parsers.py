"""Reading tool calls out of a finished answer, one parser per model format.

The format comes from the loaded model (its tokenizer or chat template), never from a
setting. Each parser splits the text into `content` (the text before the calls) and the
calls; markup never stays in `content`. Text whose call markup does not parse is handed
back whole as `content` (and the caller logs it): a broken call is never dropped.
"""

from __future__ import annotations

import json
import re
import secrets
import string
from dataclasses import dataclass
from typing import Any

FORMATS = ("mistral", "hermes", "llama3_json", "fallback_json")


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


def _call(obj: Any, args_key: str = "arguments") -> ParsedCall | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    args = obj.get(args_key, obj.get("arguments", {}))
    if isinstance(args, str):  # some models send the arguments already as JSON text
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if not isinstance(args, dict):
        return None
    # One canonical text: the streamed fragments and the final answer use this same one.
    return ParsedCall(obj["name"], json.dumps(args, ensure_ascii=False))


def _calls_from_json(text: str, args_key: str = "arguments") -> tuple[ParsedCall, ...] | None:
    try:
        value = json.loads(text)
    except ValueError:
        return None
    items = value if isinstance(value, list) else [value]
    calls = [_call(v, args_key) for v in items]
    if not calls or any(c is None for c in calls):
        return None
    return tuple(c for c in calls if c is not None)


def _marker_split(text: str, marker: str) -> ParsedAnswer:
    # Mistral v3+: content, then `[TOOL_CALLS]` and a JSON list of calls.
    head, sep, tail = text.partition(marker)
    if not sep:
        return ParsedAnswer(text, ())
    calls = _calls_from_json(tail.strip())
    if calls is None:
        return ParsedAnswer(text, (), broken=True)
    return ParsedAnswer(head.rstrip(), calls)


_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


def parse_hermes(text: str) -> ParsedAnswer:
    """ChatML/Hermes templates: `<tool_call>{json}</tool_call>`, one block per call."""
    start = text.find("<tool_call>")
    if start < 0:
        return ParsedAnswer(text, ())
    rest = text[start:]
    blocks = _HERMES.findall(rest)
    leftover = _HERMES.sub("", rest).strip()
    calls: list[ParsedCall] = []
    for block in blocks:
        one = _calls_from_json(block)
        if one is None or len(one) != 1:
            return ParsedAnswer(text, (), broken=True)
        calls.extend(one)
    if not calls or leftover:
        return ParsedAnswer(text, (), broken=True)
    return ParsedAnswer(text[:start].rstrip(), tuple(calls))


def parse_llama3_json(text: str) -> ParsedAnswer:
    """Llama 3.1's JSON tool calling: the whole answer is `{"name":..,"parameters":{..}}`
    (optionally after `<|python_tag|>`), calls separated by `;`."""
    body = text.strip().removeprefix("<|python_tag|>").strip()
    if not body.startswith("{"):
        return ParsedAnswer(text, ())
    calls: list[ParsedCall] = []
    decoder = json.JSONDecoder()
    pos = 0
    while pos < len(body):
        try:
            value, end = decoder.raw_decode(body, pos)
        except ValueError:
            return ParsedAnswer(text, (), broken=True)
        call = _call(value, "parameters")
        if call is None:
            return ParsedAnswer(text, (), broken=True)
        calls.append(call)
        pos = end
        while pos < len(body) and body[pos] in " \n\t;":
            pos += 1
    return ParsedAnswer("", tuple(calls))


FALLBACK_MARKER = "TOOL_CALLS:"


def parse_constrained(text: str) -> ParsedAnswer:
    """An answer generated under the tool-call grammar (`required` or a named function):
    the JSON list of calls itself, no markup (grammar.tool_call_schema)."""
    calls = _calls_from_json(text.strip())
    if calls is None:  # cut by max_tokens, say: the text is handed back
        return ParsedAnswer(text, (), broken=True)
    return ParsedAnswer("", calls)


def parse_answer(text: str, fmt: str, constrained: bool = False) -> ParsedAnswer:
    """The parser of `fmt` (one of FORMATS) on a finished answer; `constrained`: the
    answer was generated under the tool-call grammar."""
    if constrained:
        return parse_constrained(text)
    if fmt == "mistral":
        return _marker_split(text, "[TOOL_CALLS]")
    if fmt == "hermes":
        return parse_hermes(text)
    if fmt == "llama3_json":
        return parse_llama3_json(text)
    if fmt == "fallback_json":
        # Formats with no tool tokens: the system turn asks for `TOOL_CALLS: [..]`.
        return _marker_split(text, FALLBACK_MARKER)
    raise ValueError(f"unknown tool format {fmt!r}")


# Where a call may start, per format (llama3_json: the answer itself, see CallStream).
MARKERS = {"mistral": "[TOOL_CALLS]", "hermes": "<tool_call>", "fallback_json": FALLBACK_MARKER}
_LLAMA_STARTS = ("{", "<|python_tag|>")
_ALNUM = string.ascii_letters + string.digits


def new_call_id(fmt: str) -> str:
    """A fresh call id: 9 letters and digits for Mistral's format (its validator demands
    them when the id comes back in the history), OpenAI's `call_...` shape otherwise."""
    if fmt == "mistral":
        return "".join(secrets.choice(_ALNUM) for _ in range(9))
    return "call_" + "".join(secrets.choice(_ALNUM) for _ in range(24))


class CallStream:
    """Streamed text split into content that is safe to send now and text held back
    because a call may have started there. `finish` parses the whole answer with the same
    parser as a non-streamed one, so the content sent, joined, equals its `content`."""

    def __init__(self, fmt: str, constrained: bool = False) -> None:
        if fmt not in FORMATS:
            raise ValueError(f"unknown tool format {fmt!r}")
        self._fmt = fmt
        self._constrained = constrained
        self._sent = ""
        self._held = ""
        self._holding = constrained  # past a call's start: nothing more is sent as content

    def feed(self, text: str) -> str:
        """The part of what has arrived that can go out as content now ("" if none)."""
        self._held += text
        if self._holding:
            return ""
        keep = self._hold_from(self._held)
        out, self._held = self._held[:keep], self._held[keep:]
        self._sent += out
        return out

    def _hold_from(self, buf: str) -> int:
        if self._fmt == "llama3_json":
            # A Llama-3.1 call is the whole answer: hold while the answer may begin one.
            if not self._sent:
                lead = buf.lstrip()
                if any(s.startswith(lead) or lead.startswith(s) for s in _LLAMA_STARTS):
                    self._holding = bool(lead) and any(lead.startswith(s) for s in _LLAMA_STARTS)
                    return 0
            return len(buf)
        marker = MARKERS[self._fmt]
        at = buf.find(marker)
        if at >= 0:
            self._holding = True
            end = at
        else:
            # A marker's beginning at the end may be completed by the next text.
            end = len(buf)
            for n in range(min(len(marker) - 1, len(buf)), 0, -1):
                if buf.endswith(marker[:n]):
                    end = len(buf) - n
                    break
        # Whitespace before a call is not content (the parsers strip it): hold it too.
        return len(buf[:end].rstrip())

    def finish(self) -> tuple[ParsedAnswer, str]:
        """(the parse of the whole answer, the content still to send)."""
        whole = self._sent + self._held
        answer = parse_answer(whole, self._fmt, self._constrained)
        rest = answer.content[len(self._sent) :] if answer.calls else whole[len(self._sent) :]
        return answer, rest
