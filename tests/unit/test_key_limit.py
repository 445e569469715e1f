"""The per-API-key concurrency limit (http/key_limit.py) as a pure ASGI middleware: a key
at its limit gets 429 with Retry-After (the route's error shape) before its body is read,
others are not held back by it, a request counts until its answer has ended (however it
ends), nothing else is counted, and the table holds only keys with work in progress. The
server wires it inside the API-key guard only when keys and a limit are both set."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from fastapi import FastAPI
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from mistral_serving.http.frontend import Frontend
from mistral_serving.http.key_limit import KeyConcurrency
from mistral_serving.http.server import error_json, limit_keys, route_of
from mistral_serving.ops.metrics import Metrics
from mistral_serving.settings import Settings


class Gate:
    """An app whose requests stay in progress until released (or fail when told)."""

    def __init__(self) -> None:
        self.entered = 0
        self.release = asyncio.Event()
        self.fail = False

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        self.entered += 1
        await self.release.wait()
        if self.fail:
            raise RuntimeError("the app failed")
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok", "more_body": False})


def scope(key: bytes | None, path: str = "/v1/chat/completions", method: str = "POST") -> dict:
    headers = [(b"authorization", b"Bearer " + key)] if key is not None else []
    return {"type": "http", "method": method, "path": path, "headers": headers}


async def call(limit: KeyConcurrency, s: dict) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def receive() -> dict[str, Any]:
        raise AssertionError("the body is never read here")

    await limit(s, receive, send)
    return sent


def make(limit: int = 2) -> tuple[Gate, KeyConcurrency, list[str]]:
    gate, refused = Gate(), []
    return gate, KeyConcurrency(gate, limit, route_of, error_json, refused.append), refused


def test_a_key_at_its_limit_gets_429_and_another_key_does_not() -> None:
    async def main() -> None:
        gate, limit, refused = make(2)
        held = [asyncio.create_task(call(limit, scope(b"alice"))) for _ in range(2)]
        while gate.entered < 2:
            await asyncio.sleep(0)
        (start, body) = await call(limit, scope(b"alice"))
        assert start["status"] == 429
        assert dict(start["headers"])[b"retry-after"] == b"1"
        error = json.loads(body["body"])["error"]
        assert (error["type"], error["code"]) == ("rate_limit_error", "rate_limit_exceeded")
        assert "2 requests in progress" in error["message"]
        assert refused == ["chat_completions"]
        bob = asyncio.create_task(call(limit, scope(b"bob")))  # not held back by alice
        while gate.entered < 3:
            await asyncio.sleep(0)
        gate.release.set()
        for task in [*held, bob]:
            assert (await task)[0]["status"] == 200
        assert limit.held == {}  # every request ended: nothing left counted
        assert (await call(limit, scope(b"alice")))[0]["status"] == 200

    asyncio.run(main())


def test_a_request_that_fails_still_gives_its_place_back() -> None:
    async def main() -> None:
        gate, limit, _ = make(1)
        gate.fail = True
        gate.release.set()
        with pytest.raises(RuntimeError):
            await call(limit, scope(b"alice"))
        assert limit.held == {}

    asyncio.run(main())


@pytest.mark.parametrize(
    "s",
    [
        scope(None),  # no key: the API-key guard outside decides
        scope(b"alice", path="/health", method="GET"),
        scope(b"alice", path="/v1/embeddings"),  # not a generation route
        scope(b"alice", method="GET"),
        {"type": "lifespan"},
    ],
)
def test_other_requests_pass_uncounted(s: dict) -> None:
    async def main() -> None:
        gate, limit, _ = make(1)
        gate.release.set()
        for _ in range(3):  # over the limit, were they counted
            await limit(s, lambda: None, lambda m: asyncio.sleep(0))  # type: ignore[arg-type]
        assert gate.entered == 3 and limit.held == {}

    asyncio.run(main())


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from([b"a", b"b", b"c"]), min_size=1, max_size=12), st.integers(1, 3))
def test_no_key_ever_holds_more_than_its_limit(keys: list[bytes], n: int) -> None:
    async def main() -> None:
        gate, limit, refused = make(n)
        peak: dict[bytes, int] = {}
        tasks = []
        for key in keys:
            tasks.append(asyncio.create_task(call(limit, scope(key))))
            await asyncio.sleep(0)
            for digest, held in limit.held.items():
                peak[digest] = max(peak.get(digest, 0), held)
        gate.release.set()
        statuses = [(await t)[0]["status"] for t in tasks]
        assert max(peak.values()) <= n
        for key in set(keys):
            sent = [s for k, s in zip(keys, statuses, strict=True) if k == key]
            assert sent.count(200) == min(len(sent), n)  # the first n get in, the rest 429
            assert sent.count(429) == len(sent) - min(len(sent), n)
        assert len(refused) == statuses.count(429) and limit.held == {}

    asyncio.run(main())


def layers(app: FastAPI) -> list[type]:
    return [m.cls for m in app.user_middleware]  # type: ignore[misc]


@pytest.mark.parametrize(
    ("limit", "keyed", "wired"), [(2, True, True), (0, True, False), (2, False, False)]
)
def test_the_server_adds_it_only_with_keys_and_a_limit(
    limit: int, keyed: bool, wired: bool
) -> None:
    app = FastAPI()
    frontend = Frontend(Settings(max_inflight_per_key=limit), Metrics(CollectorRegistry()))
    limit_keys(app, frontend, keyed)
    assert (KeyConcurrency in layers(app)) is wired
