"""The client over real loopback HTTP (client.testing.FakeServer): both APIs, streaming,
retries with backoff, timeouts, readiness."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
import tenacity

from client import (
    AsyncClient,
    BadRequestError,
    Client,
    ClientConnectionError,
    ClientTimeoutError,
    RateLimitedError,
    RetryPolicy,
    ServiceUnavailableError,
)
from client.testing import DEFAULT_TOKENS, FakeServer, FakeServerState, closed_port


@pytest.fixture
def fake() -> Iterator[FakeServer]:
    with FakeServer() as server:
        yield server


def expected(n: int) -> str:
    return "".join(DEFAULT_TOKENS[i % len(DEFAULT_TOKENS)] for i in range(n))


@pytest.mark.parametrize("api", ["predict", "openai"])
def test_predict_and_stream_agree_and_keep_non_ascii(fake: FakeServer, api: str) -> None:
    with Client(fake.url, api=api) as client:
        done = client.predict("one two three", max_new_tokens=10, seed=1)
        assert done.output == expected(10)
        assert done.usage is not None and done.usage.completion_tokens == 10
        assert done.usage.prompt_tokens == 3 + 3
        stream = client.stream("one two three", max_new_tokens=10, seed=1, streaming_interval=1)
        pieces = list(stream)
        assert "".join(pieces) == done.output == stream.text
        assert "\ufffd" not in stream.text
        if api == "openai":
            assert stream.usage == done.usage
            assert stream.finish_reason == "length"
    body = fake.state.requests[-1]
    if api == "openai":
        assert body["max_tokens"] == 10 and body["stream"] is True
        assert body["stream_options"] == {"include_usage": True}
        assert body["model"] == "fake-model"  # found through GET /v1/models
        assert "streaming_interval" not in body
    else:
        assert body["max_new_tokens"] == 10 and body["streaming"] is True
        assert body["streaming_interval"] == 1 and body["seed"] == 1
        assert "temperature" not in body  # unset fields keep the server's defaults


def test_stream_reads_that_split_characters() -> None:
    # Deterministic reads: every multi-byte character cut in the middle.
    data = "Hé 世界 🙂!".encode()
    reads = [data[:2], data[2:5], data[5:8], data[8:12], data[12:14], data[14:]]

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=iter(reads))

    with Client("http://test", transport=httpx.MockTransport(handler)) as client:
        pieces = list(client.stream("x"))
    # The read holding only the middle of the emoji yields nothing (no empty piece).
    assert pieces == ["H", "é ", "世", "界 ", "🙂!"]


@pytest.mark.parametrize("api", ["predict", "openai"])
def test_chat(fake: FakeServer, api: str) -> None:
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi you"}]
    with Client(fake.url, api=api) as client:
        done = client.chat(msgs, max_new_tokens=4)
        assert done.output == expected(4)
        assert "".join(client.chat_stream(msgs, max_new_tokens=4)) == expected(4)
    assert fake.state.requests[-1]["messages"] == msgs
    assert fake.state.hits.get(
        "/v1/chat/completions" if api == "openai" else "/v1/models/model:predict"
    )


@pytest.mark.parametrize("api", ["predict", "openai"])
def test_bad_request_surfaces_server_message_without_retry(fake: FakeServer, api: str) -> None:
    with Client(fake.url, api=api, retries=3, backoff=0.01) as client:
        with pytest.raises(BadRequestError) as info:
            client.predict("x", temperature=-1)
        with pytest.raises(BadRequestError):
            client.stream("x", temperature=-1)
    assert info.value.status == 400
    assert info.value.message == "temperature must be >= 0, got -1"
    if api == "openai":
        assert info.value.param == "temperature"
    path = "/v1/completions" if api == "openai" else "/v1/models/model:predict"
    assert fake.state.hits[path] == 2  # one attempt each: 4xx is not retried


def test_unknown_sampling_field_is_rejected_locally(fake: FakeServer) -> None:
    with Client(fake.url) as client, pytest.raises(TypeError, match="max_tokens"):
        client.predict("x", max_tokens=3)


def test_retries_503_while_loading_then_succeeds() -> None:
    with (
        FakeServer(FakeServerState(loading_503=2)) as fake,
        Client(fake.url, retries=3, backoff=0.05) as client,
    ):
        start = time.monotonic()
        assert client.predict("x", max_new_tokens=2).output == expected(2)
        elapsed = time.monotonic() - start
    assert fake.state.hits["/v1/models/model:predict"] == 3
    assert elapsed >= 0.05 + 0.1  # backoff 0.05 then 0.1


def test_retries_are_bounded() -> None:
    with (
        FakeServer(FakeServerState(loading_503=10)) as fake,
        Client(fake.url, retries=2, backoff=0.01) as client,
        pytest.raises(ServiceUnavailableError, match="loading"),
    ):
        client.predict("x")
    assert fake.state.hits["/v1/models/model:predict"] == 3


def test_429_honours_retry_after() -> None:
    with (
        FakeServer(FakeServerState(rate_limit_429=1, retry_after="1")) as fake,
        Client(fake.url, retries=1, backoff=0.01) as client,
    ):
        start = time.monotonic()
        client.predict("x", max_new_tokens=1)
        assert time.monotonic() - start >= 1.0
    with (
        FakeServer(FakeServerState(rate_limit_429=5, retry_after="0")) as fake,
        Client(fake.url, retries=0) as client,
        pytest.raises(RateLimitedError) as info,
    ):
        client.predict("x")
    assert info.value.retry_after == 0.0


def test_connection_refused_retries_with_backoff_then_raises() -> None:
    url = f"http://127.0.0.1:{closed_port()}"
    with Client(url, retries=2, backoff=0.1, max_backoff=1.0) as client:
        start = time.monotonic()
        with pytest.raises(ClientConnectionError):
            client.predict("x")
        assert time.monotonic() - start >= 0.1 + 0.2


def delay(policy: RetryPolicy, attempt: int, retry_after: float | None = None) -> float:
    """The policy's wait after failed attempt number ``attempt`` (from 1), as tenacity
    asks for it."""
    state = tenacity.RetryCallState(policy.retrying(), fn=None, args=(), kwargs={})
    state.attempt_number = attempt
    error = ServiceUnavailableError("loading", retry_after=retry_after)
    state.set_exception((type(error), error, None))
    return policy.wait(state)


def test_backoff_schedule() -> None:
    policy = RetryPolicy(retries=5, backoff=0.5, max_backoff=4.0, jitter=0.0)
    assert [delay(policy, i) for i in range(1, 6)] == [0.5, 1.0, 2.0, 4.0, 4.0]
    assert delay(policy, 1, retry_after=3.0) == 3.0
    assert delay(policy, 4, retry_after=1.0) == 4.0
    assert delay(policy, 1, retry_after=1e9) == 60.0
    jittered = RetryPolicy(backoff=1.0, jitter=0.5)
    assert all(1.0 <= delay(jittered, 1) <= 1.5 for _ in range(50))


def silent_server() -> tuple[socket.socket, threading.Event, list[socket.socket]]:
    """Accepts connections and never answers; the third item lists the connections."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    stop = threading.Event()
    held: list[socket.socket] = []

    def run() -> None:
        sock.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(sock.accept()[0])
            except OSError:
                continue
        for c in held:
            c.close()

    threading.Thread(target=run, daemon=True).start()
    return sock, stop, held


def test_read_timeout_is_not_retried() -> None:
    sock, stop, held = silent_server()
    try:
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        with Client(url, timeout=0.3, retries=3) as client:
            start = time.monotonic()
            with pytest.raises(ClientTimeoutError):
                client.predict("x")
            assert time.monotonic() - start >= 0.3
            assert len(held) == 1  # one attempt: a read timeout is not retried
    finally:
        stop.set()
        sock.close()


def test_wait_until_ready_polls_through_503() -> None:
    with FakeServer(FakeServerState(loading_503=3)) as fake, Client(fake.url) as client:
        waited = client.wait_until_ready(timeout=10, interval=0.05)
        assert waited >= 0.15
        assert fake.state.hits["/v1/models/model"] == 4


def test_wait_until_ready_times_out_with_last_error() -> None:
    url = f"http://127.0.0.1:{closed_port()}"
    with Client(url) as client, pytest.raises(ClientTimeoutError, match="not ready"):
        client.wait_until_ready(timeout=0.3, interval=0.05)


def test_async_client_same_behaviour(fake: FakeServer) -> None:
    async def run() -> tuple[str, str, int]:
        async with AsyncClient(fake.url, api="openai") as client:
            await client.wait_until_ready(5)
            done = await client.predict("a b", max_new_tokens=6)
            stream = await client.stream("a b", max_new_tokens=6)
            text = "".join([p async for p in stream])
            assert stream.usage is not None
            return done.output, text, stream.usage.completion_tokens

    output, text, n = asyncio.run(run())
    assert output == text == expected(6) and n == 6
