"""The JSON token reader every tool format shares: strict JSON read as it arrives in
pieces (`Lexer`), one value checked and re-written canonically (`Value`), and calls read
out of the tokens (`CallReader`).

The canonical text is the model's JSON re-written token by token: `json.dumps`'s
separators, strings as `json.dumps(..., ensure_ascii=False)` writes them (a lone surrogate
escaped), numbers as `json.dumps` writes Python's reading of them, keys in the model's
order. Without repeated keys that is `json.dumps(json.loads(text), ensure_ascii=False)`;
a repeated key is kept as written (a JSON reader takes its last value, as `json.loads`
did). Pieces of a string are escaped apart and join to the whole string escaped, so how
the text was split never changes what is written.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable


class Broken(Exception):
    """The text cannot be calls of this format."""


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
        raise Broken
    try:
        value: int | float = float(token) if any(c in token for c in ".eE") else int(token)
    except ValueError:  # an int too long for Python's conversion limit
        raise Broken from None
    if isinstance(value, float) and not math.isfinite(value):
        raise Broken
    return json.dumps(value)


def _escape(piece: str) -> str:
    """A decoded piece of a string as `json.dumps` writes it inside the quotes (escapes
    are per character, so pieces escaped apart join to the whole string escaped); a lone
    surrogate is written as its escape, so the text stays valid UTF-8."""
    text = json.dumps(piece, ensure_ascii=False)[1:-1]
    return _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


class Lexer:
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
            raise Broken  # inside a string

    def _char(self, c: str) -> None:
        mode = self._mode
        if mode in ("str", "esc", "hex"):
            self._string_char(c)
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
            raise Broken

    def _string_char(self, c: str) -> None:
        mode = self._mode
        if mode == "esc":
            if c == "u":
                self._mode, self._buf = "hex", ""
            elif c in _ESCAPES:
                self._mode = "str"
                self._decoded(_ESCAPES[c])
            else:
                raise Broken
        elif mode == "hex":
            self._hex_digit(c)
        elif c == '"':
            self._decoded("")
            if self._piece:
                self._sink("chars", "".join(self._piece))
                self._piece.clear()
            self._mode = ""
            self._sink("end", "")
        elif c == "\\":
            self._mode = "esc"
        elif c < " ":
            raise Broken  # JSON strings hold no raw control characters
        else:
            self._decoded(c)

    def _hex_digit(self, c: str) -> None:
        if c not in _HEX:
            raise Broken
        self._buf += c
        if len(self._buf) < 4:
            return
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
            raise Broken


class Value:
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
                raise Broken
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
                raise Broken
        elif expect in ("key", "member"):  # member: a key or "}" (just after "{")
            if expect == "member" and kind == "}":
                self._close(kind)
            elif kind == "str":
                write('"')
                self._key, self._expect = True, "string"
            else:
                raise Broken
        elif expect == "colon" and kind == ":":
            write(": ")
            self._expect = "value"
        elif expect == "next" and kind == ",":
            write(", ")
            self._expect = "key" if self._stack[-1] == "}" else "value"
        elif expect == "next" and kind == self._stack[-1]:
            self._close(kind)
        else:
            raise Broken

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


class Call:
    """One call as it is read: its name once complete, its arguments' canonical text in
    pieces as they are written; `sent` and `announced`: what the stream has let out."""

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


class CallReader:
    """Calls out of JSON tokens: a list of call objects or one object (`seq`: llama's
    objects one after another, `;` between). A call is `{"name": str, <args key>: object,
    ...}` in any key order; its arguments are written as they come; other keys are
    checked and skipped; a repeated name or arguments key is broken."""

    def __init__(
        self, calls: list[Call], args_keys: tuple[str, ...], seq: bool = False, one: bool = False
    ) -> None:
        self._calls = calls
        self._args_keys = args_keys
        self._seq = seq
        self._one = one  # hermes: one call per block
        self._state = "between" if seq else "start"
        self._single = False  # a bare object, not a list
        self._call = Call()
        self._text: list[str] = []  # a key's or the name's characters
        self._key = ""
        self._sub: Value | None = None
        self._sub_lexer: Lexer | None = None
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
            self._call = Call()
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
                    raise Broken
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
                    raise Broken
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
            raise Broken

    def _value(self, kind: str, text: str) -> None:
        call, key = self._call, self._key
        if key == "name":
            if call.name is not None or kind != "str":
                raise Broken
            self._text.clear()
            self._state = "name_text"
            return
        if key in self._args_keys:
            if call.has_arguments:
                raise Broken
            call.has_arguments = True
            self._sub = Value(call.write, want_object=True)
            if kind == "str":
                self._sub_lexer = Lexer(self._sub.token)
                self._state = "args_text"
                return
        else:
            self._sub = Value(_discard)
        self._state = "sub"
        self.token(kind, text)

    def _close_call(self) -> None:
        call = self._call
        if call.name is None:
            raise Broken
        if not call.has_arguments:
            call.write("{}")
        self.count += 1
        self._state = "between" if self._seq else "done" if self._single else "list"
