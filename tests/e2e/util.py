"""Helpers for the end-to-end tests: read /metrics and wait for server state (a raw
request whose connection the test closes itself: `mistral_build.local_server.raw_post`)."""

from __future__ import annotations

import time
from collections.abc import Callable

import requests
from prometheus_client.parser import text_string_to_metric_families


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """{(sample name, sorted labels): value} for every sample."""
    text = requests.get(f"{url}/metrics", timeout=60).text  # a busy server answers late
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(url: str, name: str, **labels: str) -> float:
    return scrape(url).get((name, tuple(sorted(labels.items()))), 0.0)


# How long a test waits for the server to reach a state before calling it a failure: a
# bound, never a measurement (a loaded 2-core machine can stall a process for seconds).
PATIENCE_S = 120.0


def wait_for(
    check: Callable[[], bool], timeout: float = PATIENCE_S, what: str = "condition"
) -> None:
    """Poll until `check()` holds (bounded), for state the server reaches asynchronously."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def wait_idle(url: str) -> None:
    """Nothing running or waiting on a shared server: a request an earlier test left (a
    client that went away is aborted only when the server notices) is over, so counters
    and gauges read from here on move for this test's requests alone."""
    wait_for(
        lambda: (
            value(url, "mtt:num_requests_running") == 0
            and value(url, "mtt:num_requests_waiting") == 0
        ),
        what="the shared server to be idle",
    )


def unready(url: str) -> bool:
    """The readiness probe fails: no listener, a probe that times out, or not 200 (a
    kubelet counts all three as a failure)."""
    try:
        return requests.get(f"{url}/v1/models/model", timeout=10).status_code != 200
    except requests.RequestException:
        return True


def refuses_connections(url: str) -> bool:
    """Nothing accepts a connection at `url` any more (the listener is closed)."""
    try:
        requests.get(f"{url}/v1/models/model", timeout=30)
    except requests.ConnectTimeout:
        return False  # not answered in time is not refused
    except requests.ConnectionError:
        return True
    except requests.Timeout:
        return False  # accepted, answered late
    return False


def aborted(url: str) -> float:
    """Predict requests that ended with finish_reason abort so far."""
    return value(url, "mtt:request_finished_total", route="predict", finished_reason="abort")
