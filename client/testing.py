"""A loopback stand-in for the server, for tests of code that uses the client.

It speaks both wire formats (predict route, OpenAI routes with SSE) from a fixed token
script, counts tokens the way a server would report them in ``usage``, and can misbehave
on purpose: answer 503 while "loading", 429 with Retry-After, 4xx bodies of both error
shapes, writes that split UTF-8 characters, slow first bytes. It binds 127.0.0.1 only.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

# Tokens with multi-byte characters: accents (2 bytes), CJK (3), emoji (4), a ZWJ emoji.
DEFAULT_TOKENS: tuple[str, ...] = (
    "Hé",
    "llo",
    " 世",
    "界",
    " 🙂",
    " ok",
    " Ça",
    " 👩‍💻",
    " ñ",
    "!",
)


@dataclass
class FakeServerState:
    tokens: tuple[str, ...] = DEFAULT_TOKENS
    token_delay: float = 0.002  # seconds between streamed tokens
    first_token_delay: float = 0.0
    split_characters: bool = True  # write each multi-byte token in two halves
    loading_503: int = 0  # answer 503 to this many requests (any route) first
    rate_limit_429: int = 0  # then 429 with Retry-After to this many generation requests
    retry_after: str = "1"
    prompt_overhead: int = 3  # "template" tokens added to every prompt
    chunked: bool = False  # HTTP/1.1 keep-alive, streams in chunked encoding (like uvicorn)
    truncate_after: int | None = None  # chunked streams: break off after this many tokens
    requests: list[dict[str, Any]] = field(default_factory=list)  # bodies of generation calls
    usage_log: list[dict[str, int]] = field(default_factory=list)  # usage of each answer
    in_flight: int = 0
    max_in_flight: int = 0
    hits: dict[str, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)


def prompt_tokens(body: dict[str, Any], overhead: int) -> int:
    if "messages" in body:
        text = " ".join(str(m.get("content", "")) for m in body["messages"])
    else:
        text = str(body.get("prompt", ""))
    return overhead + len(text.split())


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"  # streams end when the connection closes
    server: _Server

    def setup(self) -> None:
        super().setup()
        if self.server.state.chunked:
            self.protocol_version = "HTTP/1.1"  # keep-alive; every body is framed

    def log_message(self, *args: Any) -> None:
        pass

    # -- helpers --------------------------------------------------------------------
    def _json(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def _error(
        self,
        status: int,
        message: str,
        openai: bool,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        if openai:
            body: Any = {
                "error": {
                    "message": message,
                    "type": "invalid_request_error",
                    "param": param,
                    "code": None,
                }
            }
        else:
            body = {"error": message}
        self._json(status, body, headers)

    def _write(self, data: bytes) -> None:
        if self.server.state.chunked:
            data = b"%x\r\n" % len(data) + data + b"\r\n"
        self.wfile.write(data)
        self.wfile.flush()

    def _start_stream(self, content_type: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        if self.server.state.chunked:
            self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def _end_stream(self) -> None:
        if self.server.state.chunked:
            self.wfile.write(b"0\r\n\r\n")  # the last chunk: the body is complete
            self.wfile.flush()

    def _cut(self, sent: int) -> bool:
        """Break the stream off here (no last chunk, connection closed) when asked to."""
        limit = self.server.state.truncate_after
        if limit is not None and sent >= limit:
            self.close_connection = True
            return True
        return False

    def _gate(self, openai: bool, generation: bool) -> bool:
        st = self.server.state
        with st.lock:
            st.hits[self.path] = st.hits.get(self.path, 0) + 1
            if st.loading_503 > 0:
                st.loading_503 -= 1
                status = 503
            elif generation and st.rate_limit_429 > 0:
                st.rate_limit_429 -= 1
                status = 429
            else:
                return True
        if status == 503:
            self._error(503, "model is loading", openai)
        else:
            self._error(
                429,
                "too many requests in the queue",
                openai,
                headers={"Retry-After": st.retry_after},
            )
        return False

    def _generated(self, n: int) -> list[str]:
        tokens = self.server.state.tokens
        return [tokens[i % len(tokens)] for i in range(n)]

    # -- routes ---------------------------------------------------------------------
    def do_GET(self) -> None:
        if self.path == "/v1/models/model":
            if self._gate(False, False):
                self._json(200, {"ready": True})
        elif self.path == "/v1/models":
            self._json(200, {"object": "list", "data": [{"id": "fake-model", "object": "model"}]})
        else:
            self._json(404, {"detail": "Not Found"})

    def do_POST(self) -> None:
        openai = self.path in ("/v1/completions", "/v1/chat/completions")
        if self.path != "/v1/models/model:predict" and not openai:
            self._json(404, {"detail": "Not Found"})
            return
        length = int(self.headers.get("Content-Length") or 0)
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
        except ValueError:
            self._error(400, "body is not JSON", openai)
            return
        if not self._gate(openai, True):
            return
        st = self.server.state
        temperature = body.get("temperature")
        if temperature is not None and temperature < 0:
            self._error(400, f"temperature must be >= 0, got {temperature}", openai, "temperature")
            return
        with st.lock:
            st.requests.append(body)
            st.in_flight += 1
            st.max_in_flight = max(st.max_in_flight, st.in_flight)
        try:
            n = int(body.get("max_tokens" if openai else "max_new_tokens", 16))
            usage = {
                "prompt_tokens": prompt_tokens(body, st.prompt_overhead),
                "completion_tokens": n,
            }
            usage["total_tokens"] = usage["prompt_tokens"] + n
            with st.lock:
                st.usage_log.append(usage)
            tokens = self._generated(n)
            finish = "length"
            if openai:
                self._openai(body, tokens, usage, finish)
            else:
                self._predict(body, tokens, usage, finish)
        finally:
            with st.lock:
                st.in_flight -= 1

    def _predict(
        self, body: dict[str, Any], tokens: list[str], usage: dict[str, int], finish: str
    ) -> None:
        st = self.server.state
        if not body.get("streaming"):
            time.sleep(st.first_token_delay + st.token_delay * len(tokens))
            self._json(200, {"output": "".join(tokens), "finish_reason": finish, "usage": usage})
            return
        self._start_stream("application/octet-stream")
        interval = max(1, int(body.get("streaming_interval") or 3))
        time.sleep(st.first_token_delay)
        for i in range(0, len(tokens), interval):
            if self._cut(i):
                return
            data = "".join(tokens[i : i + interval]).encode()
            for part in self._parts(data):
                self._write(part)
            time.sleep(st.token_delay * interval)
        self._end_stream()

    def _parts(self, data: bytes) -> Iterator[bytes]:
        """The bytes of one chunk, split in the middle of a character when asked."""
        st = self.server.state
        if st.split_characters and len(data) > 1 and any(b >= 0x80 for b in data):
            cut = next(i for i, b in enumerate(data) if b >= 0x80) + 1
            yield data[:cut]
            time.sleep(0.001)
            yield data[cut:]
        else:
            yield data

    def _openai(
        self, body: dict[str, Any], tokens: list[str], usage: dict[str, int], finish: str
    ) -> None:
        st = self.server.state
        chat = self.path.endswith("chat/completions")
        base = {"id": "cmpl-fake", "created": 0, "model": body.get("model", "fake-model")}
        if not body.get("stream"):
            time.sleep(st.first_token_delay + st.token_delay * len(tokens))
            text = "".join(tokens)
            choice: dict[str, Any] = (
                {"index": 0, "message": {"role": "assistant", "content": text}}
                if chat
                else {"index": 0, "text": text}
            )
            choice["finish_reason"] = finish
            obj = "chat.completion" if chat else "text_completion"
            self._json(200, base | {"object": obj, "choices": [choice], "usage": usage})
            return
        self._start_stream("text/event-stream")
        obj = "chat.completion.chunk" if chat else "text_completion"

        def event(payload: dict[str, Any]) -> None:
            data = (
                b"data: "
                + json.dumps(base | {"object": obj} | payload, ensure_ascii=False).encode()
                + b"\n\n"
            )
            for part in self._parts(data):
                self._write(part)

        if chat:
            event(
                {"choices": [{"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}]}
            )
        time.sleep(st.first_token_delay)
        for i, tok in enumerate(tokens):
            if self._cut(i):
                return
            last = i == len(tokens) - 1
            choice = {"index": 0, "delta": {"content": tok}} if chat else {"index": 0, "text": tok}
            choice["finish_reason"] = finish if last else None
            event({"choices": [choice]})
            time.sleep(st.token_delay)
        if (body.get("stream_options") or {}).get("include_usage"):
            event({"choices": [], "usage": usage})
        self._write(b"data: [DONE]\n\n")
        self._end_stream()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    state: FakeServerState


class FakeServer:
    """``with FakeServer() as fake: Client(fake.url)...``; ``fake.state`` to steer/inspect."""

    def __init__(self, state: FakeServerState | None = None) -> None:
        self.state = state or FakeServerState()
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.state = self.state
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_port}"

    def __enter__(self) -> FakeServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


def closed_port() -> int:
    """A loopback port with nothing listening (for connection-refused tests)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]  # getsockname() is typed Any
        return port
