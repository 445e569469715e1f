"""Start the real Truss server, with what it lacks for production serving.

`python -m mistral_serving.http.server` (run from the Truss app folder, as the image's command
and `make serve` do) runs Truss's own `TrussServer` with its own app, routes and uvicorn
settings, and adds, before it starts:
- `BodyGuard`, an ASGI middleware in front of every route: when the frontend refuses
  at once (503 when no slot and no queue place is free, or while draining) it answers
  before reading one body byte; a body larger than `max_body_bytes` gets 413, one that
  does not arrive within `body_timeout_seconds` gets 408, all in the route's error shape.
  Default-deny: any request but a GET or HEAD that is not a POST to one of our routes
  (POST routes Truss has but this model does not serve, `/v1/embeddings`, `/hot-reload`,
  ..., and paths only Truss's router would match) gets 404 or 405 unread.
- `GET /v1/models` (OpenAI's list, with vLLM's `max_model_len`), `GET /health` (200 when
  ready; 503 while loading, draining, or with a dead or stalled engine); every 503 and
  every /health answer says the server's state in `X-Server-State` (server_state.py),
  `GET /health/generate` (one token within a deadline: health.py),
  `GET /version`, and `GET /metrics` answered directly (Truss's mount redirects);
  `POST /v1/messages/count_tokens`, and `GET` / `DELETE /v1/responses/{id}` (stored
  Responses API answers), which Truss does not have.
- uvicorn runs on uvloop with the httptools parser (Truss's own start runs h11 on a
  stdlib asyncio loop), through `limits.py`'s protocol class: header size/count (431),
  header and idle timeouts, a connection cap with room for probes, bounded send buffers;
  the open-file limit is raised to fit.
- `DirectRoutes` serves the generation routes from the ASGI layer, calling the frontend as
  the model's methods would, without Truss's per-request wrapper (Truss's routes still
  call the model, `model/model.py`, where Truss's own `main.py` runs it).
- Requests Truss answers 499 itself (client gone after sending) are counted
  `client_gone`; `/openapi.json` is a 404; `/v1/models` does not show the artifact path.
- The settings are loaded once, here, and the process's one `Frontend` is made here: our
  routes and guards are handed it, and so is the Truss model (through the config dict
  Truss passes to its constructor as it is; `frontend.frontend_for`).
- The port is bound before the model loads (one in use ends the start at once, naming
  it). A failed `load()` ends the process with status 1 and the reason as its last log
  line (Truss alone exits 0; a traceback only for an unexpected failure), and the engine
  is shut down when the server stops.
- Logs are plain lines on a terminal and JSON elsewhere (`log_format`), with one "ready on
  http://HOST:PORT" line once loaded; Ctrl-C ends with status 0 and no teardown noise
  (`ops/console.py`).
- With `frontend_processes` above 1 this process is only the launcher of that many
  servers as above, sharing the port and one engine process (the GPU fallback package's
  `frontends.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import os
import re
import socket
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from typing import TYPE_CHECKING, Any

from fastapi import Request

from mistral_serving import __version__
from mistral_serving.artifacts.manifest import ArtifactError
from mistral_serving.engines import fallback
from mistral_serving.errors import RequestError
from mistral_serving.http import listen_socket
from mistral_serving.http.auth import (
    OPEN_METHODS,
    ApiKeyGuard,
    KeySource,
    RedactedAccessLine,
    send_json,
)
from mistral_serving.http.frontend import FRONTEND_CONFIG_KEY, Frontend
from mistral_serving.http.health import DeepProbe
from mistral_serving.http.key_limit import KeyConcurrency
from mistral_serving.http.scope_keys import HANDLED
from mistral_serving.http.server_state import StateHeader, publish
from mistral_serving.ops import console, driver
from mistral_serving.ops.record import request_id_from
from mistral_serving.ops.shutdown import exit_if_load_fails
from mistral_serving.protocols.anthropic.types import anthropic_error_body
from mistral_serving.protocols.openai.types import ModelCard, ModelList, openai_error_body
from mistral_serving.protocols.predict import predict_error_body
from mistral_serving.settings import Settings, SettingsError

if TYPE_CHECKING:
    from fastapi import FastAPI
    from truss_server import TrussServer

log = logging.getLogger(__name__)

_started = int(time.time())


# ---- the body guard ----

Scope = dict[str, Any]
Message = MutableMapping[str, Any]  # as starlette.types: a Response can send through it
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_ROUTES = {
    "/v1/chat/completions": "chat_completions",
    "/v1/completions": "completions",
    "/v1/responses": "responses",
    "/v1/messages": "messages",
    "/v1/messages/count_tokens": "messages_count_tokens",  # ours alone: Truss has no such route
}
_PREDICT = re.compile(r"/v1/models/[^/]+:predict(_binary)?|/invocations")
_ANTHROPIC = ("messages", "messages_count_tokens")
_STORED_RESPONSE = re.compile(r"/v1/responses/[^/]+")  # GET and DELETE by id (add_routes)
# Starlette's route patterns end in `$`, which also matches before a trailing newline: a
# path ending in `%0A` reached Truss's route but no exact-path guard. Such paths are
# refused before any route.
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def route_of(path: str) -> str | None:
    """Our route label for a POST path, or None when the path is not ours."""
    if path in _ROUTES:
        return _ROUTES[path]
    if _PREDICT.fullmatch(path):
        return "predict"
    return None


def stored_route_of(method: str, path: str) -> str | None:
    """The label of a GET or DELETE of a stored response (its answer holds a conversation:
    API keys guard it as they guard generation)."""
    if method in ("GET", "DELETE") and _STORED_RESPONSE.fullmatch(path):
        return "responses"
    return None


def error_json(route: str | None, status: int, message: str, code: str | None = None) -> bytes:
    """An error body in the route's shape (Anthropic's for its routes, predict's for
    predict, else OpenAI's: what `protocols/` answers for the same refusal)."""
    err = RequestError(message, status, code=code)
    if route in _ANTHROPIC:
        return json.dumps(anthropic_error_body(err)).encode()
    if route == "predict":
        return json.dumps(predict_error_body(err)).encode()
    return json.dumps(openai_error_body(err)).encode()


class BodyGuard:
    """Reads a POST body in full before the app sees it, within a size and time limit,
    so that no handler ever waits on (or holds) a slow or huge body.

    Default-deny: the app sees only GETs and HEADs (which reach no model), a stored
    response's DELETE, and POSTs to one of our routes (`route_of`, exact paths), guarded
    here; any other request is refused
    unread (404, 405; 400 for a path with a control character), whatever Truss's router
    would have made of it."""

    def __init__(
        self,
        app: ASGIApp,
        max_bytes: int,
        timeout_s: float,
        count: Callable[[str, str], None] = lambda route, reason: None,
        refuse: Callable[[], RequestError | None] = lambda: None,
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s
        self.count = count  # (route, reason): every refusal here is counted
        self.refuse = refuse  # 503s before the body is read: the same cost for any body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path, method = scope["path"], scope["method"]
        if _CONTROL.search(path):
            body = error_json(None, 400, "the request path holds a control character")
            return await _answer(send, 400, body, scope)
        route = route_of(path)
        if route is None and (method in OPEN_METHODS or stored_route_of(method, path)):
            return await self.app(scope, receive, send)  # no body, no model: nothing to read
        if route is None:
            body = error_json(None, 404, f"{method} {path[:200]} is not served by this model")
            return await _answer(send, 404, body, scope)
        if method != "POST":
            message = f"{method} is not allowed on {path[:200]}: use POST"
            allow = {"Allow": "POST"}
            return await _answer(send, 405, error_json(route, 405, message), scope, allow)
        if (err := self.refuse()) is not None:
            self.count(route, err.finish_reason)
            body = error_json(route, err.status, err.message, err.code)
            return await _answer(send, err.status, body, scope, err.headers)
        declared = _header(scope, b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            self.count(route, "invalid")
            return await _answer(send, 413, error_json(route, 413, self._too_large()), scope)
        try:
            body = await asyncio.wait_for(self._read(receive), self.timeout_s)
        except TimeoutError:
            self.count(route, "invalid")
            message = f"request body did not arrive within {self.timeout_s:g}s"
            return await _answer(send, 408, error_json(route, 408, message), scope)
        except _TooLarge:
            self.count(route, "invalid")
            return await _answer(send, 413, error_json(route, 413, self._too_large()), scope)
        except _Gone:
            self.count(route, "client_gone")
            return None
        handled: list[bool] = []
        scope[HANDLED] = handled
        status: list[int] = []

        async def watched(message: Message) -> None:
            if message["type"] == "http.response.start":
                status.append(message["status"])
            await send(message)

        await self.app(scope, _replay(body, receive), watched)
        if not handled and status == [499]:
            # Truss answers 499 itself when the client left after sending (before the
            # model is called): the frontend never saw it, so it is counted here.
            self.count(route, "client_gone")

    def _too_large(self) -> str:
        return f"request body is larger than {self.max_bytes} bytes"

    async def _read(self, receive: Receive) -> bytes:
        parts: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise _Gone
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                raise _TooLarge
            parts.append(chunk)
            if not message.get("more_body", False):
                return b"".join(parts)


class _TooLarge(Exception):
    pass


class _Gone(Exception):
    pass


def _header(scope: Scope, name: bytes) -> str | None:
    headers: list[tuple[bytes, bytes]] = scope.get("headers", [])
    for key, value in headers:
        if key == name:
            return value.decode("latin-1")
    return None


def _replay(body: bytes, receive: Receive) -> Receive:
    """The whole body at once, then the client's own messages (disconnects)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


async def _answer(
    send: Send, status: int, body: bytes, scope: Scope, headers: dict[str, str] | None = None
) -> None:
    """The guard's own answer; the request id is worked out only here (a request that
    passes through gets it from the frontend)."""
    request_id = request_id_from(_header(scope, b"x-request-id"))
    extra = [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await send_json(
        send,
        status,
        body,
        (b"x-request-id", request_id.encode()),
        (b"connection", b"close"),
        *extra,
    )


# ---- the generation routes, served directly ----


class DirectRoutes:
    """Serves the generation routes by calling the frontend from the ASGI layer (inside the
    body guard), not through Truss's per-request wrapper: FastAPI's routing and dependency
    injection, then Truss's health check, spans, disconnect watcher and semaphore. The
    frontend does for these routes all that matters of it (admission, trace context,
    disconnects, the routes' own error shapes); the wrapper was a third of the event
    loop's time per request start (docs/performance.md). Other paths, other methods, and
    every request while the model loads (Truss's own 503) go to Truss's app."""

    def __init__(self, app: ASGIApp, frontend: Frontend) -> None:
        self.app = app
        self.frontend = frontend

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = route_of(scope["path"]) if scope["type"] == "http" else None
        if route is None or scope["method"] != "POST":
            return await self.app(scope, receive, send)
        counting = route == "messages_count_tokens"  # answered here even while loading
        if self.frontend.service is None and not counting:
            return await self.app(scope, receive, send)
        request = Request(scope, receive)
        try:
            if counting:
                response = await self.frontend.count_tokens(request)
            else:
                response = await self.frontend.handle(route, request)
        except Exception:
            # A bug, not a bad request (those are RequestErrors, answered by the frontend):
            # logged with its traceback here, never sent.
            log.exception("%s %s failed", scope["method"], scope["path"])
            body = error_json(route, 500, "internal error while handling the request")
            return await _answer(send, 500, body, scope)
        await response(scope, receive, send)


# ---- extra routes ----


def add_routes(app: FastAPI, frontend: Frontend) -> None:
    from fastapi.responses import JSONResponse, Response
    from fastapi.routing import APIRoute
    from prometheus_client import CONTENT_TYPE_LATEST

    from mistral_serving.ops.metrics import exposition

    def unavailable(message: str) -> JSONResponse:
        return JSONResponse(status_code=503, content=openai_error_body(RequestError(message, 503)))

    async def list_models() -> Response:
        service = frontend.service
        if service is None:
            return unavailable("the model is loading")
        card = ModelCard(
            id=frontend.settings.served_model_name,
            created=_started,
            owned_by="mistral-trt-truss",
            max_model_len=service.engine.limits.max_seq_len,
        )
        return JSONResponse(ModelList(data=[card]).wire())

    async def health() -> Response:
        if not await frontend.is_healthy():
            return Response(status_code=503)
        return Response(status_code=200)

    async def version() -> Response:
        return JSONResponse(version_answer(frontend))

    async def metrics() -> Response:
        return Response(exposition(frontend.metrics), media_type=CONTENT_TYPE_LATEST)

    async def stored_response(request: Request) -> Response:
        return frontend.stored_response(request.method, request.path_params["response_id"])

    routes = [
        APIRoute("/v1/models", list_models, methods=["GET", "HEAD"]),
        APIRoute("/health", health, methods=["GET", "HEAD"]),
        APIRoute("/health/generate", DeepProbe(frontend).answer, methods=["GET"]),
        APIRoute("/version", version, methods=["GET", "HEAD"]),
        APIRoute("/metrics", metrics, methods=["GET", "HEAD"]),
        APIRoute("/v1/responses/{response_id}", stored_response, methods=["GET", "DELETE"]),
    ]
    app.router.routes[0:0] = routes  # before Truss's: /metrics must win over its mount
    # FastAPI's generated document fails on Truss's routes (a 500 with a traceback); the
    # routes are documented in the README instead: /openapi.json is a plain 404.
    app.router.routes = [
        r for r in app.router.routes if getattr(r, "path", None) != app.openapi_url
    ]
    app.openapi_url = None


def version_answer(frontend: Frontend) -> dict[str, Any]:
    """`GET /version`: ours, the server's event loop and parser, and once the model is
    loaded its engine's report, start-up phases and chat format. Called on the loop."""
    loop = type(asyncio.get_running_loop()).__module__.partition(".")[0]
    answer: dict[str, Any] = {
        "version": __version__,
        "server": {"event_loop": loop, "http_parser": "httptools"},
        "engine": None,
    }
    service = frontend.service
    if service is not None:
        info = service.engine.info
        # The engine's own report (versions, dtype, limits, KV-cache kind, ...).
        answer["engine"] = info.name
        answer["details"] = json.loads(json.dumps(info.details, default=str))
        answer["startup_seconds"] = service.startup  # per phase of its start
        tokenizer = service.tokenizer  # how chats and tools are encoded and read
        answer["chat"] = {"format": tokenizer.chat_format, "tools": tokenizer.tool_format}
    return answer


def limit_keys(app: FastAPI, frontend: Frontend, keyed: bool) -> None:
    """The per-key concurrency limit, inside the API-key guard (it counts accepted keys)."""
    limit = frontend.settings.max_inflight_per_key
    if not limit:
        return
    if not keyed:
        log.warning("max_inflight_per_key=%d has no effect: no API keys are configured", limit)
        return
    metrics = frontend.metrics

    def count(route: str) -> None:
        metrics.rejected.labels("key_limit").inc()
        metrics.finished.labels(route, "rejected").inc()

    app.add_middleware(
        KeyConcurrency, limit=limit, route_of=route_of, error_json=error_json, count=count
    )


def extend(app: FastAPI, frontend: Frontend) -> FastAPI:
    """Add our routes and the body guard to Truss's app (before it starts)."""
    settings = frontend.settings
    add_routes(app, frontend)
    # Innermost: it sees only bodies the guards let through.
    app.add_middleware(DirectRoutes, frontend=frontend)

    def count(route: str, reason: str) -> None:
        frontend.metrics.finished.labels(route, reason).inc()

    app.add_middleware(
        BodyGuard,
        max_bytes=settings.max_body_bytes,
        timeout_s=settings.body_timeout_seconds,
        count=count,
        refuse=frontend.early_refusal,
    )
    access = logging.getLogger("uvicorn.access")
    if not any(isinstance(f, RedactedAccessLine) for f in access.filters):
        access.addFilter(RedactedAccessLine())  # no `?api_key=` value in the access log
    keys = KeySource(settings.api_keys_file)  # the file's and the Truss secret's, kept fresh
    limit_keys(app, frontend, bool(keys.keys))
    if keys.keys:  # outside the guards: an unauthenticated body is never read
        app.add_middleware(
            ApiKeyGuard,
            keys=keys,
            route_of=route_of,
            error_json=error_json,
            guard_other=stored_route_of,
        )
    # Outermost: every 503 (Truss's own while loading too) and /health say the state.
    app.add_middleware(StateHeader, state=frontend.state)
    publish(frontend.state)
    lifespan = app.router.lifespan_context

    @contextlib.asynccontextmanager
    async def with_shutdown(app_: Any) -> AsyncIterator[Any]:
        async with lifespan(app_) as state:
            if listen_socket.shares_port():
                # uvicorn listens once this returns: a front-end of several takes no
                # connection (the kernel hands it to a loaded one) until it is loaded.
                # A failed load ends the process (`exit_if_load_fails`).
                while frontend.service is None:
                    await asyncio.sleep(0.05)
            yield state
        await asyncio.to_thread(frontend.shutdown)

    app.router.lifespan_context = with_shutdown
    return app


def serve(
    server: TrussServer,
    settings: Settings,
    sockets: list[socket.socket] | None = None,
    loaded: Callable[[], bool] = lambda: True,
) -> None:
    """`TrussServer.start` (truss 0.18.36) with two differences: uvicorn's HTTP parser is
    httptools (Truss pins h11), and the event loop really is uvloop (Truss asks uvicorn
    for uvloop, then runs `asyncio.run`, which makes a stdlib loop): less server CPU per
    streamed token (docs/performance.md). It listens on `sockets` (bound by `main`) and
    says "ready on URL" once they listen and `loaded()` holds."""
    import truss_server
    import uvicorn
    import uvloop

    from mistral_serving.http.limits import Limits, fit_connections, protocol_class

    cap = fit_connections(settings.max_connections, settings.probe_reserve_connections)

    runtime = server._config.get("runtime") or {}
    transport = runtime.get("transport") or {}
    pings = {
        "ws_ping_interval": transport.get("ping_interval_seconds"),
        "ws_ping_timeout": transport.get("ping_timeout_seconds"),
    }
    level = "DEBUG" if runtime.get("enable_debug_logs", False) else "INFO"
    config = uvicorn.Config(
        server.create_application(),
        http=protocol_class(Limits.from_settings(settings, max_connections=cap)),
        timeout_keep_alive=settings.keepalive_timeout_seconds,  # type: ignore[arg-type]
        host=settings.host,
        port=server._http_port,
        workers=1,
        timeout_graceful_shutdown=truss_server.TIMEOUT_GRACEFUL_SHUTDOWN,
        log_config=console.with_line_filter(dict(truss_server.log_config.make_log_config(level))),
        ws_max_size=truss_server.WS_MAX_MSG_SZ_BYTES,
        loop="uvloop",
        **{k: v for k, v in pings.items() if v},  # as Truss: unset keeps uvicorn's default
    )
    uvicorn_server = server._server = uvicorn.Server(config=config)
    sock = listen_socket.listen_socket()  # several front-end processes: the launcher's bound port
    if sock is not None:
        sockets = [sock]

    async def run() -> None:
        port = sockets[0].getsockname()[1] if sockets else server._http_port
        url = console.url_of(settings.host, port)
        ready = asyncio.create_task(console.announce_ready(uvicorn_server, loaded, url))
        try:
            await uvicorn_server.serve(sockets=sockets)
        finally:
            ready.cancel()

    uvloop.run(run())


def load_failure(frontend: Frontend, exc: BaseException) -> str:
    """Why load() failed, in one line: the frontend's words, else the exception's."""
    if frontend.load_error:
        return frontend.load_error
    return f"{type(exc).__name__}: {exc}".splitlines()[0][:500]


# Load failures that are refusals with their reason (no artifact there, a manifest that
# does not match, a setting the engine cannot serve): one line, no traceback.
EXPECTED_LOAD_FAILURES = (ArtifactError, SettingsError)


def port_problem(host: str, port: int, exc: OSError) -> str:
    """Why the port cannot be bound, in one line naming it."""
    if exc.errno == errno.EADDRINUSE:
        # `LocalServer.start` retries on another port when it reads "address already in use".
        return (
            f"port {port} on {host} is taken (address already in use): stop what listens "
            "there or choose another port"
        )
    return f"cannot listen on {host} port {port}: {exc.strerror or exc}"


def main(config_path: str = "config.yaml") -> int:
    import yaml

    with open(config_path, encoding="utf-8") as f:
        config = yaml.safe_load(f)
    try:
        settings = Settings.load(config.get("model_metadata"))
    except SettingsError as exc:
        print(f"cannot start: {exc}", file=sys.stderr)
        return 2
    if (refusal := driver.startup_refusal(settings.driver_check)) is not None:
        print(f"cannot start: {refusal}", file=sys.stderr)
        return 2
    console.use_log_format(settings.log_format)
    port = int(os.environ.get("INFERENCE_SERVER_PORT", "8080"))
    if settings.frontend_processes > 1 and not listen_socket.shares_port():
        try:  # the launcher of several front-end processes
            plugin = fallback.required(f"frontend_processes: {settings.frontend_processes}")
        except SettingsError as exc:
            print(f"cannot start: {exc}", file=sys.stderr)
            return 2
        return plugin.run_frontends(settings, port)
    sockets = None
    if not listen_socket.shares_port():
        try:  # before the model loads: a taken port ends the start now, naming it
            sockets = listen_socket.bind(settings.host, port)
        except OSError as exc:
            print(f"cannot start: {port_problem(settings.host, port, exc)}", file=sys.stderr)
            return 2
    # The process's one frontend: Truss hands `config` to the model's constructor as it
    # is, so the model serves this object (model.py, `frontend_for`) and so do our routes.
    frontend = Frontend(settings)
    config[FRONTEND_CONFIG_KEY] = frontend
    from truss_server import TrussServer

    class Server(TrussServer):
        def create_application(self) -> FastAPI:
            return extend(super().create_application(), frontend)

        def start(self) -> None:
            serve(self, settings, sockets, lambda: self._model.ready)

    server = Server(port, config)
    # Before a probe can SIGKILL us.
    exit_if_load_fails(
        server._model, lambda exc: load_failure(frontend, exc), expected=EXPECTED_LOAD_FAILURES
    )
    try:
        server.start()
    except KeyboardInterrupt:  # Ctrl-C: uvicorn stopped cleanly, then re-raised it
        log.info("stopped")
        console.quiet_exit(0)
    if server._model.load_failed:
        reason = frontend.load_error or "model.load() raised (see above)"
        log.error("load failed: %s", reason)
        logging.shutdown()
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
