"""Operations end to end: /metrics, admission control (503 with Retry-After), dropping
waiters whose client left, and the drain on SIGTERM."""

from __future__ import annotations

import signal
import socket
import threading

import pytest
import requests

from mistral_build.local_server import raw_post
from tests.e2e.util import refuses_connections, scrape, value, wait_for, wait_idle

pytestmark = pytest.mark.e2e

PREDICT = "/v1/models/model:predict"
# uvicorn shuts down gracefully, then re-raises the SIGTERM it caught (so the exit status
# says why the process ended): -15 from Popen, 143 from a shell; 0 would be fine too.
EXITED_ON_SIGTERM = (0, -signal.SIGTERM)
METRIC_NAMES = [
    "mtt:time_to_first_token_seconds_bucket",
    "mtt:time_per_output_token_seconds_bucket",
    "mtt:e2e_request_latency_seconds_bucket",
    "mtt:request_queue_time_seconds_bucket",
    "mtt:prompt_tokens_total",
    "mtt:generation_tokens_total",
    "mtt:request_finished_total",
    "mtt:num_requests_running",
    "mtt:num_requests_waiting",
    "mtt:request_rejected_total",
    "mtt:request_prompt_tokens_bucket",
    "mtt:request_generation_tokens_bucket",
]


def test_metrics_count_tokens_and_requests(server_url):
    wait_idle(server_url)
    before = scrape(server_url)
    r = requests.post(
        server_url + PREDICT, json={"prompt": "count me", "max_new_tokens": 5}, timeout=60
    ).json()
    after = scrape(server_url)
    names = {name for name, _ in after}
    assert set(METRIC_NAMES) - {"mtt:request_rejected_total"} <= names

    def delta(name, **labels):
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0) - before.get(key, 0)

    assert delta("mtt:prompt_tokens_total") == r["usage"]["prompt_tokens"]
    assert delta("mtt:generation_tokens_total") == 5
    assert delta("mtt:request_finished_total", route="predict", finished_reason="length") == 1
    assert delta("mtt:e2e_request_latency_seconds_count", route="predict") == 1
    assert delta("mtt:time_to_first_token_seconds_count", route="predict") == 1


def _stream(url: str, n_tokens: int) -> requests.Response:
    return requests.post(
        url + PREDICT,
        stream=True,
        timeout=120,
        json={"prompt": "busy", "max_new_tokens": n_tokens, "streaming": True},
    )


def test_overload_is_refused_at_once_with_503_and_retry_after(start_server):
    server = start_server(max_inflight=2, max_waiting=2)
    # Two long streams hold both slots; two short requests wait for them.
    holders = [_stream(server.url, 100_000) for _ in range(2)]
    # Keep the readers: dropping one closes its connection (urllib3), which aborts it.
    readers = [h.iter_content(chunk_size=None) for h in holders]
    for reader in readers:
        assert next(reader)
    waited: list[int] = []
    waiters = [
        threading.Thread(
            target=lambda: waited.append(
                requests.post(
                    server.url + PREDICT, json={"prompt": "w", "max_new_tokens": 2}, timeout=600
                ).status_code
            )
        )
        for _ in range(2)
    ]
    for t in waiters:
        t.start()
    wait_for(lambda: value(server.url, "mtt:num_requests_waiting") == 2, 120, "two waiters")
    # Everything beyond 2 running + 2 waiting is refused at once, whatever the body.
    refused = [
        requests.post(
            server.url + PREDICT, json={"prompt": "x" * n, "max_new_tokens": 4}, timeout=120
        )
        for n in (1, 10, 1000, 100_000, 1, 1)
    ]
    assert [r.status_code for r in refused] == [503] * 6  # saturated: retry another pod
    assert all(r.headers["retry-after"] == "1" and "capacity" in r.json()["error"] for r in refused)
    assert all(r.headers["x-server-state"] == "ready" for r in refused)
    assert value(server.url, "mtt:request_rejected_total", reason="queue_full") == 6
    for h in holders:
        h.close()  # the slots free up: the waiters are served
    for t in waiters:
        t.join(600)
    assert waited == [200, 200]
    server.stop()


def test_a_waiting_request_whose_client_left_is_dropped(start_server):
    server = start_server(max_inflight=1, max_waiting=4)
    holder = _stream(server.url, 4000)
    reader = holder.iter_content(chunk_size=None)
    assert next(reader)
    # A raw request: it waits for the single slot, so no response headers would come.
    waiter = raw_post(server.url, PREDICT, {"prompt": "wait", "max_new_tokens": 10})
    wait_for(lambda: value(server.url, "mtt:num_requests_waiting") == 1, what="a waiter")
    waiter.close()
    wait_for(lambda: value(server.url, "mtt:num_requests_waiting") == 0, what="the waiter to go")
    assert value(server.url, "mtt:num_requests_running") == 1
    holder.close()
    server.stop()


def test_sigterm_drains_streams_within_the_grace_period(start_server):
    server = start_server(drain_grace_seconds=60)
    streams = [_stream(server.url, 400) for _ in range(3)]
    readers = [s.iter_content(chunk_size=None) for s in streams]
    for reader in readers:
        assert next(reader)
    server.process.send_signal(signal.SIGTERM)
    # The listener is closed (not ready) once the server has handled the signal.
    wait_for(lambda: refuses_connections(server.url), what="the listener to close")
    texts = [b"".join(reader) for reader in readers]
    assert server.process.wait(60) in EXITED_ON_SIGTERM
    log = server.log()
    assert log.count('"output_tokens": 400') == 3  # every stream ran to its end
    assert log.count('"finish_reason": "length"') == 3 and "Finished server process" in log
    assert all(texts)


def test_sigterm_aborts_what_outlasts_the_grace_period(start_server):
    server = start_server(drain_grace_seconds=1)
    stream = _stream(server.url, 4000)
    reader = stream.iter_content(chunk_size=None)
    assert next(reader)
    server.process.send_signal(signal.SIGTERM)
    # The grace period aborts the request: the body ends without HTTP's closing chunk,
    # so the client can tell the answer was cut.
    with pytest.raises(requests.exceptions.ChunkedEncodingError):
        b"".join(reader)
    assert server.process.wait(60) in EXITED_ON_SIGTERM
    log = server.log()
    assert '"finish_reason": "abort"' in log
    assert "ASGI callable returned without completing response" not in log  # by design
    assert "shutting the engine down" in log  # Engine.shutdown() ran as the server stopped
    assert "Finished server process" in log


def test_the_server_runs_on_uvloop_with_the_httptools_parser(server_url):
    # Truss's own start runs h11 on a stdlib asyncio loop; the launcher's are faster.
    version = requests.get(server_url + "/version", timeout=30).json()
    assert version["server"] == {"event_loop": "uvloop", "http_parser": "httptools"}
    assert version["engine"] and version["details"]


def _access_line_requests(url: str) -> None:
    """A streamed and a plain completion (each writes the per-request line), a GET, and a
    body refused by its declared size before it is read (no request line)."""
    body = {"prompt": "Hi", "max_tokens": 3}
    for rid, stream in (("access-streamed", True), ("access-plain", False)):
        r = requests.post(
            url + "/v1/completions",
            json=body | {"stream": stream},
            headers={"X-Request-Id": rid},
            timeout=60,
        )
        assert r.status_code == 200 and r.content
    assert requests.get(url + "/v1/models", timeout=30).status_code == 200
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 900000000\r\n\r\n"
        )
        assert sock.recv(64).startswith(b"HTTP/1.1 413")


def test_a_generation_request_logs_its_line_and_the_access_line(start_server):
    server = start_server()
    _access_line_requests(server.url)
    wait_for(lambda: "access-plain" in server.log(), what="the request lines")
    log = server.log()
    for rid in ("access-streamed", "access-plain"):
        assert log.count(f'"request_id": "{rid}"') == 1  # the per-request line
    assert log.count("Handled request: POST /v1/completions HTTP/1.1 200") == 2
    assert "Handled request: GET /v1/models HTTP/1.1 200" in log
    assert "Handled request: POST /v1/completions HTTP/1.1 413" in log
