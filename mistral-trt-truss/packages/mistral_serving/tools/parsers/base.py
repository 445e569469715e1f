"""What a tool format is, as one interface (`ToolParser`): where a call may start in an
answer (what content to hold back until it is known), the reader of the call text (its
markup, then its JSON through json_tokens.CallReader), the arguments keys, and the
call-id style. Everything else (content, deltas, the whole answer) is the stream's
(stream.CallStream), the same for every format.

Also here: what several formats share: a marker to match as it arrives (`Marker`), the
"marker, then a JSON list of calls or one call" reader (`MarkedJson`) and the parser of a
format whose calls start at a marker (`MarkerParser`).
"""

from __future__ import annotations

import secrets
import string
from abc import ABC, abstractmethod
from typing import ClassVar

from mistral_serving.tools.parsers.json_tokens import Broken, Call, CallReader, Lexer

WHITESPACE = " \t\n\r"
_ALNUM = string.ascii_letters + string.digits


def random_alnum(n: int) -> str:
    return "".join(secrets.choice(_ALNUM) for _ in range(n))


class CallText(ABC):
    """The text from where a call starts to the end of the answer, read as it arrives;
    `calls` holds the calls read so far (their names and arguments stream from there)."""

    def __init__(self) -> None:
        self.calls: list[Call] = []
        self.broken = False  # the text stopped parsing: not calls after all
        self.plain = False  # not calls, and never meant to be (llama's lone python tag)

    def feed(self, text: str) -> None:
        if self.broken or self.plain:
            return
        try:
            self._feed(text)
        except Broken:
            self.broken = not self.plain

    def finish(self) -> bool:
        """Whether the whole text was calls (`broken` says whether it was meant to be)."""
        if self.broken or self.plain:
            return False
        try:
            return self._finish()
        except Broken:
            self.broken = True
            return False

    @abstractmethod
    def _feed(self, text: str) -> None:
        """Read `text`; raise Broken where it cannot be this format's calls."""

    @abstractmethod
    def _finish(self) -> bool:
        """The text is over: True if it was calls; raise Broken if it was not whole."""


class ToolParser(ABC):
    """One tool format's answer side. Stateless: the stream keeps the state, and each
    answer gets its own `call_text()` reader."""

    name: ClassVar[str]  # the name the tokenizer reports (Tokenizer.tool_format)
    args_keys: ClassVar[tuple[str, ...]] = ("arguments",)  # the keys a call's arguments take

    @abstractmethod
    def split(self, held: str, sent: str) -> tuple[int, int | None]:
        """Before any call: `held` is the text not sent yet, `sent` the content already
        sent. Returns (how much of `held` is content that can go out now; where in `held`
        a call starts, None while none has). Text that may still become a call's start
        is held back."""

    @abstractmethod
    def call_text(self) -> CallText:
        """A fresh reader of the text from where a call starts."""

    def new_call_id(self) -> str:
        """A fresh call id: OpenAI's `call_` and 24 letters or digits."""
        return "call_" + random_alnum(24)


class Marker:
    """A literal the text must match next, character by character (it may arrive split
    over several pieces); `pending` until it is matched whole."""

    def __init__(self, text: str = "") -> None:
        self._text = text
        self._matched = 0

    @property
    def pending(self) -> bool:
        return bool(self._text)

    def expect(self, text: str, matched: int = 0) -> None:
        """`text` comes next; its first `matched` characters have been seen."""
        self._text, self._matched = text, matched

    def eat(self, c: str) -> None:
        if c != self._text[self._matched]:
            raise Broken
        self._matched += 1
        if self._matched == len(self._text):
            self._text, self._matched = "", 0


class MarkedJson(CallText):
    """A marker (none: the text starts with the JSON), then a JSON list of calls or one
    call object, and nothing but whitespace after it."""

    def __init__(self, marker: str, args_keys: tuple[str, ...]) -> None:
        super().__init__()
        self._marker = Marker(marker)
        self._reader = CallReader(self.calls, args_keys)
        self._lexer = Lexer(self._reader.token)

    def _feed(self, text: str) -> None:
        at = 0
        while at < len(text) and self._marker.pending:
            self._marker.eat(text[at])
            at += 1
        self._lexer.feed(text[at:])

    def _finish(self) -> bool:
        self._lexer.end()
        if self._marker.pending or not self._reader.done:
            raise Broken
        return True


class MarkerParser(ToolParser):
    """A format whose calls start at a marker anywhere in the answer, content before it."""

    marker: ClassVar[str]

    def split(self, held: str, sent: str) -> tuple[int, int | None]:
        # Whitespace before a call is not content (the answer's content is stripped), so
        # whitespace at the end of what can go out is held back too.
        marker = self.marker
        at = held.find(marker)
        if at >= 0:
            return len(held[:at].rstrip()), at
        end = len(held)
        for n in range(min(len(marker) - 1, len(held)), 0, -1):
            if held.endswith(marker[:n]):  # the next text may complete the marker
                end = len(held) - n
                break
        return len(held[:end].rstrip()), None

    def call_text(self) -> CallText:
        return MarkedJson(self.marker, self.args_keys)
