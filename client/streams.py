"""Turning streamed bytes into text.

Two wire formats:

* the predict route streams the generated text itself as raw UTF-8 chunks; a network read
  may end in the middle of a multi-byte character, so bytes go through an incremental
  UTF-8 decoder (``codecs``) that keeps the unfinished tail for the next read;
* the OpenAI routes stream Server-Sent Events (``data: {json}`` lines, ending with
  ``data: [DONE]``); lines are split on bytes first and each complete line is decoded, so
  a read that ends inside a line (or inside a character) is handled the same way.
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
class SSEEvent:
    data: str
    event: str | None = None
    id: str | None = None


class SSEParser:
    """A Server-Sent Events parser (the WHATWG rules that matter for LLM servers).

    Feed it bytes as they arrive; it returns the events completed by them. Handles
    ``\\n``, ``\\r\\n`` and ``\\r`` line ends split across reads, comment lines (``:``),
    multi-line ``data:`` fields and the optional space after the colon.
    """

    def __init__(self) -> None:
        self._buffer = b""
        self._data: list[str] = []
        self._event: str | None = None
        self._id: str | None = None
        self._pending_cr = False

    def feed(self, data: bytes) -> list[SSEEvent]:
        if self._pending_cr and data.startswith(b"\n"):
            data = data[1:]  # the \n of a \r\n split across two reads
        self._pending_cr = False
        self._buffer += data
        events: list[SSEEvent] = []
        while True:
            cut = _first_line_end(self._buffer)
            if cut is None:
                break
            end, width = cut
            if width == 1 and self._buffer[end : end + 1] == b"\r" and end + 1 == len(self._buffer):
                self._pending_cr = True  # might be the first half of \r\n
            line = self._buffer[:end].decode("utf-8")
            self._buffer = self._buffer[end + width :]
            event = self._line(line)
            if event is not None:
                events.append(event)
        return events

    def close(self) -> list[SSEEvent]:
        """End of stream: a final event without its blank line is still dispatched."""
        events: list[SSEEvent] = []
        if self._buffer:
            event = self._line(self._buffer.decode("utf-8"))
            self._buffer = b""
            if event is not None:
                events.append(event)
        event = self._line("")
        if event is not None:
            events.append(event)
        return events

    def _line(self, line: str) -> SSEEvent | None:
        if line == "":
            if not self._data:
                self._event = None
                return None
            event = SSEEvent("\n".join(self._data), self._event, self._id)
            self._data, self._event = [], None
            return event
        if line.startswith(":"):
            return None
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id":
            self._id = value
        return None


def _first_line_end(buf: bytes) -> tuple[int, int] | None:
    """Index and width of the first line terminator (\\r\\n, \\n or \\r) in buf."""
    n = buf.find(b"\n")
    r = buf.find(b"\r")
    if r == -1 and n == -1:
        return None
    if r == -1 or (n != -1 and n < r):
        return n, 1
    if r + 1 < len(buf) and buf[r + 1 : r + 2] == b"\n":
        return r, 2
    return r, 1


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
        text = self._decoder.feed(data)
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
    """The OpenAI routes' SSE stream for ``/v1/completions`` or ``/v1/chat/completions``.

    Yields the text of each chunk (``choices[0].text`` or ``choices[0].delta.content``);
    records ``finish_reason`` and the ``usage`` of the final chunk
    (``stream_options.include_usage``). An ``error`` event raises :class:`StreamError`;
    a stream that ends without ``data: [DONE]`` raises on :meth:`close`.
    """

    def __init__(self, chat: bool) -> None:
        self.chat = chat
        self._sse = SSEParser()
        self.state = StreamState()

    def feed(self, data: bytes) -> list[str]:
        return self._events(self._sse.feed(data))

    def close(self) -> list[str]:
        out = self._events(self._sse.close())
        if not self.state.done:
            raise StreamError("stream ended without 'data: [DONE]'")
        return out

    def _events(self, events: list[SSEEvent]) -> list[str]:
        out: list[str] = []
        for event in events:
            if event.data.strip() == "[DONE]":
                self.state.done = True
                continue
            if self.state.done:
                continue
            try:
                payload = json.loads(event.data)
            except ValueError as exc:
                raise StreamError(f"bad SSE data (not JSON): {event.data[:200]!r}") from exc
            if not isinstance(payload, dict):
                raise StreamError(f"bad SSE data (not an object): {event.data[:200]!r}")
            err = error_from_event(payload)
            if err is not None:
                raise err
            self.state.raw_last = payload
            usage = payload.get("usage")
            if isinstance(usage, dict):
                self.state.usage = Usage.from_dict(usage)
            for choice in payload.get("choices") or []:
                if choice.get("index", 0) != 0:
                    continue
                if self.chat:
                    text = (choice.get("delta") or {}).get("content")
                else:
                    text = choice.get("text")
                if choice.get("finish_reason"):
                    self.state.finish_reason = choice["finish_reason"]
                if text:
                    self.state.chunks += 1
                    out.append(text)
        return out
