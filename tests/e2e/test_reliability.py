"""One request's failure is its own, the event loop never waits on a body, failures
are visible (exit status, truncated streams), ids are bounded and every request is
counted: against the real Truss server with the dev model."""

from __future__ import annotations

import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlparse

import pytest
import requests

from tests.e2e.util import scrape

pytestmark = pytest.mark.e2e

PREDICT = "/v1/models/model:predict"
STREAM = {"prompt": "Tell me a story", "max_new_tokens": 48, "streaming": True}
# Valid requests that once made sampling produce NaN and killed the engine loop.
POISON = [
    (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 1e-300},
    ),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 4, "temperature": 5e-324}),
    (PREDICT, {"prompt": "hi", "max_new_tokens": 4, "top_k": 0, "temperature": 1e-300}),
    (PREDICT, {"prompt": "hi", "max_new_tokens": 4, "top_k": 0, "top_p": 1e-300, "temperature": 2}),
    (
        PREDICT,
        {
            "prompt": "hi",
            "max_new_tokens": 4,
            "top_k": 0,
            "temperature": 2,
            "repetition_penalty": 1e-300,
            "presence_penalty": -2,
            "frequency_penalty": -2,
        },
    ),
    (
        PREDICT,
        {
            "prompt": "hi",
            "max_new_tokens": 4,
            "top_k": 0,
            "temperature": 2,
            "repetition_penalty": 10,
            "presence_penalty": 2,
            "frequency_penalty": 2,
        },
    ),
]


def _stream_text(url: str) -> bytes:
    with requests.post(url + PREDICT, json=STREAM, stream=True, timeout=300) as r:
        assert r.status_code == 200
        return b"".join(r.iter_content(chunk_size=None))


def test_extreme_sampling_values_fail_nobody(server_url: str) -> None:
    clean = _stream_text(server_url)
    with ThreadPoolExecutor(8) as pool:
        streams = [pool.submit(_stream_text, server_url) for _ in range(4)]
        poisoned = [
            pool.submit(requests.post, server_url + route, json=body, timeout=300)
            for route, body in POISON
        ]
        for f in poisoned:
            r = f.result()
            assert r.status_code == 200, r.text
        for f in streams:
            assert f.result() == clean  # greedy streams are byte-identical to a clean run
    assert requests.get(server_url + "/health", timeout=30).status_code == 200


def _send_headers(url: str, path: str, length: int) -> socket.socket:
    host = urlparse(url)
    sock = socket.create_connection((host.hostname, host.port))
    sock.sendall(
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {length}\r\n\r\n".encode()
    )
    return sock


def test_readiness_answers_while_a_20mb_body_arrives(server_url: str) -> None:
    size = 20 * 2**20
    sock = _send_headers(server_url, PREDICT, size)
    try:
        # Content-Length alone is over the limit: 413 before any byte of the body.
        reply = sock.recv(4096)
        assert reply.startswith(b"HTTP/1.1 413"), reply[:200]
    finally:
        sock.close()
    # A body with no length (chunked) is counted as it arrives; readiness answers
    # meanwhile, while the upload is still in progress.
    host = urlparse(server_url)
    sock = socket.create_connection((host.hostname, host.port))
    sock.sendall(
        b"POST " + PREDICT.encode() + b" HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    chunk = b'{"prompt": "' + b"x" * (1 << 20)
    sent = 0
    latencies = []
    try:
        while sent < size:
            try:
                sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            except OSError:
                break  # the server answered 413 and closed: fine
            sent += len(chunk)
            started = time.monotonic()
            assert requests.get(server_url + "/v1/models/model", timeout=30).status_code == 200
            latencies.append(time.monotonic() - started)
        sock.settimeout(60)
        reply = sock.recv(4096)
    finally:
        sock.close()
    assert reply.startswith(b"HTTP/1.1 413"), reply[:200]
    assert latencies  # readiness answered while the body was still arriving
    print(f"readiness during a 20 MB upload: max {max(latencies) * 1000:.1f} ms")


def test_a_half_sent_body_gets_408(start_server) -> None:
    server = start_server(body_timeout_seconds=2)
    sock = _send_headers(server.url, PREDICT, 100)
    try:
        sock.sendall(b'{"prompt": ')  # and never the rest
        sock.settimeout(120)
        reply = b""
        while chunk := sock.recv(4096):  # the server closes the connection after its answer
            reply += chunk
    finally:
        sock.close()
    assert reply.startswith(b"HTTP/1.1 408"), reply[:300]
    assert b"did not arrive within 2s" in reply
    assert requests.get(server.url + "/health", timeout=30).status_code == 200
    server.stop()


def test_long_or_odd_request_ids_are_replaced_and_not_logged(start_server) -> None:
    server = start_server()
    huge = "a" * 10_000  # within max_header_bytes (a 100 kB header gets 431: test_http_limits)
    r = requests.post(
        server.url + PREDICT,
        json={"prompt": "x", "max_new_tokens": 1},
        headers={"X-Request-Id": huge},
        timeout=60,
    )
    assert r.status_code == 200 and r.headers["X-Request-Id"] != huge
    assert len(r.headers["X-Request-Id"]) <= 128
    r = requests.post(
        server.url + PREDICT,
        json={"prompt": "x", "max_new_tokens": 1},
        headers={"X-Request-Id": "bad id with spaces"},
        timeout=60,
    )
    assert r.headers["X-Request-Id"] != "bad id with spaces"
    ok = requests.post(
        server.url + PREDICT,
        json={"prompt": "x", "max_new_tokens": 1},
        headers={"X-Request-Id": "trace-42.a:b"},
        timeout=60,
    )
    assert ok.headers["X-Request-Id"] == "trace-42.a:b"
    server.stop()
    assert "a" * 200 not in server.log()


def test_a_failed_load_exits_non_zero_with_the_reason_last(start_server) -> None:
    server = start_server(wait=False, artifact="/nonexistent/artifact")
    status = server.process.wait(180)
    assert status != 0
    last = [line for line in server.log().splitlines() if line.strip()][-1]
    assert "load failed" in last and "/nonexistent/artifact" in last, last


def test_clients_that_leave_before_the_model_sees_them_are_counted(start_server) -> None:
    server = start_server()

    def gone() -> float:
        return scrape(server.url).get(
            (
                "mtt:request_finished_total",
                (("finished_reason", "client_gone"), ("route", "predict")),
            ),
            0.0,
        )

    before = gone()
    sock = _send_headers(server.url, PREDICT, 1000)
    sock.sendall(b'{"prompt": "x"')
    time.sleep(0.2)  # not a timing assertion: only lets the bytes leave before we close
    sock.close()
    deadline = time.monotonic() + 60
    while gone() == before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert gone() == before + 1
    server.stop()


def test_concurrent_bad_and_good_requests_all_get_their_own_answer(server_url: str) -> None:
    results: dict[str, int] = {}
    lock = threading.Lock()

    def call(name: str, data: bytes) -> None:
        r = requests.post(server_url + PREDICT, data=data, timeout=120)
        with lock:
            results[name] = r.status_code

    calls = [(f"bad{i}", b"\xff" * i) for i in range(1, 6)]
    calls += [(f"good{i}", b'{"prompt": "hi", "max_new_tokens": 3}') for i in range(5)]
    threads = [threading.Thread(target=call, args=c) for c in calls]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    assert all(results[f"bad{i}"] == 400 for i in range(1, 6)), results
    assert all(results[f"good{i}"] == 200 for i in range(5)), results
