"""HTTP attacks on raw sockets against the real Truss server (uvicorn's httptools parser):
header floods (many lines, one huge value in pieces, too many lines), slowloris, idle
connections, a full connection cap (probes still answered), clients that never read a
stream, clients that close right after sending, protocol upgrades and every other way a
connection ends (each gives its place in the cap back), and a pipelining flood.

Each server runs with tiny limits so that the attacks are cheap; every assertion is on
what the server did (a status, a closed connection, a counter), never on elapsed time.
"""

from __future__ import annotations

import contextlib
import json
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import requests

from mistral_build.local_server import LocalServer, raw_post
from tests.e2e.util import scrape, value, wait_for

pytestmark = pytest.mark.e2e

MAX_HEADER_BYTES = 4096
MAX_HEADER_COUNT = 20
MAX_CONNECTIONS = 16
PROBE_RESERVE = 4
PATIENCE_S = 90  # how long a test waits for the server to act before calling it a failure

LIMITS = {
    "max_header_bytes": MAX_HEADER_BYTES,
    "max_header_count": MAX_HEADER_COUNT,
    "header_timeout_seconds": 1,
    "keepalive_timeout_seconds": 1,
    "max_connections": MAX_CONNECTIONS,
    "probe_reserve_connections": PROBE_RESERVE,
    "stream_write_timeout_seconds": 2,
    "stream_buffer_bytes": 4096,
    "body_timeout_seconds": 120,
    "max_inflight": 1,
    "max_waiting": 0,
}


@pytest.fixture(scope="module")
def limited(start_server: Callable[..., LocalServer]) -> Iterator[LocalServer]:
    server = start_server(**LIMITS)
    yield server
    server.kill()


def connect(server: LocalServer, rcvbuf: int | None = None) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)  # before connect: window
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.settimeout(PATIENCE_S)
    sock.connect(("127.0.0.1", server.port))
    return sock


def send_until_refused(sock: socket.socket, pieces: Iterator[bytes]) -> None:
    """Send pieces until the server answers (or resets): the answer waits in our buffer."""
    sock.setblocking(False)
    try:
        for piece in pieces:
            try:
                sock.sendall(piece)
            except BlockingIOError:
                time.sleep(0.01)
            except OSError:
                return
            try:
                if sock.recv(1, socket.MSG_PEEK):
                    return
            except BlockingIOError:
                continue
            except OSError:
                return
    finally:
        sock.settimeout(PATIENCE_S)


def read_to_close(sock: socket.socket) -> bytes:
    """Everything until the server closes; a timeout here means it never did."""
    data = b""
    while True:
        try:
            part = sock.recv(65536)
        except ConnectionResetError:
            return data
        if not part:
            return data
        data += part


def closed(server: LocalServer, reason: str) -> float:
    return value(server.url, "mtt:http_connections_closed_total", reason=reason)


def finished(server: LocalServer, route: str, reason: str) -> float:
    return value(server.url, "mtt:request_finished_total", route=route, finished_reason=reason)


def healthy(server: LocalServer) -> None:
    assert requests.get(f"{server.url}/health", timeout=30).status_code == 200


HEAD = b"GET /health HTTP/1.1\r\nHost: x\r\n"


def test_header_flood_gets_431_and_close(limited: LocalServer) -> None:
    before = closed(limited, "header_too_large")
    line = b"X-Flood: " + b"a" * 1000 + b"\r\n"
    with connect(limited) as sock:
        send_until_refused(sock, iter([HEAD, *[line] * 2000]))  # 2 MB if never refused
        answer = read_to_close(sock)
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]
    assert b"request headers are larger than 4096 bytes" in answer
    assert closed(limited, "header_too_large") == before + 1
    healthy(limited)


def test_one_huge_header_value_in_pieces_gets_431(limited: LocalServer) -> None:
    before = closed(limited, "header_too_large")
    with connect(limited) as sock:
        send_until_refused(sock, iter([HEAD, b"X-Big: ", *[b"v" * 256] * 4000]))
        answer = read_to_close(sock)
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]
    assert closed(limited, "header_too_large") == before + 1
    healthy(limited)


def test_too_many_headers_get_431(limited: LocalServer) -> None:
    before = closed(limited, "too_many_headers")
    lines = b"".join(b"X-H%d: 1\r\n" % i for i in range(MAX_HEADER_COUNT + 5))
    with connect(limited) as sock:
        sock.sendall(HEAD + lines + b"\r\n")
        answer = read_to_close(sock)
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]
    assert closed(limited, "too_many_headers") == before + 1
    # At the bound it is served.
    lines = b"".join(b"X-H%d: 1\r\n" % i for i in range(MAX_HEADER_COUNT - 2))  # + Host, Connection
    with connect(limited) as sock:
        sock.sendall(HEAD + lines + b"Connection: close\r\n\r\n")
        assert read_to_close(sock).startswith(b"HTTP/1.1 200 ")


def test_slowloris_is_closed_after_the_header_timeout(limited: LocalServer) -> None:
    before = closed(limited, "header_timeout")

    def drip() -> Iterator[bytes]:
        yield HEAD + b"X-Slow: "
        for _ in range(int(PATIENCE_S / 0.2)):  # one byte every 0.2 s: under the byte bound
            time.sleep(0.2)
            yield b"z"

    with connect(limited) as sock:
        send_until_refused(sock, drip())
        answer = read_to_close(sock)
    assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
    assert closed(limited, "header_timeout") == before + 1


def test_idle_connection_is_closed(limited: LocalServer) -> None:
    before = closed(limited, "idle_timeout")
    with connect(limited) as sock:
        assert read_to_close(sock) == b""  # the server closed it; we sent nothing
    assert closed(limited, "idle_timeout") >= before + 1


def test_probes_answered_while_the_connection_cap_is_full(limited: LocalServer) -> None:
    body = b'{"prompt": "hi", "max_new_tokens": 2}'
    held = []
    try:
        # Busy connections (a body that never comes): they cannot be closed to make room.
        regular = MAX_CONNECTIONS - PROBE_RESERVE
        for _ in range(regular):
            sock = connect(limited)
            sock.sendall(
                b"POST /v1/models/model:predict HTTP/1.1\r\nHost: x\r\n"
                b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
            )
            held.append(sock)
        wait_for(
            lambda: value(limited.url, "mtt:http_connections") >= regular + 1,  # + the scrape
            what="the busy connections",
        )
        # The regular places are taken: a new connection may serve probes only.
        before = closed(limited, "probes_only")
        with connect(limited) as sock:
            sock.sendall(
                b"POST /v1/models/model:predict HTTP/1.1\r\nHost: x\r\n"
                b"Content-Length: %d\r\n\r\n" % len(body) + body
            )
            answer = read_to_close(sock)
        assert answer.startswith(b"HTTP/1.1 503 "), answer[:200]
        assert closed(limited, "probes_only") == before + 1
        for path in ("/v1/models/model", "/health", "/"):
            assert requests.get(limited.url + path, timeout=30).status_code == 200, path
        # Idle connections cannot fill the reserve: each new one closes the oldest idle one.
        evicted = closed(limited, "evicted")
        held += [connect(limited) for _ in range(PROBE_RESERVE + 4)]
        assert requests.get(limited.url + "/v1/models/model", timeout=30).status_code == 200
        assert closed(limited, "evicted") >= evicted + PROBE_RESERVE + 3
    finally:
        for sock in held:
            sock.close()


def test_a_client_that_never_reads_is_aborted(limited: LocalServer) -> None:
    before = finished(limited, "completions", "slow_reader")
    body = json.dumps(
        {
            "prompt": "Hello",
            "max_tokens": 3000,
            "ignore_eos": True,
            "logprobs": 5,
            "stream": True,
        }
    ).encode()
    with connect(limited, rcvbuf=4096) as reader:
        reader.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body) + body
        )
        # Never read. The server must give the slot back.
        wait_for(
            lambda: finished(limited, "completions", "slow_reader") == before + 1,
            timeout=PATIENCE_S,
            what="the slow reader's abort",
        )
    wait_for(lambda: value(limited.url, "mtt:num_requests_running") == 0, what="the slot")
    answer = requests.post(
        f"{limited.url}/v1/completions", json={"prompt": "Hi", "max_tokens": 2}, timeout=60
    )
    assert answer.status_code == 200, answer.text  # max_inflight 1: the slot is free
    assert "ASGI callable returned without completing response" not in limited.log()


def test_clients_that_close_right_after_sending_are_counted(limited: LocalServer) -> None:
    def total() -> float:
        samples = scrape(limited.url)
        return sum(
            v
            for (name, labels), v in samples.items()
            if name == "mtt:request_finished_total" and ("route", "predict") in labels
        )

    before = total()
    for _ in range(5):
        sock = raw_post(
            limited.url, "/v1/models/model:predict", {"prompt": "hi", "max_new_tokens": 2}
        )
        sock.close()
    wait_for(lambda: total() >= before + 5, timeout=PATIENCE_S, what="5 requests counted")
    assert total() == before + 5  # once each
    healthy(limited)


def test_generation_tokens_are_counted_as_they_stream(limited: LocalServer) -> None:
    before = value(limited.url, "mtt:generation_tokens_total")
    body = {"prompt": "Hello", "max_tokens": 3000, "ignore_eos": True, "stream": True}
    with requests.post(f"{limited.url}/v1/completions", json=body, stream=True, timeout=60) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        for _ in range(20):
            next(lines)
        # The stream is still going (3000 tokens): the counter moved already.
        assert value(limited.url, "mtt:generation_tokens_total") > before
        assert value(limited.url, "mtt:num_requests_running") == 1


# ---- every way a connection ends gives its place in the cap back ----

WEBSOCKET = (
    b"GET %s HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
)


def end_websocket(server: LocalServer, path: bytes) -> None:
    with connect(server) as sock:
        sock.sendall(WEBSOCKET % path)
        answer = read_to_close(sock)
    assert not answer.startswith(b"HTTP/1.1 101 "), answer[:200]
    assert answer.startswith(b"HTTP/1.1 "), answer[:200]


def end_h2c(server: LocalServer) -> None:
    with connect(server) as sock:
        sock.sendall(
            b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, HTTP2-Settings\r\n"
            b"Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAAP__\r\n\r\n"
        )
        assert read_to_close(sock).startswith(b"HTTP/1.1 200 ")


def end_client_close(server: LocalServer) -> None:
    with connect(server) as sock:
        sock.sendall(HEAD + b"\r\n")
        answer = b""
        while not answer.endswith(b"\r\n\r\n") and (part := sock.recv(1)):
            answer += part
        assert answer.startswith(b"HTTP/1.1 200 ")


def end_client_reset(server: LocalServer) -> None:
    sock = connect(server)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()  # a reset, mid-body


def end_bad_request(server: LocalServer) -> None:
    with connect(server) as sock:
        sock.sendall(b"\x16\x03\x01 not http at all\r\n\r\n")
        assert read_to_close(sock).startswith(b"HTTP/1.1 400 ")


def end_header_too_large(server: LocalServer) -> None:
    with connect(server) as sock:
        send_until_refused(sock, iter([HEAD, *[b"X-F: " + b"a" * 500 + b"\r\n"] * 40]))
        assert read_to_close(sock).startswith(b"HTTP/1.1 431 ")


def end_answer_before_body(server: LocalServer) -> None:
    """A body byte after the early answer stopped every timer: the server now closes."""
    with connect(server) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nContent-Length: 50\r\n\r\nx")
        answer = b""
        while b"\r\n\r\n" not in answer and (part := sock.recv(4096)):
            answer += part
        assert answer.startswith(b"HTTP/1.1 200 ")
        with contextlib.suppress(OSError):  # it may have closed already
            sock.sendall(b"y")
        read_to_close(sock)  # a timeout here: the connection was kept with no timer


def test_a_client_reset_mid_stream_logs_no_error(limited: LocalServer) -> None:
    """Clients that reset while their stream is written: counted, and no ERROR line (any
    client could write them into the log)."""
    request = (
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s"
    )
    payload = json.dumps(
        {"prompt": "Hello", "max_tokens": 2000, "ignore_eos": True, "stream": True}
    ).encode()

    def total() -> float:
        return sum(
            v
            for (name, labels), v in scrape(limited.url).items()
            if name == "mtt:request_finished_total" and ("route", "completions") in labels
        )

    before = total()
    for _ in range(10):
        sock = connect(limited)
        sock.sendall(request % (len(payload), payload))
        assert sock.recv(12).startswith(b"HTTP/1.1")  # the stream has begun
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()
        wait_for(lambda: value(limited.url, "mtt:num_requests_running") == 0, what="the abort")
    wait_for(lambda: total() >= before + 10, timeout=PATIENCE_S, what="10 requests counted")
    log = limited.log()
    assert "Exception in ASGI application" not in log
    assert " ERROR " not in log and "ERROR:" not in log, log[-3000:]


ENDINGS: dict[str, Callable[[LocalServer], None]] = {
    "websocket": lambda s: end_websocket(s, b"/v1/websocket"),
    "websocket_on_a_probe": lambda s: end_websocket(s, b"/health"),
    "websocket_on_a_generation_route": lambda s: end_websocket(s, b"/v1/completions"),
    "h2c": end_h2c,
    "client_close": end_client_close,
    "client_reset": end_client_reset,
    "bad_request": end_bad_request,
    "header_too_large": end_header_too_large,
    "answer_before_body": end_answer_before_body,
}


@pytest.mark.parametrize("ending", sorted(ENDINGS))
def test_every_way_a_connection_ends_gives_its_place_back(
    limited: LocalServer, ending: str
) -> None:
    """More connections than the cap, one after another, each ending this way: every new
    one is served, and the open-connection gauge comes back down (only the scrape's own)."""
    for _ in range(MAX_CONNECTIONS + 4):
        ENDINGS[ending](limited)
    wait_for(
        lambda: value(limited.url, "mtt:http_connections") <= 1,
        timeout=PATIENCE_S,
        what="every place given back",
    )
    healthy(limited)


# ---- a pipelining flood ----

FLOOD_BYTES = 3 * 2**20
FLOOD_SECONDS = 30  # the sending is bounded in time as well as in bytes


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_a_pipelining_flood_is_held_not_queued(limited: LocalServer) -> None:
    """3 MB of back-to-back `GET /health` on one connection (read as it is answered): the
    server answers them in order and holds the rest unparsed with reading paused, so its
    memory stays flat (uvicorn's httptools protocol queued every request at once, ~120
    bytes of memory per byte sent)."""
    one = HEAD + b"\r\n"
    flood = one * (FLOOD_BYTES // len(one))
    pid = limited.process.pid
    before = rss_bytes(pid)
    peak = before
    answered = 0
    done = threading.Event()
    with connect(limited) as sock:
        sock.settimeout(0.5)

        def read() -> None:
            nonlocal answered
            while not done.is_set():
                try:
                    part = sock.recv(65536)
                except TimeoutError:
                    continue
                except OSError:
                    return
                if not part:
                    return
                answered += part.count(b" 200 OK")

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        view = memoryview(flood)
        sent = 0
        deadline = time.monotonic() + FLOOD_SECONDS
        while sent < len(flood) and time.monotonic() < deadline:
            with contextlib.suppress(TimeoutError):  # blocked: the server holds the rest
                sent += sock.send(view[sent : sent + 65536])
            peak = max(peak, rss_bytes(pid))
        wait_for(lambda: answered >= 200, timeout=PATIENCE_S, what="answers to the flood")
        peak = max(peak, rss_bytes(pid))
        done.set()
        reader.join(timeout=PATIENCE_S)
    assert peak - before < 64 * 2**20, (sent, peak - before)
    healthy(limited)
