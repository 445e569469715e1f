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

from mistral_serving.http.limits import Limits, is_probe, protocol_class, raise_fd_limit
from mistral_serving.http.scope_keys import LEFT_EXTENSION
from mistral_serving.settings import Settings

MAX_BYTES = 2048


class FakeTransport:
    def __init__(self) -> None:
        self.written = bytearray()
        self.closing = False
        self.eof = False
        self.aborted = False

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
        pass

    def resume_reading(self) -> None:
        pass


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
