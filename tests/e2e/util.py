"""Helpers for the end-to-end tests: read /metrics, wait for server state, send a raw
request whose connection the test closes itself."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable
from urllib.parse import urlparse

import requests
from prometheus_client.parser import text_string_to_metric_families


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """{(sample name, sorted labels): value} for every sample."""
    text = requests.get(f"{url}/metrics", timeout=10).text
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(url: str, name: str, **labels: str) -> float:
    return scrape(url).get((name, tuple(sorted(labels.items()))), 0.0)


def wait_for(check: Callable[[], bool], timeout: float = 30.0, what: str = "condition") -> None:
    """Poll until `check()` holds (bounded), for state the server reaches asynchronously."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def aborted(url: str) -> float:
    """Predict requests that ended with finish_reason abort so far."""
    return value(url, "mtt:request_finished_total", route="predict", finished_reason="abort")


def raw_post(url: str, path: str, body: dict) -> socket.socket:
    """Send a POST on a bare socket and return it unread: the test decides when the
    client goes away (close the socket) without waiting for response headers."""
    host = urlparse(url)
    data = json.dumps(body).encode()
    sock = socket.create_connection((host.hostname, host.port))
    sock.sendall(
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\n\r\n".encode()
        + data
    )
    return sock
