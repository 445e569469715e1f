"""The HTTP helpers the checks share (plain `requests`: the checks control connections
themselves), the Prometheus gauges they read and the long streams they hold open.

The checks call these through the module (`wire.predict(...)`), so a test can stand a
server in for them."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

from mistral_build.verify.config import PREDICT
from mistral_build.verify.results import CheckFailed


def _requests() -> Any:
    import requests

    return requests


def post_json(url: str, path: str, body: dict[str, Any], timeout: float = 300) -> dict[str, Any]:
    r = _requests().post(url + path, json=body, timeout=timeout)
    if r.status_code != 200:
        raise CheckFailed(f"POST {path} -> {r.status_code}: {r.text[:300]}")
    data: dict[str, Any] = r.json()
    return data


def predict(url: str, **body: Any) -> dict[str, Any]:
    return post_json(url, PREDICT, body)


def predict_stream(url: str, **body: Any) -> str:
    with _requests().post(
        url + PREDICT, json=body | {"streaming": True}, stream=True, timeout=300
    ) as r:
        if r.status_code != 200:
            raise CheckFailed(f"streaming predict -> {r.status_code}: {r.text[:300]}")
        return b"".join(c for c in r.iter_content(chunk_size=None) if c).decode()


def chat_stream(url: str, body: dict[str, Any]) -> str:
    """The content deltas of a streamed /v1/chat/completions, joined."""
    parts: list[str] = []
    with _requests().post(
        url + "/v1/chat/completions", json=body | {"stream": True}, stream=True, timeout=300
    ) as r:
        if r.status_code != 200:
            raise CheckFailed(f"streaming chat -> {r.status_code}: {r.text[:300]}")
        for line in r.iter_lines():
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            for choice in json.loads(line[6:]).get("choices") or []:
                parts.append((choice.get("delta") or {}).get("content") or "")
    return "".join(parts)


def scrape(url: str) -> list[tuple[str, dict[str, str], float]]:
    from prometheus_client.parser import text_string_to_metric_families

    text = _requests().get(url + "/metrics", timeout=10).text
    return [
        (s.name, dict(s.labels), s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]


def metric_sum(url: str, name: str, **labels: str) -> float:
    """Sum of the samples of `name` whose labels include `labels` (e.g. every route)."""
    return sum(
        v
        for n, lab, v in scrape(url)
        if n == name and all(lab.get(k) == val for k, val in labels.items())
    )


def running(url: str) -> float:
    return metric_sum(url, "mtt:num_requests_running")


def waiting(url: str) -> float:
    return metric_sum(url, "mtt:num_requests_waiting")


def aborted(url: str) -> float:
    return metric_sum(url, "mtt:request_finished_total", finished_reason="abort")


def kv_usage(url: str) -> float:
    return metric_sum(url, "mtt:kv_cache_usage_perc")


def wait_until(check: Callable[[], bool], timeout: float, interval: float = 0.1) -> bool:
    """Poll `check` until it holds or `timeout` passes (server state changes asynchronously)."""
    deadline = time.monotonic() + timeout
    while True:
        if check():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


def stream_error(chunk: bytes) -> str | None:
    """The message of an SSE `data: {"error": ...}` event at the start of `chunk`."""
    for line in chunk.split(b"\n"):
        if line.startswith(b"data: {"):
            try:
                error = json.loads(line[6:]).get("error")
            except ValueError:
                return None
            if error:
                return str(error.get("message") if isinstance(error, dict) else error)[:160]
            return None
    return None


def error_text(r: Any) -> str:
    try:
        error = r.json().get("error")
    except ValueError:
        return str(r.text[:160])
    return str(error.get("message") if isinstance(error, dict) else error)[:160]


def accepts(url: str) -> bool:
    try:
        _requests().get(url + "/v1/models/model", timeout=2)
        return True
    except Exception:
        return False


def long_stream_body(
    prompt: str, model: str, max_model_len: int, long_tokens: int
) -> dict[str, Any]:
    """A completions stream that runs to max_tokens whatever the model says (ignore_eos)."""
    room = max_model_len - 64 if max_model_len else long_tokens
    return {
        "model": model,
        "prompt": prompt,
        "max_tokens": max(16, min(long_tokens, room)),
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
    }


def open_stream(url: str, body: dict[str, Any]) -> tuple[Any, Iterator[bytes]]:
    """A started completions stream (its first chunk read): the request is in the engine.
    The reader is returned too: dropping it closes the connection, which aborts the request."""
    r = _requests().post(url + "/v1/completions", json=body, stream=True, timeout=300)
    if r.status_code != 200:
        raise CheckFailed(f"long stream -> {r.status_code}: {r.text[:200]}")
    reader = r.iter_content(chunk_size=None)
    if not next(reader, b""):
        raise CheckFailed("a long stream ended before its first chunk")
    return r, reader
