"""The guards are default-deny against what Truss's router will route, not the literal
path: the route table is read out of the installed Truss server's source, mounted as real
Starlette routes whose model endpoints record every call, behind `server.extend` (API keys
on, a small body bound); fuzzed paths (percent-encodings, trailing characters, case,
double slashes, control characters) and methods must never reach a model without a key,
nor with a body past the bound, nor have a body byte read unless they are one of ours."""

from __future__ import annotations

import ast
import asyncio
import json
import string
import urllib.parse
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from starlette.requests import Request
from starlette.responses import Response

from mistral_build.image import truss_server_dir
from mistral_serving.http.frontend import Frontend
from mistral_serving.http.server import extend, route_of
from mistral_serving.ops.metrics import Metrics
from mistral_serving.settings import Settings

KEY = "sk-route-guard-key"
MAX_BODY = 1024
# Truss endpoints a GET may reach: none calls the model.
NO_MODEL = {"<lambda>", "model_ready", "model_loaded", "schema", "invocations_ready"}


def truss_route_table() -> list[tuple[str, str, tuple[str, ...]]]:
    """(path template, endpoint name, methods) of every FastAPIRoute in truss_server.py."""
    tree = ast.parse((truss_server_dir() / "truss_server.py").read_text())
    table = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and ast.unparse(node.func) == "FastAPIRoute"):
            continue
        path = node.args[0]
        assert isinstance(path, ast.Constant) and isinstance(path.value, str)
        target = node.args[1]
        name = target.attr if isinstance(target, ast.Attribute) else "<lambda>"
        methods: tuple[str, ...] = ("GET",)  # FastAPI's default
        for kw in node.keywords:
            if kw.arg == "methods":
                methods = tuple(ast.literal_eval(kw.value))
        table.append((path.value, name, methods))
    assert len(table) >= 10, table
    return table


TABLE = truss_route_table()


class _LoadedService:
    """What our own GET routes read of a loaded service (the model is never reached)."""

    engine = SimpleNamespace(
        limits=SimpleNamespace(max_seq_len=64), info=SimpleNamespace(name="stub", details={})
    )
    startup: dict[str, float] = {}
    tokenizer = SimpleNamespace(chat_format="none", tool_format="none")

    def is_healthy(self) -> bool:
        return True

    def stalled(self) -> None:
        return None


class World:
    """Truss's routes (model endpoints recording their calls) behind our guards."""

    def __init__(self, tmp: Path) -> None:
        self.reached: list[tuple[str, str]] = []
        app = FastAPI()
        for path, name, methods in TABLE:
            app.router.routes.append(APIRoute(path, self._endpoint(name), methods=list(methods)))
        keys = tmp / "keys"
        keys.write_text(KEY + "\n")
        settings_ = Settings(api_keys_file=str(keys), max_body_bytes=MAX_BODY)
        frontend = Frontend(settings_, Metrics(CollectorRegistry()))

        async def handle(route: str, request: Request) -> Response:
            self.reached.append(("frontend", request.scope["path"]))
            return JSONResponse({"route": route})

        frontend.handle = handle  # type: ignore[method-assign]
        frontend.service = _LoadedService()  # type: ignore[assignment]  # DirectRoutes serves
        self.app = extend(app, frontend)

    def _endpoint(self, name: str) -> Any:
        async def endpoint(request: Request) -> Response:
            self.reached.append((name, request.scope["path"]))
            return JSONResponse({"endpoint": name})

        endpoint.__name__ = name
        return endpoint

    def call(self, method: str, raw_path: bytes, body: bytes, key: bool) -> tuple[int, int]:
        """(status, body messages the app took) for one request, as uvicorn scopes it."""
        path = raw_path.decode("ascii")
        path = urllib.parse.unquote(path) if "%" in path else path
        headers = [(b"host", b"x"), (b"content-length", str(len(body)).encode())]
        if key:
            headers.append((b"authorization", f"Bearer {KEY}".encode()))
        scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1",
            "method": method,
            "scheme": "http",
            "path": path,
            "raw_path": raw_path,
            "root_path": "",
            "query_string": b"",
            "headers": headers,
            "server": ("127.0.0.1", 8080),
            "client": ("127.0.0.1", 1),
            "state": {},
        }
        pieces = [body[i : i + 256] for i in range(0, len(body), 256)] or [b""]
        taken = 0
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            nonlocal taken
            if taken < len(pieces):
                taken += 1
                more = taken < len(pieces)
                return {"type": "http.request", "body": pieces[taken - 1], "more_body": more}
            await asyncio.sleep(3600)  # no disconnect: a body is over when it says so
            raise AssertionError("unreachable")

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        asyncio.run(self.app(scope, receive, send))
        return sent[0]["status"], taken


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> World:
    return World(tmp_path_factory.mktemp("keys"))


def model_routes() -> list[str]:
    """Paths (a model name filled in) of every Truss route a non-GET method may use."""
    return [
        path.replace("{model_name}", "model")
        for path, _, methods in TABLE
        if set(methods) - {"GET", "HEAD"}
    ]


def test_the_route_table_is_truss_own_and_its_gets_reach_no_model() -> None:
    names = {name for _, name, _ in TABLE}
    assert {"predict", "chat_completions", "completions", "invocations"} <= names
    for _, name, methods in TABLE:
        if set(methods) <= {"GET", "HEAD"}:
            assert name in NO_MODEL, f"a GET route reaches {name}: the key guard lets GET pass"


def test_without_the_guards_a_trailing_newline_reaches_the_model(tmp_path: Path) -> None:
    """The control: Truss's router (Starlette's `$`) routes `/v1/chat/completions\\n`."""
    bare = World(tmp_path)
    app = FastAPI()
    for path, name, methods in TABLE:
        app.router.routes.append(APIRoute(path, bare._endpoint(name), methods=list(methods)))
    bare.app = app
    status, _ = bare.call("POST", b"/v1/chat/completions%0A", b"{}", key=False)
    assert status == 200 and bare.reached == [("chat_completions", "/v1/chat/completions\n")]


@pytest.mark.parametrize(
    "raw",
    [
        b"/v1/chat/completions%0A",
        b"/v1/completions%0a",
        b"/invocations%0A",
        b"/hot-reload%0A",
        b"/v1/models/model:predict%0A",
        b"/v1/models/model%0A:predict",
        b"/v1/chat/completions%0D%0A",
        b"/v1/embeddings",
    ],
)
def test_known_bypasses_are_refused_unread(world: World, raw: bytes) -> None:
    world.reached.clear()
    for key in (False, True):
        status, taken = world.call("POST", raw, b"{}", key=key)
        assert status == (400 if key and b"%0" in raw.lower() else 401 if not key else 404)
        assert taken == 0 and world.reached == []


@pytest.mark.parametrize("method", ["GET", "HEAD"])
@pytest.mark.parametrize("raw", [b"/health", b"/v1/models", b"/version", b"/", b"/metrics"])
def test_gets_stay_open_and_reach_no_model(world: World, raw: bytes, method: str) -> None:
    world.reached.clear()
    status, taken = world.call(method, raw, b"", key=False)
    # Truss's liveness route `/` is GET only: its 405 to HEAD is Truss's.
    assert status == (405 if (raw, method) == (b"/", "HEAD") else 200) and taken == 0
    assert world.reached in ([], [("<lambda>", "/")])


SUFFIXES = ["", "\n", "\r", "\t", " ", "/", "//", ".", "%0A", "%0D", "%00", "%20", "%2F", "?x"]
ALPHABET = string.ascii_letters + string.digits + "/:%._-~\n\r\t \x00\x7f"


@st.composite
def fuzzed_paths(draw: st.DrawFn) -> bytes:
    path = draw(st.sampled_from([*model_routes(), "/v1/models/model", "/health", "/"]))
    chars = list(path)
    for _ in range(draw(st.integers(0, 3))):  # percent-encode, flip case, double a slash
        i = draw(st.integers(0, len(chars) - 1))
        how = draw(st.sampled_from(["encode", "upper", "double", "drop", "insert"]))
        if how == "encode":
            chars[i] = "".join(f"%{ord(c):02X}" for c in chars[i])
        elif how == "upper":
            chars[i] = chars[i].upper()
        elif how == "double" and chars[i] == "/":
            chars[i] = "//"
        elif how == "drop":
            chars[i] = ""
        elif how == "insert":
            chars[i] += draw(st.sampled_from(ALPHABET))
    text = "".join(chars) + draw(st.sampled_from(SUFFIXES))
    text = "".join(c if c.isprintable() and c != " " else f"%{ord(c):02X}" for c in text)
    return text.partition("?")[0].encode("ascii")


@settings(max_examples=400, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    raw=fuzzed_paths(),
    method=st.sampled_from(["POST", "PUT", "PATCH", "DELETE", "OPTIONS", "GET", "HEAD"]),
)
def test_no_fuzzed_request_reaches_a_model_past_a_guard(
    world: World, raw: bytes, method: str
) -> None:
    path = urllib.parse.unquote(raw.decode())
    ours = route_of(path) is not None and method == "POST"
    model_names = {name for _, name, methods in TABLE if set(methods) - {"GET", "HEAD"}}
    # Without a key: nothing but a GET or HEAD gets past, and no body byte is read.
    world.reached.clear()
    status, taken = world.call(method, raw, b"x" * 10, key=False)
    if method not in ("GET", "HEAD"):
        assert status == 401 and taken == 0 and world.reached == [], (status, world.reached)
    assert not {name for name, _ in world.reached} & (model_names | {"frontend"})
    # With a key and a body past the bound: refused, never reaching a model.
    world.reached.clear()
    status, taken = world.call(method, raw, b"x" * (MAX_BODY + 1), key=True)
    assert not {name for name, _ in world.reached} & (model_names | {"frontend"})
    assert status < 500
    if not ours:
        assert taken == 0  # not one of ours: its body is never read
    # With a key and a body within the bound: only our exact routes reach a model.
    world.reached.clear()
    status, _ = world.call(method, raw, json.dumps({}).encode(), key=True)
    reached = {name for name, _ in world.reached} & (model_names | {"frontend"})
    assert reached == ({"frontend"} if ours else set()), (path, method, world.reached)
    assert status < 500
