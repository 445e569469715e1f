"""The benchmark's lean transport (``--transport raw``): HTTP/1.1 over asyncio streams.

httpx spends about 100 us of client CPU per streamed event, which caps one client process
near 5,000-9,000 events/s: below what a GPU server streams at high concurrency. This
transport parses only what the metrics need: the status line, the body's framing, which
network reads carry text (their arrival times), and the final ``usage`` and
``finish_reason``. It keeps no text. It speaks to the OpenAI routes only (their SSE carries
usage; the predict route's stream does not), over keep-alive connections, one request at
a time per connection.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from client.errors import ClientConnectionError, StreamError, error_from_response

# A non-empty text field: completion text, chat content, or a streamed tool call's arguments.
_TEXT = re.compile(rb'"(?:text|content|arguments)": ?"[^"]')
_COMPLETION = re.compile(rb'"completion_tokens": ?(\d+)')
_PROMPT = re.compile(rb'"prompt_tokens": ?(\d+)')
_FINISH = re.compile(rb'"finish_reason": ?"(\w+)"')
_DONE = b"data: [DONE]"
_TAIL = 4096  # bytes of the body kept for the final usage search


@dataclass
class RawResult:
    start: float
    end: float = 0.0
    arrivals: list[float] = field(default_factory=list)  # perf_counter of reads with text
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None


class RawConnection:
    """One keep-alive HTTP/1.1 connection; :meth:`post_stream` sends one streamed request."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"--transport raw needs a plain http:// URL, not {url!r}")
        self.host = parts.hostname
        self.port = parts.port or 80
        self.prefix = parts.path.rstrip("/")
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self._reader is None or self._writer is None or self._writer.is_closing():
            try:
                self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
            except OSError as exc:
                raise ClientConnectionError(f"cannot reach {self.host}:{self.port}: {exc}") from exc
        return self._reader, self._writer

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._reader = self._writer = None

    async def post_stream(self, path: str, body: dict[str, Any]) -> RawResult:
        """POST ``body`` as JSON and read the streamed SSE answer to its end."""
        payload = json.dumps(body).encode()
        reader, writer = await self._connect()
        result = RawResult(start=time.perf_counter())
        writer.write(
            b"POST "
            + (self.prefix + path).encode()
            + b" HTTP/1.1\r\nHost: "
            + self.host.encode()
            + b"\r\nContent-Type: application/json\r\nAccept: text/event-stream\r\n"
            b"Content-Length: " + str(len(payload)).encode() + b"\r\n\r\n" + payload
        )
        try:
            await writer.drain()
            head = await reader.readuntil(b"\r\n\r\n")
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
            self.close()
            raise ClientConnectionError(f"no answer from {self.host}:{self.port}: {exc}") from exc
        status, headers = _parse_head(head)
        framing = _framing(headers)
        if status >= 400:
            raw = await self._read_whole(reader, framing, headers)
            raise error_from_response(status, raw, headers)
        tail = await self._read_stream(reader, framing, headers, result)
        result.end = time.perf_counter()
        _read_usage(tail, result)
        if framing == "close" or headers.get("connection", "").lower() == "close":
            self.close()
        return result

    async def _read_stream(
        self,
        reader: asyncio.StreamReader,
        framing: str,
        headers: dict[str, str],
        result: RawResult,
    ) -> bytes:
        """Read the body to its end; note the arrival of every read that holds text."""
        remaining = int(headers.get("content-length", "0")) if framing == "length" else -1
        tail = b""
        while True:
            data = await reader.read(65536)
            if not data:
                self.close()
                if framing == "close" and _DONE in tail:
                    return tail
                raise StreamError("stream broke off (connection closed before its end)")
            if _TEXT.search(data):
                result.arrivals.append(time.perf_counter())
            tail = tail[-_TAIL:] + data
            if framing == "length":
                remaining -= len(data)
                if remaining <= 0:
                    return tail
            elif framing == "chunked" and tail.endswith(b"\r\n0\r\n\r\n") and _DONE in tail:
                return tail

    async def _read_whole(
        self, reader: asyncio.StreamReader, framing: str, headers: dict[str, str]
    ) -> bytes:
        try:
            if framing == "length":
                return await reader.readexactly(int(headers["content-length"]))
            if framing == "chunked":
                out = b""
                while True:
                    size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
                    chunk = await reader.readexactly(size + 2)
                    if size == 0:
                        return out
                    out += chunk[:-2]
            return await reader.read()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as exc:
            self.close()
            return f"(unreadable error body: {exc})".encode()
        finally:
            if framing == "close":
                self.close()


def _parse_head(head: bytes) -> tuple[int, dict[str, str]]:
    lines = head.decode("latin-1").split("\r\n")
    try:
        status = int(lines[0].split(" ", 2)[1])
    except (IndexError, ValueError) as exc:
        raise StreamError(f"not an HTTP answer: {lines[0][:100]!r}") from exc
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return status, headers


def _framing(headers: dict[str, str]) -> str:
    if "chunked" in headers.get("transfer-encoding", "").lower():
        return "chunked"
    if "content-length" in headers:
        return "length"
    return "close"


def _read_usage(tail: bytes, result: RawResult) -> None:
    if found := _COMPLETION.findall(tail):
        result.completion_tokens = int(found[-1])
    if found := _PROMPT.findall(tail):
        result.prompt_tokens = int(found[-1])
    if found := _FINISH.findall(tail):
        result.finish_reason = found[-1].decode()


class RawPool:
    """Open connections reused across requests (one request per connection at a time)."""

    def __init__(self, url: str) -> None:
        self.url = url
        RawConnection(url)  # validate the URL now, not on the first request
        self._idle: list[RawConnection] = []

    async def post_stream(self, path: str, body: dict[str, Any]) -> RawResult:
        conn = self._idle.pop() if self._idle else RawConnection(self.url)
        try:
            result = await conn.post_stream(path, body)
        except BaseException:
            conn.close()
            raise
        self._idle.append(conn)
        return result

    def close(self) -> None:
        for conn in self._idle:
            conn.close()
        self._idle.clear()
