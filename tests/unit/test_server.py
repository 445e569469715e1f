"""server.py: BodyGuard as a pure ASGI middleware (a fake app, receive and send): 413 by
Content-Length and by counted bytes, 408 on a stalled body, a client that leaves while
sending, 404 for routes this model does not serve, errors in the route's shape, and the
body replayed to the app; then our routes (`/v1/models`, `/health`, `/version`,
`/metrics`), `DirectRoutes` (the generation routes answered by the frontend, everything else
passed on) and `extend` on a FastAPI app with a registered Frontend."""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from fastapi.testclient import TestClient
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, make_asgi_app

from mistral_serving import __version__
from mistral_serving.engines.base import EngineLimits
from mistral_serving.errors import RequestError
from mistral_serving.generation.service import GenerationService
from mistral_serving.http.frontend import Frontend
from mistral_serving.http.scope_keys import HANDLED
from mistral_serving.http.server import (
    BodyGuard,
    DirectRoutes,
    add_routes,
    error_json,
    extend,
    route_of,
)
from mistral_serving.ops.metrics import Metrics, default_metrics
from mistral_serving.settings import Settings
from mistral_serving.text.tokenizer import Tokenizer
from tests.doubles.scripted_engine import ScriptedEngine

MAX = 1000
TIMEOUT = 0.05  # only ever waited on for a body that never comes (not a timing test)
LIMITS = EngineLimits(max_input_len=32, max_seq_len=64, max_batch_size=4)

# ---- a fake ASGI world ----


class FakeApp:
    """Records what reached it and reads its whole body the ASGI way."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self.body: bytes | None = None
        self.after: dict[str, Any] | None = None

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        self.calls.append(scope)
        if scope["method"] == "POST":
            parts = []
            while True:
                message = await receive()
                parts.append(message.get("body", b""))
                if not message.get("more_body", False):
                    break
            self.body = b"".join(parts)
            self.after = await receive()  # what the app sees next: the client's own
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"app", "more_body": False})


class Peer:
    """The client side: the messages it sends (then a disconnect, or nothing ever)."""

    def __init__(self, messages: list[dict[str, Any]], then: str = "disconnect") -> None:
        self.messages = list(messages)
        self.then = then  # "disconnect" | "stall"
        self.receives = 0
        self.sent: list[dict[str, Any]] = []

    async def receive(self) -> dict[str, Any]:
        self.receives += 1
        if self.messages:
            return self.messages.pop(0)
        if self.then == "stall":
            await asyncio.Event().wait()  # never set: the body never comes
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)

    @property
    def status(self) -> int | None:
        return self.sent[0]["status"] if self.sent else None

    def json(self) -> Any:
        return json.loads(b"".join(m.get("body", b"") for m in self.sent[1:]))


def chunk(body: bytes, more: bool = False) -> dict[str, Any]:
    return {"type": "http.request", "body": body, "more_body": more}


def scope_for(path: str, method: str = "POST", length: int | str | None = None) -> dict:
    headers = [(b"content-type", b"application/json")]
    if length is not None:
        headers.append((b"content-length", str(length).encode()))
    return {"type": "http", "method": method, "path": path, "headers": headers}


def guard(app: FakeApp) -> tuple[BodyGuard, list[tuple[str, str]]]:
    counted: list[tuple[str, str]] = []
    return BodyGuard(app, MAX, TIMEOUT, lambda r, why: counted.append((r, why))), counted


def drive(path: str, peer: Peer, length: int | str | None = None, method: str = "POST"):
    app = FakeApp()
    middleware, counted = guard(app)
    asyncio.run(middleware(scope_for(path, method, length), peer.receive, peer.send))
    return app, counted


# ---- routes ----


@pytest.mark.parametrize(
    ("path", "route"),
    [
        ("/v1/chat/completions", "chat_completions"),
        ("/v1/completions", "completions"),
        ("/v1/responses", "responses"),
        ("/v1/messages", "messages"),
        ("/v1/messages/count_tokens", "messages_count_tokens"),
        ("/v1/responses/resp_1", None),  # GET / DELETE only: an APIRoute of ours
        ("/v1/models/model:predict", "predict"),
        ("/v1/models/any-name:predict_binary", "predict"),
        ("/invocations", "predict"),
        ("/v1/models/model", None),
        ("/v1/models/a/b:predict", None),
        ("/v1/chat/completions/", None),
        ("/health", None),
    ],
)
def test_route_of(path: str, route: str | None) -> None:
    assert route_of(path) == route


def test_error_json_shapes() -> None:
    assert json.loads(error_json("predict", 413, "big")) == {"error": "big"}
    for route in ("chat_completions", "completions", None):
        assert json.loads(error_json(route, 408, "slow")) == {
            "error": {
                "message": "slow",
                "type": "invalid_request_error",
                "param": None,
                "code": None,
            }
        }
    assert json.loads(error_json(None, 404, "no"))["error"]["type"] == "not_found_error"
    assert json.loads(error_json("responses", 413, "big"))["error"]["type"] == (
        "invalid_request_error"
    )
    for route in ("messages", "messages_count_tokens"):
        assert json.loads(error_json(route, 413, "big")) == {
            "type": "error",
            "error": {"type": "request_too_large", "message": "big"},
        }


# ---- BodyGuard ----


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/models/model:predict"])
def test_a_body_within_the_limit_is_replayed_whole(path: str) -> None:
    peer = Peer([chunk(b"x" * 400, more=True), chunk(b"y" * 400, more=True), chunk(b"z" * 200)])
    app, counted = drive(path, peer)
    assert app.body == b"x" * 400 + b"y" * 400 + b"z" * 200  # exactly MAX bytes: allowed
    assert app.after == {"type": "http.disconnect"}  # then the client's own message
    assert peer.status == 200 and counted == []


def test_the_app_gets_the_body_in_one_message() -> None:
    seen: list[dict] = []

    async def app(scope: dict, receive: Any, send: Any) -> None:
        seen.append(await receive())

    peer = Peer([chunk(b'{"a":', more=True), chunk(b" 1}")])
    middleware = BodyGuard(app, MAX, TIMEOUT)
    asyncio.run(middleware(scope_for("/v1/completions"), peer.receive, peer.send))
    assert seen == [{"type": "http.request", "body": b'{"a": 1}', "more_body": False}]


@pytest.mark.parametrize(
    ("path", "route"),
    [("/v1/chat/completions", "chat_completions"), ("/v1/models/model:predict", "predict")],
)
def test_declared_length_over_the_limit_is_413_unread(path: str, route: str) -> None:
    peer = Peer([chunk(b"x")])
    app, counted = drive(path, peer, length=MAX + 1)
    assert peer.status == 413
    assert peer.receives == 0  # refused on the header alone
    assert app.calls == []
    assert counted == [(route, "invalid")]
    body = peer.json()
    message = body["error"] if route == "predict" else body["error"]["message"]
    assert str(MAX) in message
    headers = dict(peer.sent[0]["headers"])
    assert headers[b"content-type"] == b"application/json"
    assert headers[b"connection"] == b"close"


def test_chunked_body_over_the_limit_is_413_by_counting() -> None:
    peer = Peer([chunk(b"x" * 600, more=True), chunk(b"x" * 600, more=True), chunk(b"x")])
    app, counted = drive("/v1/chat/completions", peer)  # no Content-Length
    assert peer.status == 413
    assert app.calls == []
    assert peer.receives == 2  # stopped reading once over the limit
    assert counted == [("chat_completions", "invalid")]
    assert peer.json()["error"]["type"] == "invalid_request_error"


def test_an_understated_content_length_does_not_fool_it() -> None:
    peer = Peer([chunk(b"x" * 800, more=True), chunk(b"x" * 800)])
    app, _ = drive("/v1/completions", peer, length=10)
    assert peer.status == 413 and app.calls == []


def test_a_bad_content_length_is_ignored_and_the_body_counted() -> None:
    peer = Peer([chunk(b"{}")])
    app, _ = drive("/v1/completions", peer, length="lots")
    assert app.body == b"{}"


@pytest.mark.parametrize("first", [[], [chunk(b'{"prompt": ', more=True)]])
def test_a_stalled_body_is_408(first: list[dict]) -> None:
    peer = Peer(first, then="stall")
    app, counted = drive("/v1/models/model:predict", peer)
    assert peer.status == 408
    assert app.calls == []
    assert counted == [("predict", "invalid")]
    assert peer.json() == {"error": f"request body did not arrive within {TIMEOUT:g}s"}


def test_a_client_that_leaves_while_sending_gets_nothing() -> None:
    peer = Peer([chunk(b'{"prompt": ', more=True)], then="disconnect")
    app, counted = drive("/v1/chat/completions", peer)
    assert peer.sent == []  # nobody to answer
    assert app.calls == []
    assert counted == [("chat_completions", "client_gone")]


def test_a_passing_request_id_is_left_to_the_frontend(caplog: pytest.LogCaptureFixture) -> None:
    # An odd X-Request-Id is refused (and logged) once, by the frontend; the guard, which
    # does not answer this request, does not look at it.
    app = FakeApp()
    middleware, _ = guard(app)
    scope = scope_for("/v1/models/model:predict")
    scope["headers"].append((b"x-request-id", b"odd id " * 40))
    peer = Peer([chunk(b"{}")])
    with caplog.at_level("WARNING"):
        asyncio.run(middleware(scope, peer.receive, peer.send))
    assert app.body == b"{}"
    assert "X-Request-Id refused" not in caplog.text


@pytest.mark.parametrize(
    ("path", "shape"),
    [("/v1/chat/completions", "openai"), ("/v1/models/model:predict", "predict")],
)
def test_an_early_refusal_is_answered_before_any_body_byte(path: str, shape: str) -> None:
    app = FakeApp()
    counted: list[tuple[str, str]] = []
    refusal = RequestError(
        "server is at capacity", 429, code="rate_limit_exceeded", headers={"Retry-After": "1"}
    )
    middleware = BodyGuard(
        app, MAX, TIMEOUT, lambda r, why: counted.append((r, why)), refuse=lambda: refusal
    )
    peer = Peer([chunk(b"x" * 100, more=True)], then="stall")
    asyncio.run(middleware(scope_for(path, length=10**9), peer.receive, peer.send))
    assert peer.receives == 0 and not app.calls  # not one byte of the body was read
    assert peer.status == 429
    headers = dict(peer.sent[0]["headers"])
    assert headers[b"retry-after"] == b"1" and headers[b"x-request-id"]
    error = peer.json()["error"]
    if shape == "openai":
        assert error["type"] == "rate_limit_error" and error["code"] == "rate_limit_exceeded"
    else:
        assert error == "server is at capacity"
    assert counted == [(route_of(path), "rejected")]


@pytest.mark.parametrize("path", ["/v1/embeddings", "/hot-reload"])
def test_routes_not_served_are_404_unread(path: str) -> None:
    peer = Peer([chunk(b"x" * 5000)])
    app, counted = drive(path, peer, length=5000)
    assert peer.status == 404
    assert peer.receives == 0
    assert app.calls == []
    assert peer.json()["error"]["type"] == "not_found_error"
    assert path in peer.json()["error"]["message"]
    assert counted == []  # not one of our routes: nothing to count under


@pytest.mark.parametrize("method", ["GET", "HEAD"])
def test_gets_and_heads_pass_through_untouched(method: str) -> None:
    peer = Peer([chunk(b"x" * (MAX * 3))])  # over the limit, but not ours to read
    app, counted = drive("/v1/models", peer, length=MAX * 3, method=method)
    assert len(app.calls) == 1 and peer.status == 200
    assert counted == []


@pytest.mark.parametrize(
    ("path", "method", "status"),
    [
        ("/v1/chat/completions", "GET", 405),  # Truss's 405; its readiness route's 200 {}
        ("/v1/models/model:predict", "GET", 405),  # for GET /v1/models/model:predict
        ("/v1/completions", "PUT", 405),
        ("/v1/models/model", "POST", 404),
        ("/v1/chat/completions/", "POST", 404),
        ("/nowhere", "DELETE", 404),
        ("/v1/chat/completions\n", "POST", 400),  # Starlette's `$` matches before a newline
        ("/health\x00", "GET", 400),
    ],
)
def test_everything_else_is_refused_unread(path: str, method: str, status: int) -> None:
    """Default-deny: only a GET/HEAD or a POST to one of our routes reaches the app."""
    peer = Peer([chunk(b"x" * 10)])
    app, counted = drive(path, peer, length=10, method=method)
    assert peer.status == status and peer.receives == 0 and app.calls == []
    assert counted == []
    if status == 405:
        assert dict(peer.sent[0]["headers"])[b"allow"] == b"POST"


def test_non_http_scopes_pass_through() -> None:
    app = FakeApp()
    seen: list[str] = []

    async def lifespan_app(scope: dict, receive: Any, send: Any) -> None:
        seen.append(scope["type"])

    middleware = BodyGuard(lifespan_app, MAX, TIMEOUT)
    asyncio.run(middleware({"type": "lifespan"}, Peer([]).receive, Peer([]).send))
    assert seen == ["lifespan"] and app.calls == []


# ---- our routes on a FastAPI app ----


@pytest.fixture
def registered(tok: Tokenizer) -> Iterator[Frontend]:
    metrics = Metrics(CollectorRegistry())
    settings = Settings(served_model_name="tiny-mistral", artifact="/models/dev")
    frontend = Frontend(settings, metrics)
    engine = ScriptedEngine(limits=LIMITS)
    frontend.attach(GenerationService(settings, tok, engine, metrics=metrics))
    yield frontend


@pytest.fixture
def sigterm_recorder() -> Iterator[list[int]]:
    """A dead engine makes the process SIGTERM itself: record it instead of dying."""
    received: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: received.append(signum))
    try:
        yield received
    finally:
        signal.signal(signal.SIGTERM, previous)


def truss_like_app() -> FastAPI:
    """What Truss's app has that matters here: /metrics mounted (which redirects)."""
    app = FastAPI()
    app.mount("/metrics", make_asgi_app())
    return app


def test_models_lists_the_served_model(registered: Frontend) -> None:
    app = truss_like_app()
    add_routes(app, registered)
    answer = TestClient(app).get("/v1/models")
    assert answer.status_code == 200
    body = answer.json()
    assert body["object"] == "list"
    (model,) = body["data"]
    assert model["id"] == "tiny-mistral"
    assert model["object"] == "model"
    assert model["owned_by"] == "mistral-trt-truss"
    assert "root" not in model  # the artifact's path on disk is not the client's business
    assert "/models/dev" not in answer.text
    assert model["max_model_len"] == LIMITS.max_seq_len
    assert isinstance(model["created"], int)


def test_models_and_health_before_load() -> None:
    loading = Frontend(Settings(), Metrics(CollectorRegistry()))  # no service attached yet
    app = FastAPI()
    add_routes(app, loading)
    client = TestClient(app)
    answer = client.get("/v1/models")
    assert answer.status_code == 503
    assert answer.json()["error"]["type"] == "service_unavailable"
    assert client.get("/health").status_code == 503
    version = client.get("/version").json()
    assert version == {"version": __version__, "server": version["server"], "engine": None}


def test_health_and_version(registered: Frontend) -> None:
    app = FastAPI()
    add_routes(app, registered)
    client = TestClient(app)
    assert client.get("/health").status_code == 200
    version = client.get("/version").json()
    assert version["server"]["event_loop"] in ("asyncio", "uvloop")  # TestClient: anyio's
    assert version == {
        "version": __version__,
        "server": version["server"],
        "engine": "scripted",
        "details": registered.service.engine.info.details,
        "startup_seconds": {},
        "chat": {"format": "mistral", "tools": "fallback_json"},  # the dev tokenizer's
    }
    registered.drainer.draining = True
    assert client.get("/health").status_code == 503


def test_version_reports_each_startup_phase(registered: Frontend) -> None:
    registered.service.startup = {"artifact": 12.5, "tokenizer": 0.25, "engine": 7.0}
    app = FastAPI()
    add_routes(app, registered)
    version = TestClient(app).get("/version").json()
    assert version["startup_seconds"] == {"artifact": 12.5, "tokenizer": 0.25, "engine": 7.0}


def test_health_with_a_dead_engine_is_503_and_stops_the_process(
    registered: Frontend, sigterm_recorder: list[int]
) -> None:
    app = FastAPI()
    add_routes(app, registered)
    registered.service.engine.healthy = False  # type: ignore[union-attr]
    assert TestClient(app).get("/health").status_code == 503
    assert sigterm_recorder == [signal.SIGTERM]
    assert registered.drainer.draining


def test_metrics_is_served_without_a_redirect() -> None:
    default_metrics()  # the process's metrics, on the default registry
    plain = truss_like_app()
    # The control: Truss's mount alone redirects /metrics to /metrics/.
    assert TestClient(plain).get("/metrics", follow_redirects=False).status_code in (307, 308)
    app = truss_like_app()
    add_routes(app, Frontend(Settings(), Metrics(CollectorRegistry())))
    answer = TestClient(app).get("/metrics", follow_redirects=False)
    assert answer.status_code == 200
    assert answer.headers["content-type"] == CONTENT_TYPE_LATEST
    assert "mtt:request_finished_total" in answer.text


def test_extend_guards_bodies_counts_refusals_and_shuts_down(registered: Frontend) -> None:
    app = FastAPI()
    settings = Settings(max_body_bytes=1024, body_timeout_seconds=5)
    assert registered.service is not None
    guarded = Frontend(settings, registered.metrics)
    guarded.attach(registered.service)
    extend(app, guarded)
    with TestClient(app) as client:
        # A body at the bound reaches the frontend (which finds it is no JSON)...
        at_bound = client.post("/v1/chat/completions", content=b"x" * 1024)
        assert at_bound.status_code == 400 and "JSON" in at_bound.json()["error"]["message"]
        # ...one byte more never does.
        too_big = client.post("/v1/chat/completions", content=b"x" * 1025)
        assert too_big.status_code == 413
        assert too_big.json()["error"]["type"] == "invalid_request_error"
        assert client.post("/v1/embeddings", content=b"{}").status_code == 404
        assert client.get("/health").status_code == 200
        assert registered.service is not None and registered.service.is_healthy()
    # Leaving the app's lifespan shut the engine down.
    assert not registered.service.is_healthy()
    counts = {
        tuple(sorted(s.labels.items())): s.value
        for metric in registered.metrics.finished.collect()
        for s in metric.samples
        if s.name.endswith("_total")
    }
    # The 400 and the 413 are counted; the 404 is not one of our routes.
    assert counts == {(("finished_reason", "invalid"), ("route", "chat_completions")): 2.0}


def test_openapi_json_is_a_clean_404(registered: Frontend) -> None:
    app = truss_like_app()
    add_routes(app, registered)
    answer = TestClient(app, raise_server_exceptions=True).get("/openapi.json")
    assert answer.status_code == 404


def test_truss_499_before_the_model_is_counted_once() -> None:
    """Truss answers 499 itself when the client left after sending; the frontend never
    sees that request, so the guard counts it (client_gone). One the frontend handled is
    not counted twice."""
    counted: list[tuple[str, str]] = []

    async def truss_499(scope: dict, receive: Any, send: Any) -> None:
        await receive()
        if "handled" in scope["path"]:  # as the frontend marks what it counts
            scope[HANDLED].append(True)
        await send({"type": "http.response.start", "status": 499, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    guard = BodyGuard(truss_499, MAX, TIMEOUT, count=lambda r, why: counted.append((r, why)))

    async def call(path: str) -> None:
        messages = [{"type": "http.request", "body": b"{}", "more_body": False}]

        async def receive() -> dict:
            return messages.pop(0) if messages else {"type": "http.disconnect"}

        async def send(message: dict) -> None:
            pass

        scope = {"type": "http", "method": "POST", "path": path, "headers": []}
        await guard(scope, receive, send)

    asyncio.run(call("/v1/models/model:predict"))
    assert counted == [("predict", "client_gone")]
    asyncio.run(call("/v1/models/handled:predict"))
    assert counted == [("predict", "client_gone")]


# ---- DirectRoutes ----


def truss_route_app() -> tuple[FastAPI, list[str]]:
    """Truss's generation routes, recording which of them were reached."""
    app = FastAPI()
    reached: list[str] = []

    @app.post("/v1/completions")
    async def completions(request: Request) -> JSONResponse:
        reached.append(request.url.path)
        return JSONResponse({"truss": True})

    @app.get("/v1/completions")
    async def completions_get() -> JSONResponse:
        reached.append("GET")
        return JSONResponse({"truss": True})

    return app, reached


COMPLETION = {"prompt": "Hello", "max_tokens": 3}


@pytest.fixture
def answering(tok: Tokenizer) -> Frontend:
    """A frontend whose engine answers every request with three tokens."""
    metrics = Metrics(CollectorRegistry())
    frontend = Frontend(Settings(), metrics)
    engine = ScriptedEngine.from_ids([5, 6, 7], limits=LIMITS)
    frontend.attach(GenerationService(Settings(), tok, engine, metrics=metrics))
    return frontend


def test_direct_routes_answer_without_truss_route(answering: Frontend) -> None:
    """The frontend answers the POST itself: Truss's route is never reached (a GET is)."""
    app, reached = truss_route_app()
    assert answering.service is not None
    frontend = Frontend(Settings(), answering.metrics)
    frontend.attach(answering.service)
    extend(app, frontend)
    with TestClient(app) as client:
        answer = client.post("/v1/completions", json=COMPLETION)
        assert client.get("/v1/completions").status_code == 405  # the guard's, not Truss's
    assert answer.status_code == 200
    assert answer.json()["object"] == "text_completion"
    assert answer.headers["x-request-id"]
    assert reached == []


def test_both_agent_apis_and_their_side_routes_are_served(answering: Frontend) -> None:
    """POST /v1/responses and /v1/messages (answered by the frontend), count_tokens, and a
    stored response read, deleted and then missed, each error in its API's shape."""
    app = FastAPI()
    extend(app, answering)
    with TestClient(app) as client:
        made = client.post("/v1/responses", json={"input": "Hi", "max_output_tokens": 3})
        assert made.status_code == 200 and made.json()["object"] == "response"
        rid = made.json()["id"]
        assert client.get(f"/v1/responses/{rid}").json() == made.json()
        assert client.delete(f"/v1/responses/{rid}").json()["deleted"] is True
        gone = client.get(f"/v1/responses/{rid}")
        assert gone.status_code == 404 and gone.json()["error"]["type"] == "not_found_error"
        miss = client.post("/v1/responses", json={"input": "Hi", "previous_response_id": rid})
        assert miss.status_code == 404 and rid in miss.json()["error"]["message"]
        body = {"model": "m", "max_tokens": 3, "messages": [{"role": "user", "content": "Hi"}]}
        message = client.post("/v1/messages", json=body)
        assert message.status_code == 200 and message.json()["type"] == "message"
        count = client.post("/v1/messages/count_tokens", json=body | {"max_tokens": None})
        assert count.status_code == 400 and count.json()["type"] == "error"  # not a field there
        del body["max_tokens"]
        counted = client.post("/v1/messages/count_tokens", json=body).json()
        assert counted["input_tokens"] == message.json()["usage"]["input_tokens"]
        bad = client.post("/v1/messages", json={"messages": []})
        assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request_error"


def test_direct_routes_leave_a_loading_model_to_truss(registered: Frontend) -> None:
    """Before load() has finished Truss answers (its own 503 in the real server)."""
    app, reached = truss_route_app()
    loading = Frontend(Settings(), registered.metrics)  # no service attached
    wrapped = DirectRoutes(app, loading)
    assert TestClient(wrapped).post("/v1/completions", json=COMPLETION).json() == {"truss": True}
    assert reached == ["/v1/completions"]


def test_direct_routes_answer_a_bug_with_a_clean_500(
    answering: Frontend, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """An exception that is not a refusal is logged with its traceback and answered 500 in
    the route's shape, without the traceback; the next request is served."""
    app, reached = truss_route_app()
    wrapped = DirectRoutes(app, answering)
    real = answering.handle
    calls: list[str] = []

    async def broken(route: str, request: Request) -> Any:
        calls.append(route)
        if len(calls) == 1:
            raise RuntimeError("secret internals")
        return await real(route, request)

    monkeypatch.setattr(answering, "handle", broken)
    client = TestClient(wrapped, raise_server_exceptions=True)
    with caplog.at_level("ERROR", logger="mistral_serving.http.server"):
        failed = client.post("/v1/completions", json=COMPLETION)
    assert failed.status_code == 500
    assert failed.json()["error"]["message"] == "internal error while handling the request"
    assert "secret" not in failed.text
    assert "secret internals" in caplog.text  # the traceback went to the log
    predict = client.post("/v1/models/model:predict", json={"prompt": "Hi", "max_tokens": 2})
    assert predict.status_code == 200, predict.text
    assert "error" not in predict.json()
    assert calls == ["completions", "predict"] and reached == []


@pytest.mark.parametrize("shared", [True, False])
def test_a_front_end_of_several_listens_only_once_loaded(
    answering: Frontend, monkeypatch: pytest.MonkeyPatch, shared: bool
) -> None:
    """uvicorn listens when the lifespan's start returns: with several front-ends on one
    port that start waits for the load, so the kernel hands no connection to a front-end
    still loading (it goes to a loaded one). One front-end answers probes while loading."""
    from mistral_gpu_fallback import frontends as frontend_group

    if shared:
        monkeypatch.setenv(frontend_group.LISTEN_FD_ENV, "3")
    else:
        monkeypatch.delenv(frontend_group.LISTEN_FD_ENV, raising=False)
    assert answering.service is not None
    loading = Frontend(Settings(), answering.metrics)
    app = FastAPI()
    extend(app, loading)
    lifespan = app.router.lifespan_context(app)

    async def main() -> bool:
        started = asyncio.create_task(lifespan.__aenter__())
        await asyncio.sleep(0.3)
        before_load = started.done()
        loading.attach(answering.service)  # the load completes
        await asyncio.wait_for(started, 60)
        await lifespan.__aexit__(None, None, None)
        return before_load

    assert asyncio.run(main()) is not shared
