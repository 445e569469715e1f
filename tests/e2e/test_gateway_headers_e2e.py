"""The gateway's headers on the real Truss server: the objective's priority orders the
waiting queue (three requests queued low, none, high are served high, none, low), and the
objective, fairness id and session land on each request's log line. Nothing is timed: the
queue is filled while one stream holds the only slot, then the slot is freed."""

from __future__ import annotations

import json
import re
import socket
from urllib.parse import urlparse

import pytest
import requests

from tests.e2e.util import value, wait_for

pytestmark = pytest.mark.e2e

PREDICT = "/v1/models/model:predict"
PRIORITIES = {"interactive": 10, "batch": -10}


def queued_post(url: str, headers: dict[str, str]) -> socket.socket:
    """A POST with these headers on a bare socket: it waits in the queue, unread."""
    host = urlparse(url)
    data = json.dumps({"prompt": "queued", "max_new_tokens": 2}).encode()
    lines = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    sock = socket.create_connection((host.hostname, host.port))
    sock.sendall(
        f"POST {PREDICT} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{lines}"
        f"Content-Length: {len(data)}\r\n\r\n".encode()
        + data
    )
    return sock


def test_the_objectives_priority_orders_the_queue_and_is_logged(start_server) -> None:
    server = start_server(
        max_inflight=1,
        max_waiting=8,
        extra_env={"MTT_OBJECTIVE_PRIORITIES": json.dumps(PRIORITIES)},
    )
    holder = requests.post(
        server.url + PREDICT,
        json={"prompt": "busy", "max_new_tokens": 100_000, "streaming": True},
        stream=True,
        timeout=120,
    )
    reader = holder.iter_content(chunk_size=None)
    assert next(reader)
    arrivals = [
        ("low", {"x-llm-d-inference-objective": "batch", "x-llm-d-inference-fairness-id": "t1"}),
        ("plain", {}),
        ("high", {"x-gateway-inference-objective": "interactive", "x-session-id": "s-9"}),
    ]
    socks = []
    for n, (request_id, headers) in enumerate(arrivals, start=1):
        socks.append(queued_post(server.url, {"X-Request-Id": request_id, **headers}))
        wait_for(lambda n=n: value(server.url, "mtt:num_requests_waiting") == n, what="queued")
    holder.close()  # the slot frees: the queue is served one at a time, by priority
    for sock in socks:
        sock.settimeout(120)
        assert sock.makefile("rb").readline().startswith(b"HTTP/1.1 200")
        sock.close()
    log = server.log()
    served = re.findall(r'"request_id": "(low|plain|high)"', log)
    assert served == ["high", "plain", "low"], served
    lines = {
        rid: line
        for line in log.splitlines()
        for rid in ("low", "high")
        if f'"request_id": "{rid}"' in line
    }
    assert '"objective": "batch"' in lines["low"] and '"priority": -10' in lines["low"]
    assert '"fairness_id": "t1"' in lines["low"]
    assert '"objective": "interactive"' in lines["high"] and '"priority": 10' in lines["high"]
    assert '"session_id": "s-9"' in lines["high"]
    server.stop()
