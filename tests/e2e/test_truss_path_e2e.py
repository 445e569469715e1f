"""The generation routes answer the same through our launcher's direct routes and through
Truss's own per-request wrapper, where Truss's own `main.py` runs the Truss (as a Truss
host that ignores our entry point would): two real Truss servers with the dev model, the
same requests to both. Greedy answers match token for
token (a stream's text; its split into events follows timing); refusals match in status
and body; every route still works on Truss's path (`count_tokens`, which Truss has no
route for, aside: the launcher's own)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.e2e.test_hostile_input import MUTATIONS, OUR_ROUTES, VALID, mutated

pytestmark = pytest.mark.e2e

# What differs between two answers to the same request by design.
VOLATILE = {"id", "created", "created_at", "call_id", "system_fingerprint"}
# Truss's model routes (Truss has no count_tokens route: the launcher serves it).
TRUSS_ROUTES = tuple(r for r in OUR_ROUTES if r != "/v1/messages/count_tokens")


@pytest.fixture(scope="module")
def truss_path_url(start_server: Callable[..., Any]) -> str:
    return start_server(command=[sys.executable, "main.py"]).url


def post(url: str, route: str, body: bytes) -> requests.Response:
    headers = {"content-type": "application/json", "x-request-id": "same-id"}
    return requests.post(url + route, data=body, headers=headers, timeout=60)


def comparable(answer: requests.Response) -> tuple[int, Any]:
    """Status and body, less what is different in every answer."""
    content_type = answer.headers.get("content-type", "")
    if content_type.startswith("text/event-stream"):
        return answer.status_code, _joined(answer.text)
    if content_type.startswith("application/json"):
        return answer.status_code, _strip(answer.json())
    return answer.status_code, answer.text


def _joined(sse: str) -> dict[str, Any]:
    """A stream as what it says: how its tokens fall into events depends on timing (a
    write can carry one step or two), so the text is joined and the rest kept."""
    data = [line[6:] for line in sse.splitlines() if line.startswith("data: ")]
    if data[-1] != "[DONE]":
        return _joined_named(data)
    text, rest = [], []
    for event in map(json.loads, data[:-1]):
        for choice in event.get("choices", []):
            delta = choice.get("delta") or {}
            text.append(choice.get("text") or delta.get("content") or "")
            rest.append((choice.get("finish_reason"), delta.get("role")))
        if "error" in event:
            rest.append(event["error"])
    return {"text": "".join(text), "finish": [r for r in rest if r != (None, None)]}


def _joined_named(data: list[str]) -> dict[str, Any]:
    """A Responses or Messages stream: its text joined, its last event (the whole
    Response, or message_stop) and the ending it gave."""
    events = [json.loads(d) for d in data]
    text = [e.get("delta", "") for e in events if e["type"] == "response.output_text.delta"]
    text += [e["delta"].get("text", "") for e in events if e["type"] == "content_block_delta"]
    ends = [e["delta"] for e in events if e["type"] == "message_delta"]
    # A Responses event's sequence_number counts the events before it: timing, as above.
    last = {k: v for k, v in events[-1].items() if k != "sequence_number"}
    return {"text": "".join(text), "last": _strip(last), "end": ends}


def _strip(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


@pytest.mark.parametrize("route", TRUSS_ROUTES)
@pytest.mark.parametrize("stream", [False, True])
def test_each_route_answers_the_same_on_both_paths(
    server_url: str, truss_path_url: str, route: str, stream: bool
) -> None:
    body = dict(VALID[route]) | {"temperature": 0}
    key = "streaming" if "predict" in route or route == "/invocations" else "stream"
    body[key] = stream
    raw = json.dumps(body).encode()
    direct, truss = post(server_url, route, raw), post(truss_path_url, route, raw)
    assert direct.status_code == 200, direct.text
    assert comparable(direct) == comparable(truss)
    assert direct.headers["x-request-id"] == truss.headers["x-request-id"] == "same-id"


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(**(MUTATIONS | {"route": st.sampled_from(TRUSS_ROUTES)}))
def test_mutated_bodies_get_the_same_answer_on_both_paths(
    server_url: str, truss_path_url: str, route: str, field: str, value: object, drop: bool
) -> None:
    body = mutated(VALID[route] | {"temperature": 0}, field, value, drop)
    raw = json.dumps(body).encode()
    direct, truss = post(server_url, route, raw), post(truss_path_url, route, raw)
    assert direct.status_code < 500, direct.text
    if direct.status_code == 200 and body.get("temperature") != 0:
        assert truss.status_code == 200  # sampled: the texts may differ
    else:
        assert comparable(direct) == comparable(truss)
