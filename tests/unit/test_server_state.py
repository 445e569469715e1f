"""The lifecycle state header (http/server_state.py): the middleware stamps every 503 and
every health answer with one `X-Server-State` value; the frontend's state follows its
service (starting, ready, draining, dead: a dead or stalled engine, a failed load); the
whole server (`extend`) says it on /health and on its refusals; the connection limits' own
503s say it too."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from mistral_serving.engines.base import EngineLimits
from mistral_serving.generation.service import GenerationService
from mistral_serving.http import server_state
from mistral_serving.http.frontend import Frontend
from mistral_serving.http.limits import refusal_parts
from mistral_serving.http.server import extend
from mistral_serving.http.server_state import (
    DEAD,
    DRAINING,
    HEALTH_PATHS,
    READY,
    STARTING,
    STATE_HEADER,
    StateHeader,
)
from mistral_serving.ops.metrics import Metrics
from mistral_serving.settings import Settings
from mistral_serving.text.tokenizer import Tokenizer
from tests.doubles.scripted_engine import ScriptedEngine

LIMITS = EngineLimits(max_input_len=32, max_seq_len=64, max_batch_size=4)
KEY = STATE_HEADER.lower().encode()

pytestmark = pytest.mark.usefixtures("restore_sigterm")


def answered(status: int, headers: list[tuple[bytes, bytes]]) -> Any:
    async def app(scope: dict, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": b"x", "more_body": False})

    return app


def run(app: Any, path: str, state: str = READY, kind: str = "http") -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def receive() -> dict[str, Any]:
        return {"type": "http.disconnect"}

    scope = {"type": kind, "path": path, "method": "GET", "headers": []}
    asyncio.run(StateHeader(app, lambda: state)(scope, receive, send))
    return sent


def states_in(message: dict[str, Any]) -> list[bytes]:
    return [v for k, v in message.get("headers", ()) if k == KEY]


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from([200, 204, 400, 404, 408, 413, 429, 499, 500, 503, 504]),
    st.one_of(st.sampled_from(sorted(HEALTH_PATHS)), st.text(max_size=40).map(lambda p: "/" + p)),
    st.sampled_from(server_state.STATES),
    st.lists(st.sampled_from([b"x-server-state", b"X-Server-State", b"other"]), max_size=3),
)
def test_every_503_and_health_answer_carries_one_state(
    status: int, path: str, state: str, inner: list[bytes]
) -> None:
    """A 503 or a health answer leaves with exactly one state: the one an inner layer said
    (the deep probe's verdict), else the server's; nothing else gains one."""
    headers = [(name, b"said") for name in inner]
    start, body = run(answered(status, headers), path, state)
    stamped = status == 503 or path in HEALTH_PATHS
    if stamped:
        said = any(name.lower() == KEY for name in inner)
        expected = b"said" if said else state.encode()
        assert [v for k, v in start["headers"] if k.lower() == KEY] == [expected]
    else:
        assert start["headers"] == headers  # untouched
    assert (b"other", b"said") in start["headers"] or b"other" not in inner
    assert body["body"] == b"x"


def test_non_http_scopes_pass_through() -> None:
    calls: list[str] = []

    async def app(scope: dict, receive: Any, send: Any) -> None:
        calls.append(scope["type"])

    assert run(app, "/health", kind="lifespan") == [] and calls == ["lifespan"]


# ---- the frontend's state ----


@pytest.fixture
def served(tok: Tokenizer) -> Frontend:
    metrics = Metrics(CollectorRegistry())
    frontend = Frontend(Settings(), metrics)
    engine = ScriptedEngine(limits=LIMITS)
    frontend.attach(GenerationService(frontend.settings, tok, engine, metrics=metrics))
    return frontend


@pytest.fixture
def sigterm_recorder() -> Iterator[list[int]]:
    """A dead engine makes the process SIGTERM itself: record it instead of dying."""
    received: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: received.append(signum))
    try:
        yield received
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_state_follows_the_service(served: Frontend, monkeypatch: pytest.MonkeyPatch) -> None:
    loading = Frontend(Settings(), Metrics(CollectorRegistry()))
    assert loading.state() == STARTING
    loading.load_error = "ArtifactError: no such artifact"
    assert loading.state() == DEAD  # the process is about to exit
    assert served.state() == READY
    service = served.service
    assert service is not None
    monkeypatch.setattr(service, "stalled", lambda: "no progress for 31s")
    assert served.state() == DEAD  # hung: unready, and exiting unless it moves
    monkeypatch.undo()
    served.drainer.draining = True
    assert served.state() == DRAINING
    service.engine.healthy = False  # type: ignore[attr-defined]
    assert served.state() == DEAD  # a dead engine outranks the drain it started


def test_the_server_says_its_state_on_health_and_refusals(
    served: Frontend, sigterm_recorder: list[int]
) -> None:
    app = extend(FastAPI(), served)
    with TestClient(app) as client:
        health = client.get("/health")
        assert (health.status_code, health.headers[STATE_HEADER]) == (200, READY)
        served.drainer.draining = served.admission.draining = True  # as SIGTERM's begin()
        health = client.get("/health")
        assert (health.status_code, health.headers[STATE_HEADER]) == (503, DRAINING)
        refused = client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2})
        assert (refused.status_code, refused.headers[STATE_HEADER]) == (503, DRAINING)
        assert client.get("/version").headers.get(STATE_HEADER) is None  # a 200 elsewhere
        served.service.engine.healthy = False  # type: ignore[union-attr]
        health = client.get("/health")
        assert (health.status_code, health.headers[STATE_HEADER]) == (503, DEAD)


def test_a_loading_server_says_starting(sigterm_recorder: list[int]) -> None:
    loading = Frontend(Settings(), Metrics(CollectorRegistry()))
    with TestClient(extend(FastAPI(), loading)) as client:
        health = client.get("/health")
    assert (health.status_code, health.headers[STATE_HEADER]) == (503, STARTING)


def test_the_connection_limits_503_says_the_state_too(served: Frontend) -> None:
    extend(FastAPI(), served)  # publishes the process's state
    headers, _ = refusal_parts(503, "the server has too many open connections")
    assert (KEY, READY.encode()) in headers
    headers, _ = refusal_parts(431, "headers too large")
    assert all(k != KEY for k, _ in headers)  # only 503s carry it
