"""Connection limits that uvicorn (0.54) does not have, on its httptools HTTP/1.1 parser
(the server's only one: uvicorn's own default where httptools is installed, as in vLLM).

uvicorn's protocol reads request headers without bound (httptools keeps appending a header
value it gets in pieces, at quadratic cost), has no
timeout for a request's headers, none for a fresh connection that sends nothing (the
keep-alive timer is armed only after a response), and no connection cap that leaves room
for the kubelet's probes (`limit_concurrency` answers 503 to probes too). `protocol_class`
makes a subclass of `HttpToolsProtocol` that adds, per connection:

- header bytes (request line included) counted in `data_received` *before* the parser
  sees them: the parser only ever gets what fits, so past `max_header_bytes` the answer is
  431 whatever the parser would have buffered; more than `max_header_count` lines: 431;
- a header timer from a request's first byte (408 when it runs out) and an idle timer
  for a connection without a request in progress, fresh ones included (plain close);
- the kernel's and the transport's send buffers bounded by `stream_buffer_bytes` (the
  stream's own buffer, in the frontend, is the third place a slow reader's output waits);
- a connection cap: past `max_connections - probe_reserve_connections` the oldest idle
  connection is closed to make room; a new connection that finds none serves only probe
  requests (503 for the rest); past `max_connections` it gets 503 at once;
- `scope["extensions"]["mistral.cut"]`: how the app ends a response on purpose without
  completing it (a cut stream, a slow reader) without uvicorn logging it as a fault;
  `["mistral.on_client_left"]`: a callback run if the connection closes before the response
  is complete (a stream learns that its client left without a task waiting on `receive`).

A refusal is a JSON answer with `connection: close`, then a half-close: the client can read
it while its input is read and dropped for a moment (closing at once with unread input
makes the kernel answer with a reset, which would hide the status).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import re
import resource
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any, ClassVar

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge
from uvicorn.protocols.http import httptools_impl
from uvicorn.protocols.http.flow_control import HIGH_WATER_LIMIT, FlowControl

from mistral_serving.errors import RequestError
from mistral_serving.http.scope_keys import CUT_EXTENSION, LEFT_EXTENSION
from mistral_serving.http.server_state import state_headers
from mistral_serving.protocols.openai.types import openai_error_body
from mistral_serving.settings import Settings

log = logging.getLogger(__name__)

LINGER_SECONDS = 2.0  # after a refusal: how long the client's input is still read
FD_HEADROOM = 256  # descriptors besides connections: model files, pipes, engine workers

# What a kubelet probe or a Prometheus scrape asks for (GET only).
PROBE_PATH = re.compile(r"/|/health|/ping|/version|/metrics/?|/v1/models/[^/:]+(/loaded)?")

_CYCLES = (httptools_impl.RequestResponseCycle,)


def is_probe(scope: dict[str, Any]) -> bool:
    return scope.get("method") in ("GET", "HEAD") and bool(PROBE_PATH.fullmatch(scope["path"]))


@functools.cache
def _metrics(prefix: str, registry: CollectorRegistry) -> tuple[Counter, Gauge]:
    closed = Counter(
        f"{prefix}http_connections_closed",
        "Client connections the server closed or refused, by reason: header_too_large, "
        "too_many_headers, header_timeout, idle_timeout, evicted (idle, to make room), "
        "over_capacity, probes_only, upgrade (a request to switch protocols, answered as "
        "HTTP/1.1, then closed), body_unread (answered before its body arrived).",
        ["reason"],
        registry=registry,
    )
    open_ = Gauge(f"{prefix}http_connections", "Open client connections.", registry=registry)
    return closed, open_


@dataclass
class Limits:
    max_header_bytes: int
    max_header_count: int
    header_timeout_s: float
    keepalive_timeout_s: float
    max_connections: int
    probe_reserve: int
    send_buffer_bytes: int
    closed: Counter
    open: Gauge
    # Open connections, oldest first (dicts keep insertion order).
    connections: dict[Any, None] = field(default_factory=dict)

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        registry: CollectorRegistry = REGISTRY,
        max_connections: int | None = None,
    ) -> Limits:
        """`max_connections`: the cap in force when the open-file limit holds fewer than
        the setting's (`fit_connections`)."""
        closed, open_ = _metrics(settings.metrics_prefix, registry)
        return cls(
            max_header_bytes=settings.max_header_bytes,
            max_header_count=settings.max_header_count,
            header_timeout_s=settings.header_timeout_seconds,
            keepalive_timeout_s=settings.keepalive_timeout_seconds,
            max_connections=max_connections or settings.max_connections,
            probe_reserve=settings.probe_reserve_connections,
            send_buffer_bytes=settings.stream_buffer_bytes,
            closed=closed,
            open=open_,
        )

    @property
    def regular(self) -> int:
        """Connections that may serve anything; the rest of the cap is for probes."""
        return self.max_connections - self.probe_reserve

    def admit(self, conn: Any) -> str:
        """ "ok", "probes" (serve probes only) or "refuse" for a new connection."""
        if len(self.connections) >= self.regular:
            self._evict_idle()
        n = len(self.connections)
        self.connections[conn] = None
        self.open.set(len(self.connections))
        if n >= self.max_connections:
            return "refuse"
        return "probes" if n >= self.regular else "ok"

    def release(self, conn: Any) -> None:
        if self.connections.pop(conn, 0) is None:
            self.open.set(len(self.connections))

    def _evict_idle(self) -> None:
        for conn in self.connections:
            if conn.idle():
                self.count("evicted")
                conn.evict()
                return

    def count(self, reason: str) -> None:
        self.closed.labels(reason).inc()


def raise_fd_limit(max_connections: int) -> int:
    """Raise this process's soft RLIMIT_NOFILE (up to the hard limit, which needs no
    privilege) so that `max_connections` fit with room for the rest; returns the soft
    limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = max_connections + FD_HEADROOM
    if soft != resource.RLIM_INFINITY and soft < need:
        new = need if hard == resource.RLIM_INFINITY else min(need, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
        soft = new
    return soft


def fit_connections(max_connections: int, probe_reserve: int) -> int:
    """The connection cap this process can honour: `max_connections`, or fewer (with a
    warning) when the open-file limit, raised as far as it goes, holds fewer. A cap past
    the limit would fail accepts (EMFILE) for everyone, the kubelet's probes included,
    instead of answering the probes from their reserve."""
    soft = raise_fd_limit(max_connections)
    if soft == resource.RLIM_INFINITY or soft >= max_connections + FD_HEADROOM:
        return max_connections
    cap = max(soft - FD_HEADROOM, probe_reserve + 1)
    log.warning(
        "open-file limit %d holds %d connections besides %d other descriptors: "
        "max_connections %d is lowered to %d (raise `ulimit -n` (nofile) for the container)",
        soft,
        cap,
        FD_HEADROOM,
        max_connections,
        cap,
    )
    return cap


def refusal_parts(status: int, message: str) -> tuple[list[tuple[bytes, bytes]], bytes]:
    """Headers and OpenAI-shaped JSON body of a refusal that closes the connection."""
    body = json.dumps(openai_error_body(RequestError(message, status))).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
    ]
    if status == 503:  # every 503 says the server's state (server_state.py)
        headers += state_headers()
    return headers, body


def refusal(status: int, message: str) -> bytes:
    """The refusal as a whole HTTP/1.1 answer (written before any parser state exists)."""
    headers, body = refusal_parts(status, message)
    lines = [f"HTTP/1.1 {status} {HTTPStatus(status).phrase}".encode()]
    lines += [name + b": " + value for name, value in headers]
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


class _TooManyHeaders(Exception):
    pass


def _cut(cycle: Any, transport: asyncio.Transport, abort: bool) -> None:
    """End this response unfinished, on purpose: uvicorn sends nothing more for it and does
    not report "ASGI callable returned without completing response" (its check skips a
    disconnected cycle). `abort` drops what is still buffered (a client that does not
    read); otherwise it is flushed, then the connection closes."""
    cycle.disconnected = True
    cycle.keep_alive = False
    if abort:
        transport.abort()
    else:
        transport.close()


class _Guarded:
    """The limits, mixed in before uvicorn's protocol class (see `protocol_class`)."""

    limits: ClassVar[Limits]
    # Provided by uvicorn's protocol classes.
    transport: asyncio.Transport
    loop: asyncio.AbstractEventLoop
    app: Any
    cycle: Any
    timeout_keep_alive_task: asyncio.TimerHandle | None
    _unset_keepalive_if_required: Callable[[], None]

    def connection_made(self, transport: asyncio.Transport) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        self._bound_send_buffers(transport)
        self._header_bytes = 0
        self._headers_seen = 0  # completed request heads: tells a new head from the old
        self._header_timer: asyncio.TimerHandle | None = None
        self._refused = False
        self._upgrade_asked = False  # a request asked to switch protocols: close after it
        self._on_left: Callable[[], None] | None = None  # the response in progress's watcher
        self._app = self.app
        self.app = self._serve
        verdict = self.limits.admit(self)
        self._probes_only = verdict == "probes"
        if verdict == "refuse":
            self._refuse(503, "the server has too many open connections", "over_capacity")
            return
        self._arm_idle()

    def _bound_send_buffers(self, transport: asyncio.Transport) -> None:
        """What a client that does not read can make this connection hold: the kernel's
        send buffer (Linux doubles the value; autotuning would let it grow to
        tcp_wmem's 4 MiB) and the transport's, past which uvicorn's send waits."""
        size = self.limits.send_buffer_bytes
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, size)
        transport.set_write_buffer_limits(high=size)

    def connection_lost(self, exc: Exception | None) -> None:
        self.limits.release(self)
        self._cancel_header_timer()
        super().connection_lost(exc)  # type: ignore[misc]
        on_left, self._on_left = self._on_left, None
        if on_left is not None:
            on_left()

    def _watch(self, cycle: Any, callback: Callable[[], None]) -> Callable[[], None]:
        """Run `callback` once if the connection closes before this response is complete
        (the LEFT_EXTENSION), at once if it already has; returns what stops watching."""
        if cycle.disconnected:  # it left while the request was being prepared
            callback()
            return lambda: None
        self._on_left = callback
        # A read paused after a large body would hide the client's EOF until a write fails.
        cycle.flow.resume_reading()

        def unwatch() -> None:
            if self._on_left is callback:
                self._on_left = None

        return unwatch

    # ---- what the cap asks of a connection ----

    def idle(self) -> bool:
        """No request in progress: waiting for one (or for the rest of its headers)."""
        busy = self.cycle is not None and not self.cycle.response_complete
        return not busy and not self._refused and not self.transport.is_closing()

    def evict(self) -> None:
        self.limits.release(self)  # its place is free now, not when the close completes
        self._refused = True
        self._cancel_header_timer()
        self.transport.close()

    # ---- parser hooks ----

    def _reading_headers(self) -> bool:
        raise NotImplementedError

    def data_received(self, data: bytes) -> None:
        self._feed(data)

    def _feed(self, data: bytes) -> None:
        """The header bounds, then uvicorn's parser."""
        if self._refused or self._upgrade_asked:
            return  # read and dropped until the client closes or the linger ends
        if not self._reading_headers():
            super().data_received(data)  # type: ignore[misc]
            return
        if self._header_timer is None and data:
            self._header_timer = self.loop.call_later(
                self.limits.header_timeout_s, self._header_timeout
            )
        room = self.limits.max_header_bytes - self._header_bytes
        seen = self._headers_seen
        if room > 0:
            self._header_bytes += min(room, len(data))
            super().data_received(data[:room])  # type: ignore[misc]
        if len(data) <= room or self._refused or self.transport.is_closing():
            return
        if self._headers_seen == seen:
            limit = self.limits.max_header_bytes
            self._refuse(431, f"request headers are larger than {limit} bytes", "header_too_large")
            return
        self._feed(data[room:])  # the head fitted: the rest is body or a new request

    def _headers_done(self) -> None:
        self._headers_seen += 1
        self._header_bytes = 0
        self._cancel_header_timer()

    # ---- protocol upgrades ----

    def _should_upgrade_to_ws(self) -> bool:
        # The server speaks no WebSocket: uvicorn's upgrade hands the transport to another
        # protocol object, so this one's `connection_lost` (which frees the connection's
        # place in the cap) would never run.
        return False

    def _unsupported_upgrade_warning(self) -> None:
        # Any client can ask (WebSocket, h2c, CONNECT): no log line, a count. The request
        # is answered as plain HTTP/1.1 (RFC 9110 lets a server ignore Upgrade), then the
        # connection closes: what the parser makes of the bytes after it is not HTTP.
        if not self._upgrade_asked:
            self._upgrade_asked = True
            self.limits.count("upgrade")

    def _too_many_headers(self) -> None:
        limit = self.limits.max_header_count
        self._refuse(431, f"more than {limit} request headers", "too_many_headers")

    # ---- timers ----

    def _arm_idle(self) -> None:
        # uvicorn's own keep-alive slot: its data_received cancels it when bytes arrive.
        self._unset_keepalive_if_required()
        self.timeout_keep_alive_task = self.loop.call_later(
            self.limits.keepalive_timeout_s, self.timeout_keep_alive_handler
        )

    def timeout_keep_alive_handler(self) -> None:
        if not self.transport.is_closing():
            self.limits.count("idle_timeout")
        super().timeout_keep_alive_handler()  # type: ignore[misc]

    def _header_timeout(self) -> None:
        self._header_timer = None
        if self._refused or self.transport.is_closing():
            return
        if not self.idle():  # a pipelined head during a response: close after it
            self.cycle.keep_alive = False
            return
        message = f"request headers did not arrive within {self.limits.header_timeout_s:g}s"
        self._refuse(408, message, "header_timeout")

    def _cancel_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    # ---- answers ----

    def _refuse(self, status: int, message: str, reason: str) -> None:
        self.limits.count(reason)
        self.limits.release(self)  # a lingering refused connection takes no place
        self._refused = True
        self._cancel_header_timer()
        self._unset_keepalive_if_required()
        transport = self.transport
        transport.write(refusal(status, message))
        if transport.can_write_eof():
            transport.write_eof()
            self.loop.call_later(LINGER_SECONDS, transport.abort)
        else:
            transport.close()

    async def _serve(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """The app, per request: the cut extension, and probes only on a reserve slot."""
        if scope["type"] == "http":
            cycle = getattr(send, "__self__", None)
            if isinstance(cycle, _CYCLES):
                if self._upgrade_asked:
                    cycle.keep_alive = False  # answered with `connection: close`
                cut = functools.partial(_cut, cycle, self.transport)
                scope["extensions"] = {
                    **(scope.get("extensions") or {}),
                    CUT_EXTENSION: cut,
                    LEFT_EXTENSION: functools.partial(self._watch, cycle),
                }
            if self._probes_only and not is_probe(scope):
                self.limits.count("probes_only")
                headers, body = refusal_parts(503, "the server has too many open connections")
                await send({"type": "http.response.start", "status": 503, "headers": headers})
                await send({"type": "http.response.body", "body": body})
                return
        await self._app(scope, receive, send)


class _HeldFlow(FlowControl):
    """uvicorn's flow control, except that reading stays paused while the connection holds
    input it has not parsed yet: uvicorn resumes reading after every response and on every
    `receive()`, which let a pipelining client make it parse (and queue) without bound."""

    def __init__(self, transport: asyncio.Transport, protocol: _HttpTools) -> None:
        super().__init__(transport)
        self._protocol = protocol

    def resume_reading(self) -> None:
        if self._protocol.holds_input():
            self._protocol.wake()  # what is held is parsed first (reading resumes after)
            return
        super().resume_reading()


class _HttpTools(_Guarded, httptools_impl.HttpToolsProtocol):
    """uvicorn's httptools protocol parses every request a read holds at once and queues
    the pipelined ones (each a task-to-be with its scope and buffers: a megabyte of
    back-to-back `GET /` became ~120 MB). Here input is parsed one request head at a time,
    and the next head only once the previous response is complete (as uvicorn's h11
    protocol did); what arrives meanwhile waits unparsed, with reading paused, so a
    connection holds at most one read (plus the kernel's buffer) besides its request."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._in_headers = True
        self._header_count_exceeded = False
        self._held = bytearray()  # read, not yet parsed
        self._fed_tail = b""  # the last bytes parsed: a head's end may straddle two reads
        self._waking = False
        super().connection_made(transport)
        self.flow = _HeldFlow(transport, self)

    def connection_lost(self, exc: Exception | None) -> None:
        self._held.clear()
        super().connection_lost(exc)

    def _reading_headers(self) -> bool:
        return self._in_headers

    def data_received(self, data: bytes) -> None:
        if self._refused or self._upgrade_asked:
            return
        self._held += data
        self._pump()

    def holds_input(self) -> bool:
        return bool(self._held)

    def wake(self) -> None:
        """Parse what is held, soon (uvicorn asks from inside a response's `send`)."""
        if not self._waking:
            self._waking = True
            self.loop.call_soon(self._woken)

    def _woken(self) -> None:
        self._waking = False
        self._pump()

    def _must_wait(self) -> bool:
        cycle = self.cycle
        if cycle is None:
            return False
        if self._in_headers:  # the next bytes begin a new request
            return not cycle.response_complete
        return len(cycle.body) > HIGH_WATER_LIMIT  # the app has not taken the body yet

    def _pump(self) -> None:
        held = self._held
        while held:
            if self._refused or self._upgrade_asked or self.transport.is_closing():
                held.clear()
                return
            if self._must_wait():
                FlowControl.pause_reading(self.flow)
                return
            n = self._next_piece()
            piece = bytes(held[:n])
            del held[:n]
            self._fed_tail = (self._fed_tail + piece)[-3:]
            self._feed(piece)
        FlowControl.resume_reading(self.flow)  # nothing held: reading as uvicorn decides

    def _next_piece(self) -> int:
        """How many held bytes to parse next: up to the end of the first request head
        (CRLFCRLF, which ends every head; llhttp accepts no bare LF), so that one call
        completes at most one head; all of them when no head ends there."""
        held = self._held
        tail = self._fed_tail
        at = (tail + bytes(held[:3])).find(b"\r\n\r\n")
        if at != -1:
            return at + 4 - len(tail)
        at = held.find(b"\r\n\r\n")
        return len(held) if at == -1 else at + 4

    def on_header(self, name: bytes, value: bytes) -> None:
        if len(self.headers) >= self.limits.max_header_count:
            self._header_count_exceeded = True
            raise _TooManyHeaders  # httptools stops parsing: uvicorn answers 400 (below)
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_headers = False
        self._headers_done()
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._in_headers = True  # what comes next is the next request's head
        super().on_message_complete()

    def on_response_complete(self) -> None:
        cycle = self.cycle
        if cycle is not None and cycle.more_body and not self.transport.is_closing():
            # Answered before its body arrived (401, 404, a GET with a body): the rest of
            # that body would be read with no timer running. Closing is what h11 did.
            self.limits.count("body_unread")
            self.transport.close()
        super().on_response_complete()

    def send_400_response(self, msg: str) -> None:
        if self._header_count_exceeded:
            self._too_many_headers()
            return
        super().send_400_response(msg)


def protocol_class(limits: Limits) -> type[asyncio.Protocol]:
    """uvicorn's httptools protocol with `limits` (pass it as `Config(http=...)`)."""
    return type("LimitedHttpTools", (_HttpTools,), {"limits": limits})
