"""Turning streamed bytes into text.

Two wire formats:

* the predict route streams the generated text itself as raw UTF-8 chunks; a network read
  may end in the middle of a multi-byte character, so bytes go through an incremental
  UTF-8 decoder (``codecs``) that keeps the unfinished tail for the next read;
* the OpenAI routes stream Server-Sent Events (``data: {json}`` lines, ending with
  ``data: [DONE]``), parsed by httpx-sse (which splits lines on ``\r\n``, ``\n`` and
  ``\r`` only: JSON may carry U+2028 or U+0085 raw inside a string, where
  ``str.splitlines`` would cut); :class:`OpenAIStreamParser` turns each event's data into
  text.
"""

from __future__ import annotations

import codecs
import json
from dataclasses import dataclass, field
from typing import Any

from client.errors import StreamError, error_from_event
from client.types import Usage


class Utf8Decoder:
    """Incremental UTF-8 decoding: bytes in any split, whole characters out.

    ``errors`` is passed to the codec: ``"strict"`` raises on invalid bytes,
    ``"replace"`` turns them into U+FFFD.
    """

    def __init__(self, errors: str = "strict") -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors=errors)

    def feed(self, data: bytes) -> str:
        return self._decoder.decode(data, final=False)

    def close(self) -> str:
        """Flush; raises (strict) or yields U+FFFD (replace) for a truncated character."""
        return self._decoder.decode(b"", final=True)


@dataclass
class StreamState:
    """What a finished stream told us besides its text."""

    finish_reason: str | None = None
    usage: Usage | None = None
    done: bool = False
    chunks: int = 0
    raw_last: dict[str, Any] | None = field(default=None, repr=False)


class PredictStreamParser:
    """The predict route's stream: raw UTF-8 text chunks, ended by the connection."""

    def __init__(self, errors: str = "strict") -> None:
        self._decoder = Utf8Decoder(errors)
        self.state = StreamState()

    def feed(self, data: bytes) -> list[str]:
        try:
            text = self._decoder.feed(data)
        except UnicodeDecodeError as exc:
            raise StreamError(f"the stream is not valid UTF-8: {exc}") from exc
        if text:
            self.state.chunks += 1
            return [text]
        return []

    def close(self) -> list[str]:
        try:
            tail = self._decoder.close()
        except UnicodeDecodeError as exc:
            raise StreamError(f"stream ended inside a UTF-8 character: {exc}") from exc
        self.state.done = True
        return [tail] if tail else []


class OpenAIStreamParser:
    """The events of an OpenAI stream for ``/v1/completions`` or ``/v1/chat/completions``.

    :meth:`event` takes one SSE event's data and returns the text of its chunk
    (``choices[0].text`` or ``choices[0].delta.content``); the parser records
    ``finish_reason`` and the ``usage`` of the final chunk (``stream_options.include_usage``).
    An ``error`` event raises :class:`StreamError`; a stream that ends without
    ``data: [DONE]`` raises on :meth:`close`.
    """

    def __init__(self, chat: bool) -> None:
        self.chat = chat
        self.state = StreamState()

    def close(self) -> list[str]:
        if not self.state.done:
            raise StreamError("stream ended without 'data: [DONE]'")
        return []

    def event(self, data: str) -> list[str]:
        if not data or self.state.done:
            return []  # a data-less event, or anything after [DONE]
        if data.strip() == "[DONE]":
            self.state.done = True
            return []
        try:
            payload = json.loads(data)
        except ValueError as exc:
            raise StreamError(f"bad SSE data (not JSON): {data[:200]!r}") from exc
        if not isinstance(payload, dict):
            raise StreamError(f"bad SSE data (not an object): {data[:200]!r}")
        err = error_from_event(payload)
        if err is not None:
            raise err
        self.state.raw_last = payload
        usage = payload.get("usage")
        if isinstance(usage, dict):
            self.state.usage = Usage.from_dict(usage)
        out: list[str] = []
        for choice in payload.get("choices") or []:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            holder = choice.get("delta") if self.chat else choice
            text = (
                holder.get("content" if self.chat else "text") if isinstance(holder, dict) else None
            )
            if not isinstance(text, str):
                text = None  # a null or malformed field carries no text
            if choice.get("finish_reason"):
                self.state.finish_reason = choice["finish_reason"]
            if text:
                self.state.chunks += 1
                out.append(text)
        return out
