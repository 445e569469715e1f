"""http/limits.py on uvicorn's real httptools protocol class with a fake
transport: the header bound holds however the bytes are split (431, never the parser's
own buffering past it), the count bound, the probe-only reserve and idle eviction, and
arbitrary bytes never raise or get a 5xx."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from uvicorn.config import Config
from uvicorn.server import ServerState

from mistral_serving.http.limits import (
    FD_HEADROOM,
    Limits,
    fit_connections,
    is_probe,
    protocol_class,
    raise_fd_limit,
)
from mistral_serving.http.scope_keys import LEFT_EXTENSION
from mistral_serving.settings import Settings

MAX_BYTES = 2048


class FakeTransport:
    def __init__(self) -> None:
        self.written = bytearray()
        self.closing = False
        self.eof = False
        self.aborted = False
        self.paused = False

    def write(self, data: bytes) -> None:
        self.written += data

    def close(self) -> None:
        self.closing = True

    def abort(self) -> None:
        self.closing = self.aborted = True

    def is_closing(self) -> bool:
        return self.closing

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        self.eof = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 1), "sockname": ("127.0.0.1", 2)}.get(name, default)

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self.high = high

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False


async def ok_app(scope: dict, receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    while scope["method"] == "POST":  # a request is in progress until its body is in
        message = await receive()
        if not message.get("more_body", False):
            break
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


def make_limits(**overrides: Any) -> Limits:
    values = {"max_header_bytes": MAX_BYTES, "max_header_count": 10} | overrides
    return Limits.from_settings(Settings(**values), CollectorRegistry())


class World:
    """One event loop, one uvicorn server state, connections made on demand."""

    def __init__(self, limits: Limits, app: Any = ok_app) -> None:
        self.loop = asyncio.new_event_loop()
        self.limits = limits
        self.cls = protocol_class(limits)
        self.config = Config(app=app, http=self.cls, lifespan="off", log_level="critical")
        self.config.load()
        self.state = ServerState()

    def connect(self) -> tuple[Any, FakeTransport]:
        proto = self.cls(config=self.config, server_state=self.state, app_state={}, _loop=self.loop)
        transport = FakeTransport()
        proto.connection_made(transport)
        return proto, transport

    def settle(self) -> None:
        self.loop.run_until_complete(asyncio.sleep(0.01))

    def close(self) -> None:
        for task in asyncio.all_tasks(self.loop):
            task.cancel()
        self.loop.run_until_complete(asyncio.sleep(0))
        self.loop.close()


@pytest.fixture
def world() -> Iterator[World]:
    w = World(make_limits())
    yield w
    w.close()


def feed(proto: Any, data: bytes, cuts: list[int]) -> None:
    last = 0
    for cut in sorted({c % (len(data) + 1) for c in cuts}) + [len(data)]:
        if cut > last:
            proto.data_received(data[last:cut])
            last = cut


def head(value_size: int) -> bytes:
    return b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"v" * value_size + b"\r\n\r\n"


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(size=st.integers(0, 3 * MAX_BYTES), cuts=st.lists(st.integers(0, 10**6), max_size=40))
def test_the_header_bound_holds_however_the_bytes_are_split(
    world: World, size: int, cuts: list[int]
) -> None:
    proto, transport = world.connect()
    data = head(size)
    feed(proto, data, cuts)
    world.settle()
    if len(data) > MAX_BYTES:
        assert transport.written.startswith(b"HTTP/1.1 431 ")
        assert transport.eof  # half-closed: the client reads the answer, then EOF
    else:
        assert transport.written.startswith(b"HTTP/1.1 200 "), bytes(transport.written[:80])
    proto.connection_lost(None)


def test_what_reaches_the_parser_stays_within_the_bound(world: World) -> None:
    proto, transport = world.connect()
    given_to_parser: list[int] = []
    base = next(c for c in type(proto).__mro__ if c.__module__.startswith("uvicorn."))
    original = base.data_received

    def spy(self: Any, data: bytes) -> None:
        given_to_parser.append(len(data))
        original(self, data)

    base.data_received = spy
    try:
        proto.data_received(b"GET / HTTP/1.1\r\nHost: x\r\n")
        for _ in range(100):
            proto.data_received(b"X-Flood: " + b"a" * 100 + b"\r\n")
    finally:
        base.data_received = original
    assert sum(given_to_parser) <= MAX_BYTES
    assert transport.written.startswith(b"HTTP/1.1 431 ")
    proto.connection_lost(None)


def test_too_many_headers(world: World) -> None:
    proto, transport = world.connect()
    lines = b"".join(b"X-%d: 1\r\n" % i for i in range(11))
    proto.data_received(b"GET / HTTP/1.1\r\nHost: x\r\n" + lines + b"\r\n")
    world.settle()
    assert transport.written.startswith(b"HTTP/1.1 431 ")
    assert b"more than 10 request headers" in transport.written
    proto.connection_lost(None)


def test_reserve_serves_probes_only_and_idle_ones_make_room() -> None:
    w = World(make_limits(max_connections=4, probe_reserve_connections=2))
    try:
        busy = []
        for _ in range(2):  # the regular places, each with a request in progress
            proto, _ = w.connect()
            proto.data_received(
                b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n"
            )
            busy.append(proto)
        proto, transport = w.connect()
        proto.data_received(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"
        )
        w.settle()
        assert transport.written.startswith(b"HTTP/1.1 503 ")
        probe, probe_transport = w.connect()
        probe.data_received(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        w.settle()
        assert probe_transport.written.startswith(b"HTTP/1.1 200 ")
        # The probe connection is idle now: a new one closes it rather than being refused.
        _, newest = w.connect()
        assert probe_transport.closing and not newest.closing
    finally:
        w.close()


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.binary(max_size=4 * MAX_BYTES), cuts=st.lists(st.integers(0, 10**6), max_size=20))
def test_arbitrary_bytes_never_raise_or_get_a_5xx(
    world: World, data: bytes, cuts: list[int]
) -> None:
    proto, transport = world.connect()
    feed(proto, b"GET / HTTP/1.1\r\n" + data, cuts)
    world.settle()
    status = bytes(transport.written[9:12])
    assert not status.startswith(b"5"), bytes(transport.written[:80])
    proto.connection_lost(None)


def test_probe_paths() -> None:
    for path in ("/", "/health", "/v1/models/model", "/metrics", "/metrics/", "/ping"):
        assert is_probe({"method": "GET", "path": path})
    assert not is_probe({"method": "POST", "path": "/health"})
    assert not is_probe({"method": "GET", "path": "/v1/models/model:predict"})
    assert not is_probe({"method": "GET", "path": "/v1/models"})


def test_fd_limit_is_raised_to_fit_the_connections() -> None:
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert raise_fd_limit(8) >= min(soft, hard) if hard != resource.RLIM_INFINITY else True
    assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] >= min(8 + 256, hard)


@pytest.mark.parametrize("case", ["during", "after", "unwatched"])
def test_a_response_is_told_once_when_its_client_leaves(case: str) -> None:
    """The LEFT_EXTENSION: the callback runs once when the connection closes during the
    response, at once when it had already closed, and never once unwatched."""
    watches: list[Any] = []

    async def streaming_app(scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        watches.append(scope["extensions"][LEFT_EXTENSION])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await asyncio.Event().wait()  # a stream that never ends by itself

    w = World(make_limits(), streaming_app)
    try:
        proto, _ = w.connect()
        proto.data_received(b"GET /stream HTTP/1.1\r\nHost: x\r\n\r\n")
        w.settle()
        (watch,) = watches
        told: list[str] = []

        def callback() -> None:
            told.append(case)

        if case == "during":
            watch(callback)
            proto.connection_lost(None)
            proto.connection_lost(None)  # a second report tells no one again
            assert told == [case]
        elif case == "after":
            proto.connection_lost(None)
            watch(callback)
            assert told == [case]
        else:
            watch(callback)()
            proto.connection_lost(None)
            assert told == []
    finally:
        w.close()


# ---- pipelining, upgrades, early answers ----


class HeldApp:
    """Answers each request when the test says so: a response stays in progress."""

    def __init__(self) -> None:
        self.scopes: list[dict[str, Any]] = []
        self.release: list[asyncio.Event] = []

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        self.scopes.append(scope)
        event = asyncio.Event()
        self.release.append(event)
        await event.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


def answers(transport: FakeTransport) -> list[bytes]:
    return [
        line.split(b" ")[1]
        for line in bytes(transport.written).split(b"\r\n")
        if line.startswith(b"HTTP/1.1 ")
    ]


def test_pipelined_requests_are_parsed_one_at_a_time() -> None:
    """10,000 heads in one read: one request is parsed (and its task made) while its
    answer is in progress; the rest waits unparsed with reading paused, then each is
    answered in order. uvicorn's own protocol queued all 10,000 at once."""
    app = HeldApp()
    w = World(make_limits(), app)
    try:
        proto, transport = w.connect()
        flood = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n" * 10_000
        proto.data_received(flood)
        w.settle()
        assert len(app.scopes) == 1 and not proto.pipeline
        assert transport.paused
        assert len(proto._held) < len(flood)  # the one head it parsed is gone
        proto.data_received(b"GET /more HTTP/1.1\r\nHost: x\r\n\r\n")  # still held
        w.settle()
        assert len(app.scopes) == 1
        for n in range(1, 4):
            app.release[n - 1].set()
            w.settle()
            assert len(app.scopes) == n + 1 and answers(transport) == [b"200"] * n
        assert not transport.closing
        proto.connection_lost(None)
        assert not w.limits.connections
    finally:
        w.close()


def test_a_head_split_across_reads_is_still_one_request_at_a_time() -> None:
    app = HeldApp()
    w = World(make_limits(), app)
    try:
        proto, _ = w.connect()
        one = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
        data = one * 50
        for cut in range(0, len(data), 7):  # every split of CRLFCRLF comes up
            proto.data_received(data[cut : cut + 7])
        w.settle()
        assert len(app.scopes) == 1 and not proto.pipeline
        for event in app.release[:]:
            event.set()
        for _ in range(60):
            w.settle()
            for event in app.release:
                event.set()
        assert len(app.scopes) == 50
    finally:
        w.close()


def test_a_pipelined_oversize_head_is_answered_after_the_answer_before_it() -> None:
    app = HeldApp()
    w = World(make_limits(), app)
    try:
        proto, transport = w.connect()
        proto.data_received(b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n" + head(3 * MAX_BYTES))
        w.settle()
        assert transport.written == b""
        app.release[0].set()
        w.settle()
        assert answers(transport) == [b"200", b"431"]
    finally:
        w.close()


UPGRADES = [
    b"GET /v1/websocket HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
    b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, HTTP2-Settings\r\n"
    b"Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAAP__\r\n\r\n",
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: upgrade\r\nUpgrade: websocket\r\n"
    b"Content-Length: 0\r\n\r\n",
]


@pytest.mark.parametrize("request_bytes", UPGRADES)
def test_an_upgrade_is_answered_as_http_then_closed_and_its_place_freed(
    request_bytes: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    """The server speaks no WebSocket: the request is answered as HTTP/1.1, the connection
    closes, and its place in the connection cap is given back; nothing is logged."""
    w = World(make_limits())
    try:
        proto, transport = w.connect()
        proto.data_received(request_bytes + b"\x81\x85garbage after the upgrade")
        w.settle()
        assert transport.written.startswith(b"HTTP/1.1 200 "), bytes(transport.written[:80])
        assert b"connection: close" in transport.written.lower()
        assert transport.closing
        assert type(proto).__mro__[0] is w.cls  # still our protocol, not a WebSocket one
        proto.connection_lost(None)
        assert not w.limits.connections
        assert w.limits.closed.labels("upgrade")._value.get() == 1
        assert not [r for r in caplog.records if r.levelname in ("WARNING", "ERROR")]
    finally:
        w.close()


async def early_404(scope: dict, receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 404, "headers": []})
    await send({"type": "http.response.body", "body": b"no"})


@pytest.mark.parametrize("method", [b"POST", b"GET"])
def test_an_answer_before_the_body_arrived_closes_the_connection(method: bytes) -> None:
    """The rest of an unread body would arrive with no timer running (the keep-alive
    timer stops at every byte, the header timer only runs for heads)."""
    w = World(make_limits(), early_404)
    try:
        proto, transport = w.connect()
        proto.data_received(method + b" /nope HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nx")
        w.settle()
        assert transport.written.startswith(b"HTTP/1.1 404 ")
        assert transport.closing
        # A body that did arrive whole keeps the connection open.
        proto, transport = w.connect()
        proto.data_received(method + b" /nope HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\nx")
        w.settle()
        assert transport.written.startswith(b"HTTP/1.1 404 ") and not transport.closing
    finally:
        w.close()


def test_the_cap_is_clamped_to_what_the_open_file_limit_holds(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A hard open-file limit of 1000: max_connections 2048 becomes 1000 - FD_HEADROOM
    (past it accepts would fail for everyone, probes included), with a warning."""
    import resource

    limit = [(256, 1000)]
    monkeypatch.setattr(resource, "getrlimit", lambda what: limit[0])
    monkeypatch.setattr(resource, "setrlimit", lambda what, value: limit.__setitem__(0, value))
    assert fit_connections(2048, 16) == 1000 - FD_HEADROOM
    assert limit[0] == (1000, 1000)  # raised as far as the hard limit lets it
    assert "max_connections 2048 is lowered to 744" in caplog.text
    assert fit_connections(500, 16) == 500  # it fits: untouched
    limits = Limits.from_settings(Settings(), CollectorRegistry(), max_connections=744)
    assert limits.max_connections == 744 and limits.regular == 744 - 16
