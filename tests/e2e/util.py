"""Helpers for the end-to-end tests: read /metrics and wait for server state (a raw
request whose connection the test closes itself: `mistral_build.local_server.raw_post`)."""

from __future__ import annotations

import time
from collections.abc import Callable

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
