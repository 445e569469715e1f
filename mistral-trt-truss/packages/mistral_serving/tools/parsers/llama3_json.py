"""`llama3_json`: Llama-3.1-style templates (`ipython`, `<|python_tag|>`). A call is the
whole answer: `{"name", "parameters"}` objects (`arguments` taken too), optionally after
`<|python_tag|>`, separated by `;`. A python tag followed by anything else is plain text."""

from __future__ import annotations

from mistral_serving.tools.parsers.base import WHITESPACE, CallText, Marker, ToolParser
from mistral_serving.tools.parsers.json_tokens import Broken, CallReader, Lexer

PYTHON_TAG = "<|python_tag|>"
_STARTS = ("{", PYTHON_TAG)


class Llama3JsonParser(ToolParser):
    name = "llama3_json"
    args_keys = ("parameters", "arguments")

    def split(self, held: str, sent: str) -> tuple[int, int | None]:
        # Hold while the answer may still begin a call; once content went out, none can.
        if sent:
            return len(held), None
        lead = held.lstrip()
        if not any(s.startswith(lead) or lead.startswith(s) for s in _STARTS):
            return len(held), None
        if lead and any(lead.startswith(s) for s in _STARTS):
            return 0, len(held) - len(lead)
        return 0, None

    def call_text(self) -> CallText:
        return LlamaCalls(self.args_keys)


class LlamaCalls(CallText):
    def __init__(self, args_keys: tuple[str, ...]) -> None:
        super().__init__()
        self._reader = CallReader(self.calls, args_keys, seq=True)
        self._lexer = Lexer(self._reader.token, ";")
        self._tag = Marker()
        self._tagged = False
        self._json = False  # the first "{" has come: the rest is the lexer's

    def _feed(self, text: str) -> None:
        if self._json:
            self._lexer.feed(text)
            return
        for at, c in enumerate(text):
            if self._tag.pending:
                self._tag.eat(c)
            elif c == "<" and not self._tagged:
                self._tag.expect(PYTHON_TAG, 1)
                self._tagged = True
            elif c in WHITESPACE:
                pass
            elif c == "{":
                self._json = True
                self._lexer.feed(text[at:])
                return
            else:
                self.plain = True  # a tag, then something else: text, not a broken call
                raise Broken

    def _finish(self) -> bool:
        if not self._json:
            self.plain = True  # `<|python_tag|>` and nothing more
            return False
        self._lexer.end()
        if not self._reader.done:
            raise Broken
        return True
