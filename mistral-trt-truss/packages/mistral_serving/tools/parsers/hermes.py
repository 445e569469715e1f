"""`hermes`: chat templates that write `<tool_call>` blocks (Hermes, Qwen2.5 and other
ChatML tool templates): one `{"name", "arguments"}` object per block, whitespace between
blocks, nothing after the last."""

from __future__ import annotations

from mistral_serving.tools.parsers.base import (
    WHITESPACE,
    CallText,
    Marker,
    MarkerParser,
)
from mistral_serving.tools.parsers.json_tokens import Broken, CallReader, Lexer

OPEN, CLOSE = "<tool_call>", "</tool_call>"


class HermesParser(MarkerParser):
    name = "hermes"
    marker = OPEN

    def call_text(self) -> CallText:
        return HermesBlocks(self.args_keys)


class HermesBlocks(CallText):
    def __init__(self, args_keys: tuple[str, ...]) -> None:
        super().__init__()
        self._keys = args_keys
        self._tag = Marker(OPEN)
        self._state = "block"  # block (its JSON next) | json | close | between (blocks)
        self._reader = CallReader(self.calls, args_keys, one=True)
        self._lexer = Lexer(self._reader.token)

    def _feed(self, text: str) -> None:
        # Character by character: a block's JSON ends where its call object closes.
        for c in text:
            self._char(c)
        self._lexer.feed("")  # a string's characters so far go out

    def _finish(self) -> bool:
        if self._state != "between" or self._tag.pending:
            raise Broken
        return True

    def _char(self, c: str) -> None:
        if self._tag.pending:
            self._tag.eat(c)
            return
        state = self._state
        if state == "json":
            self._lexer.feed(c)
            if self._reader.done:
                self._lexer.end()
                self._state = "close"
        elif c in WHITESPACE:
            pass
        elif state == "block":  # one call per block: a reader of its own
            self._reader = CallReader(self.calls, self._keys, one=True)
            self._lexer = Lexer(self._reader.token)
            self._state = "json"
            self._char(c)
        elif state == "close" and c == "<":
            self._tag.expect(CLOSE, 1)
            self._state = "between"
        elif state == "between" and c == "<":
            self._tag.expect(OPEN, 1)
            self._state = "block"
        else:
            raise Broken
