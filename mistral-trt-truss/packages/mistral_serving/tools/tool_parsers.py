"""Reading tool calls out of an answer, one parser per model format, as the text arrives.

The format comes from the loaded model (its tokenizer or chat template), never from a
setting. Each parser splits the text into `content` (the text before the calls) and the
calls; markup never stays in `content`. Text whose call markup does not parse is handed
back whole as `content` (and the caller logs it): a broken call is never dropped.

One reader serves the stream and the whole answer (`parse_answer` feeds it the answer in
one piece), so a call's streamed `arguments` fragments, joined, are the non-streamed
`arguments` byte for byte. The canonical text is the model's JSON re-written token by
token (`_Value`): `json.dumps`'s separators, strings as `json.dumps(..., ensure_ascii=False)`
writes them (a lone surrogate escaped), numbers as `json.dumps` writes Python's reading of
them, keys in the model's order. Without repeated keys that is
`json.dumps(json.loads(text), ensure_ascii=False)`; a repeated key is kept as written
(a JSON reader takes its last value, as `json.loads` did).
"""

from __future__ import annotations

import json
import math
import re
import secrets
import string
from collections.abc import Callable
from dataclasses import dataclass

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


@dataclass(frozen=True)
class CallDelta:
    """A streamed piece of call `index`: `name` on its first piece only (never empty),
    then fragments of its `arguments`."""

    index: int
    name: str | None
    arguments: str


class _Broken(Exception):
    """The text cannot be calls of this format."""


# ---- JSON, token by token ---------------------------------------------------------------

_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_NUMBER_CHARS = frozenset("0123456789+-.eE")
_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
_HEX = frozenset("0123456789abcdefABCDEF")
_LITERALS = ("true", "false", "null")
_SURROGATE = re.compile("[\ud800-\udfff]")

Sink = Callable[[str, str], None]  # (kind, text): a token


def _number(token: str) -> str:
    """`json.dumps` of Python's reading of a JSON number (strict JSON: finite only)."""
    if not _NUMBER.fullmatch(token):
        raise _Broken
    try:
        value: int | float = float(token) if any(c in token for c in ".eE") else int(token)
    except ValueError:  # an int too long for Python's conversion limit
        raise _Broken from None
    if isinstance(value, float) and not math.isfinite(value):
        raise _Broken
    return json.dumps(value)


def _escape(piece: str) -> str:
    """A decoded piece of a string as `json.dumps` writes it inside the quotes (escapes
    are per character, so pieces escaped apart join to the whole string escaped); a lone
    surrogate is written as its escape, so the text stays valid UTF-8."""
    text = json.dumps(piece, ensure_ascii=False)[1:-1]
    return _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


class _Lexer:
    """Strict JSON tokens out of text that arrives in pieces. Tokens: the punctuation
    itself, `num` (canonical text), `lit`, and a string as `str`, `chars` (decoded pieces,
    as they arrive), `end`. `extra` characters are tokens of their own (llama's `;`)."""

    def __init__(self, sink: Sink, extra: str = "") -> None:
        self._sink = sink
        self._punct = "{}[]:," + extra
        self._mode = ""  # "" between tokens | num | lit | str | esc | hex
        self._buf = ""  # a number's or literal's text, or an escape's hex digits
        self._piece: list[str] = []  # a string's decoded characters not yet sent
        self._high = ""  # a \u high surrogate waiting for its low half

    def feed(self, text: str) -> None:
        for c in text:
            self._char(c)
        if self._piece:
            self._sink("chars", "".join(self._piece))
            self._piece.clear()

    def end(self) -> None:
        """The text is over: a number or literal at the very end is complete."""
        if self._mode in ("num", "lit"):
            self._word()
        if self._mode:
            raise _Broken  # inside a string

    def _char(self, c: str) -> None:
        mode = self._mode
        if mode == "str":
            if c == '"':
                self._decoded("")
                if self._piece:
                    self._sink("chars", "".join(self._piece))
                    self._piece.clear()
                self._mode = ""
                self._sink("end", "")
            elif c == "\\":
                self._mode = "esc"
            elif c < " ":
                raise _Broken  # JSON strings hold no raw control characters
            else:
                self._decoded(c)
        elif mode == "esc":
            if c == "u":
                self._mode, self._buf = "hex", ""
            elif c in _ESCAPES:
                self._mode = "str"
                self._decoded(_ESCAPES[c])
            else:
                raise _Broken
        elif mode == "hex":
            if c not in _HEX:
                raise _Broken
            self._buf += c
            if len(self._buf) == 4:
                self._mode = "str"
                code = int(self._buf, 16)
                if self._high and 0xDC00 <= code <= 0xDFFF:
                    pair = 0x10000 + ((ord(self._high) - 0xD800) << 10) + (code - 0xDC00)
                    self._high = ""
                    self._piece.append(chr(pair))
                elif 0xD800 <= code <= 0xDBFF:
                    self._decoded("")
                    self._high = chr(code)
                else:
                    self._decoded(chr(code))
        elif mode in ("num", "lit"):
            if (c in _NUMBER_CHARS) if mode == "num" else (c.isascii() and c.isalpha()):
                self._buf += c
            else:
                self._word()
                self._char(c)
        elif c in " \t\n\r":
            pass
        elif c == '"':
            self._mode = "str"
            self._sink("str", "")
        elif c in self._punct:
            self._sink(c, "")
        elif c in "-0123456789":
            self._mode, self._buf = "num", c
        elif c.isascii() and c.isalpha():
            self._mode, self._buf = "lit", c
        else:
            raise _Broken

    def _decoded(self, c: str) -> None:
        # A waiting high surrogate not followed by its low half stays alone (as json.loads).
        if self._high:
            self._piece.append(self._high)
            self._high = ""
        if c:
            self._piece.append(c)

    def _word(self) -> None:
        word, self._mode = self._buf, ""
        if word in _LITERALS:
            self._sink("lit", word)
        elif word[0] in "-0123456789":
            self._sink("num", _number(word))
        else:
            raise _Broken


class _Value:
    """One JSON value from tokens, checked and re-written canonically to `write` as it
    comes; `done` once it is complete. `want_object`: anything but an object is broken."""

    def __init__(self, write: Callable[[str], None], want_object: bool = False) -> None:
        self._write = write
        self._want_object = want_object
        self._stack: list[str] = []  # "}" or "]": the open containers' closers
        self._expect = "value"  # value | item | key | member | colon | next | string | done
        self._key = False  # the open string is an object key
        self.done = False

    def token(self, kind: str, text: str) -> None:
        expect, write = self._expect, self._write
        if expect == "string":
            if kind == "chars":
                write(_escape(text))
            else:  # "end": the lexer sends nothing else inside a string
                write('"')
                if self._key:
                    self._key, self._expect = False, "colon"
                else:
                    self._closed()
        elif expect in ("value", "item"):  # item: a value or "]" (just after "[")
            if expect == "item" and kind == "]":
                self._close(kind)
            elif self._want_object and not self._stack and kind != "{":
                raise _Broken
            elif kind == "{":
                self._open("}", "member")
            elif kind == "[":
                self._open("]", "item")
            elif kind == "str":
                write('"')
                self._expect = "string"
            elif kind in ("num", "lit"):
                write(text)
                self._closed()
            else:
                raise _Broken
        elif expect in ("key", "member"):  # member: a key or "}" (just after "{")
            if expect == "member" and kind == "}":
                self._close(kind)
            elif kind == "str":
                write('"')
                self._key, self._expect = True, "string"
            else:
                raise _Broken
        elif expect == "colon" and kind == ":":
            write(": ")
            self._expect = "value"
        elif expect == "next" and kind == ",":
            write(", ")
            self._expect = "key" if self._stack[-1] == "}" else "value"
        elif expect == "next" and kind == self._stack[-1]:
            self._close(kind)
        else:
            raise _Broken

    def _open(self, closer: str, expect: str) -> None:
        self._write("{" if closer == "}" else "[")
        self._stack.append(closer)
        self._expect = expect

    def _close(self, closer: str) -> None:
        self._stack.pop()
        self._write(closer)
        self._closed()

    def _closed(self) -> None:
        self._expect = "next" if self._stack else "done"
        self.done = not self._stack


# ---- calls out of JSON ------------------------------------------------------------------


class _Call:
    def __init__(self) -> None:
        self.name: str | None = None
        self.arguments: list[str] = []
        self.has_arguments = False
        self.sent = 0  # how many of the `arguments` pieces have gone out
        self.announced = False

    def write(self, text: str) -> None:
        self.arguments.append(text)


def _discard(text: str) -> None:
    pass


class _CallReader:
    """Calls out of JSON tokens: a list of call objects or one object (`seq`: llama's
    objects one after another, `;` between). A call is `{"name": str, <args key>: object,
    ...}` in any key order; its arguments are written as they come; other keys are
    checked and skipped; a repeated name or arguments key is broken."""

    def __init__(
        self, calls: list[_Call], args_keys: tuple[str, ...], seq: bool = False, one: bool = False
    ) -> None:
        self._calls = calls
        self._args_keys = args_keys
        self._seq = seq
        self._one = one  # hermes: one call per block
        self._state = "between" if seq else "start"
        self._single = False  # a bare object, not a list
        self._call = _Call()
        self._text: list[str] = []  # a key's or the name's characters
        self._key = ""
        self._sub: _Value | None = None
        self._sub_lexer: _Lexer | None = None
        self.count = 0  # calls this reader has closed

    @property
    def done(self) -> bool:
        return self._state == "done" or (self._seq and self._state == "between" and self.count > 0)

    def token(self, kind: str, text: str) -> None:
        state = self._state
        if state == "start" and kind == "[":
            self._state = "first"
        elif state in ("start", "first", "next", "between") and kind == "{":
            self._single = state == "start"
            self._call = _Call()
            self._calls.append(self._call)  # open: its name and arguments stream from here
            self._state = "member"
        elif state == "between" and kind == ";":
            pass
        elif state in ("member", "key") and kind == "str":
            self._text.clear()
            self._state = "key_text"
        elif state == "member" and kind == "}":
            self._close_call()
        elif state in ("key_text", "name_text"):
            if kind == "chars":
                self._text.append(text)
            elif state == "key_text":
                self._key, self._state = "".join(self._text), "colon"
            else:
                name = "".join(self._text)
                if not name:
                    raise _Broken
                self._call.name = name
                self._state = "after"
        elif state == "colon" and kind == ":":
            self._state = "value"
        elif state == "value":
            self._value(kind, text)
        elif state == "sub":
            assert self._sub is not None
            self._sub.token(kind, text)
            if self._sub.done:
                self._state = "after"
        elif state == "args_text":  # arguments sent as JSON text inside a string
            assert self._sub is not None and self._sub_lexer is not None
            if kind == "chars":
                self._sub_lexer.feed(text)
            else:
                self._sub_lexer.end()
                if not self._sub.done:
                    raise _Broken
                self._state = "after"
        elif state == "after" and kind == ",":
            self._state = "key"
        elif state == "after" and kind == "}":
            self._close_call()
        elif state == "list" and kind == "," and not self._one:
            self._state = "next"
        elif state == "list" and kind == "]":
            self._state = "done"
        else:
            raise _Broken

    def _value(self, kind: str, text: str) -> None:
        call, key = self._call, self._key
        if key == "name":
            if call.name is not None or kind != "str":
                raise _Broken
            self._text.clear()
            self._state = "name_text"
            return
        if key in self._args_keys:
            if call.has_arguments:
                raise _Broken
            call.has_arguments = True
            self._sub = _Value(call.write, want_object=True)
            if kind == "str":
                self._sub_lexer = _Lexer(self._sub.token)
                self._state = "args_text"
                return
        else:
            self._sub = _Value(_discard)
        self._state = "sub"
        self.token(kind, text)

    def _close_call(self) -> None:
        call = self._call
        if call.name is None:
            raise _Broken
        if not call.has_arguments:
            call.write("{}")
        self.count += 1
        self._state = "between" if self._seq else "done" if self._single else "list"


# ---- per format -------------------------------------------------------------------------

FALLBACK_MARKER = "TOOL_CALLS:"
# Where a call may start, per format (llama3_json: the answer itself, see CallStream).
MARKERS = {"mistral": "[TOOL_CALLS]", "hermes": "<tool_call>", "fallback_json": FALLBACK_MARKER}
_PYTHON_TAG = "<|python_tag|>"
_LLAMA_STARTS = ("{", _PYTHON_TAG)
_HERMES_OPEN, _HERMES_CLOSE = "<tool_call>", "</tool_call>"


class _CallText:
    """The text from where a call starts to the end of the answer, read as it arrives:
    the format's markup, then its JSON through `_CallReader`."""

    def __init__(self, fmt: str, constrained: bool) -> None:
        self.calls: list[_Call] = []
        self.broken = False
        self.plain = False  # llama: `<|python_tag|>` not followed by a call: just text
        self._fmt = "constrained" if constrained else fmt
        keys = ("parameters", "arguments") if self._fmt == "llama3_json" else ("arguments",)
        self._keys = keys
        self._reader = _CallReader(self.calls, keys, seq=self._fmt == "llama3_json")
        self._lexer = _Lexer(self._reader.token, ";" if self._fmt == "llama3_json" else "")
        # What the markup still has to see: a literal to match, or a state of its own.
        self._literal = MARKERS.get(self._fmt, "")
        if self._fmt == "hermes":
            self._state = "block"  # `<tool_call>` first
        elif self._fmt == "llama3_json":
            self._state = "tag"  # an optional `<|python_tag|>`, then the first "{"
        else:
            self._state = "json"  # after the marker, if the format has one
        self._matched = 0
        self._tagged = False

    def feed(self, text: str) -> None:
        if self.broken or self.plain:
            return
        try:
            if self._state == "json" and not self._literal and self._fmt != "hermes":
                self._lexer.feed(text)  # the common case, in one piece
                return
            for c in text:
                self._char(c)
            self._lexer.feed("")  # a string's characters so far go out
        except _Broken:
            self.broken = not self.plain

    def finish(self) -> bool:
        """Whether the whole text was calls (`broken` says whether it was meant to be)."""
        if self.broken or self.plain:
            return False
        try:
            if self._fmt == "llama3_json" and self._state == "tag":
                self.plain = True  # `<|python_tag|>` and nothing more
                return False
            if self._fmt == "hermes":
                if self._state != "between" or self._literal:
                    raise _Broken
                return True
            self._lexer.end()
            if self._literal or not self._reader.done:
                raise _Broken
            return True
        except _Broken:
            self.broken = True
            return False

    def drain(self) -> list[CallDelta]:
        """What went out of the calls since the last drain: a call's name once it is
        known, then its arguments written since."""
        out: list[CallDelta] = []
        if self.broken:
            return out  # nothing more goes out of a text that stopped parsing
        for index, call in enumerate(self.calls):
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

    def _char(self, c: str) -> None:
        if self._literal:  # inside a marker: it was found whole, or is being matched
            if c != self._literal[self._matched]:
                raise _Broken
            self._matched += 1
            if self._matched == len(self._literal):
                self._literal, self._matched = "", 0
            return
        state = self._state
        if state == "json":
            self._lexer.feed(c)
            if self._fmt == "hermes" and self._reader.done:
                self._lexer.end()
                self._state = "close"
        elif state == "tag":  # llama: optional tag, whitespace, then the calls
            if c == "<" and not self._tagged:
                self._literal, self._matched, self._tagged = _PYTHON_TAG, 1, True
            elif c in " \t\n\r":
                pass
            elif c == "{":
                self._state = "json"
                self._lexer.feed(c)
            else:
                self.plain = True
                raise _Broken  # caught by feed; `plain` keeps it from counting as broken
        elif c in " \t\n\r":
            pass
        elif state == "between" and c == "<":
            self._literal, self._matched = _HERMES_OPEN, 1
            self._state = "block"
        elif state == "block":  # after `<tool_call>`: the block's JSON
            self._reader = _CallReader(self.calls, self._keys, one=True)
            self._lexer = _Lexer(self._reader.token)
            self._state = "json"
            self._char(c)
        elif state == "close" and c == "<":
            self._literal, self._matched = _HERMES_CLOSE, 1
            self._state = "between"
        else:
            raise _Broken


# ---- the stream and the whole answer ----------------------------------------------------


class CallStream:
    """Streamed text split into content that is safe to send now, and the calls read as
    they arrive once a call may have started. `parse_answer` is this same reader fed the
    whole answer, so the content sent, joined, equals its `content`, and each call's
    fragments, joined, its `arguments`."""

    def __init__(self, fmt: str, constrained: bool = False) -> None:
        if fmt not in FORMATS:
            raise ValueError(f"unknown tool format {fmt!r}")
        self._fmt = fmt
        self._constrained = constrained
        self._sent = ""
        self._held = ""
        self._after: list[str] = []  # the text fed once a call has started (for `finish`)
        self._head = ""  # the text before the call's start (content if it parses)
        self._calls = _CallText(fmt, constrained) if constrained else None

    def feed(self, text: str) -> tuple[str, list[CallDelta]]:
        """(the content that can go out now, "" if none; the call pieces read so far)."""
        if self._calls is not None:
            self._after.append(text)  # joined once, in `finish`
            self._calls.feed(text)
            return "", self._calls.drain()
        self._held += text
        keep = self._hold_from(self._held)
        out, self._held = self._held[:keep], self._held[keep:]
        self._sent += out
        return out, self._calls.drain() if self._calls is not None else []

    def _start(self, head: str, call_text: str) -> None:
        self._head = head
        self._calls = _CallText(self._fmt, self._constrained)
        self._calls.feed(call_text)

    def _hold_from(self, buf: str) -> int:
        if self._fmt == "llama3_json":
            # A Llama-3.1 call is the whole answer: hold while the answer may begin one.
            if not self._sent:
                lead = buf.lstrip()
                if any(s.startswith(lead) or lead.startswith(s) for s in _LLAMA_STARTS):
                    if lead and any(lead.startswith(s) for s in _LLAMA_STARTS):
                        self._start("", lead)
                    return 0
            return len(buf)
        marker = MARKERS[self._fmt]
        at = buf.find(marker)
        if at >= 0:
            self._start(self._sent + buf[:at], buf[at:])
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

    def finish(self) -> tuple[ParsedAnswer, str, list[CallDelta]]:
        """(the parse of the whole answer, the content still to send, the last pieces)."""
        whole = self._sent + self._held + "".join(self._after)
        reader = self._calls
        if reader is not None and reader.finish():
            calls = tuple(ParsedCall(c.name or "", "".join(c.arguments)) for c in reader.calls)
            answer = ParsedAnswer(self._head.rstrip(), calls)
            return answer, answer.content[len(self._sent) :], reader.drain()
        broken = reader is not None and reader.broken
        return ParsedAnswer(whole, (), broken=broken), whole[len(self._sent) :], []


def parse_answer(text: str, fmt: str, constrained: bool = False) -> ParsedAnswer:
    """The parser of `fmt` (one of FORMATS) on a finished answer; `constrained`: the
    answer was generated under the tool-call grammar (the JSON list of calls itself,
    no markup: grammar.tool_call_schema)."""
    stream = CallStream(fmt, constrained)
    stream.feed(text)
    return stream.finish()[0]


_ALNUM = string.ascii_letters + string.digits


def new_call_id(fmt: str) -> str:
    """A fresh call id: 9 letters and digits for Mistral's format (its validator demands
    them when the id comes back in the history), OpenAI's `call_...` shape otherwise."""
    if fmt == "mistral":
        return "".join(secrets.choice(_ALNUM) for _ in range(9))
    return "call_" + "".join(secrets.choice(_ALNUM) for _ in range(24))
