"""Frontend.handle, driven as the ASGI server drives it (a real starlette Request over a
scripted client, the response played into a recording `send`), with a GenerationService
on a scripted engine and the dev model's tokenizer: the cheap refusals first (503
draining, and saturation, decided before the body is read), X-Request-Id bounds, one count per
request with its reason, streams cut short, and engine failures kept to their request."""

from __future__ import annotations

import asyncio
import json
import re
import signal
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from fastapi import HTTPException
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from mistral_serving.engines.base import (
    EngineError,
    EngineLimits,
    EngineRequestError,
    SamplingOptions,
    TokenDelta,
)
from mistral_serving.generation.service import GenerationService
from mistral_serving.http.frontend import (
    FRONTEND_CONFIG_KEY,
    REQUEST_ID_HEADER,
    Frontend,
    frontend_for,
    one_line,
    request_id_from,
)
from mistral_serving.http.scope_keys import CUT_EXTENSION, LEFT_EXTENSION
from mistral_serving.ops.metrics import Metrics
from mistral_serving.settings import Settings
from mistral_serving.text.tokenizer import Tokenizer
from tests.doubles.scripted_engine import ScriptedEngine

LIMITS = EngineLimits(max_input_len=32, max_seq_len=64, max_batch_size=4)
TEXT = "Hello world, the quick brown fox."
PATHS = {
    "predict": "/v1/models/model:predict",
    "chat_completions": "/v1/chat/completions",
    "completions": "/v1/completions",
}
REASONS = ("invalid", "rejected", "client_gone", "stop", "length", "abort", "error", "slow_reader")


# handle() installs the drain's SIGTERM handler when it runs on the main thread.
pytestmark = pytest.mark.usefixtures("restore_sigterm")


@dataclass
class Served:
    frontend: Frontend
    engine: ScriptedEngine
    registry: CollectorRegistry

    def finished(self, route: str, reason: str) -> float:
        labels = {"route": route, "finished_reason": reason}
        return self.registry.get_sample_value("mtt:request_finished_total", labels) or 0.0

    def counts(self, route: str) -> dict[str, float]:
        """The nonzero finish counts of a route."""
        found = {r: self.finished(route, r) for r in REASONS}
        return {r: n for r, n in found.items() if n}

    def rejected(self, reason: str) -> float:
        labels = {"reason": reason}
        return self.registry.get_sample_value("mtt:request_rejected_total", labels) or 0.0


def serve(tok: Tokenizer, engine: ScriptedEngine | None = None, **settings: Any) -> Served:
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    engine = engine or ScriptedEngine.from_ids(tok.encode(TEXT), limits=LIMITS)
    frontend = Frontend(Settings(**settings), metrics)
    frontend.attach(GenerationService(frontend.settings, tok, engine, metrics=metrics))
    return Served(frontend, engine, registry)


@dataclass
class Client:
    """One HTTP request as the server hands it to the app: the body (in one message), then
    nothing until the client leaves (`leave()`), then `http.disconnect`."""

    body: bytes
    headers: dict[str, str] = field(default_factory=dict)
    route: str = "predict"
    receives: int = 0
    sent: list[dict[str, Any]] = field(default_factory=list)
    _gone: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def scope(self) -> dict[str, Any]:
        headers = [
            (k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in self.headers.items()
        ]
        headers.append((b"content-length", str(len(self.body)).encode()))
        return {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},  # what uvicorn says
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": PATHS[self.route],
            "raw_path": PATHS[self.route].encode(),
            "query_string": b"",
            "headers": headers,
            "client": ("127.0.0.1", 5000),
            "server": ("127.0.0.1", 8080),
        }

    def request(self) -> Request:
        return Request(self.scope, self.receive)

    def leave(self) -> None:
        self._gone.set()

    async def receive(self) -> dict[str, Any]:
        self.receives += 1
        if self.receives == 1:
            return {"type": "http.request", "body": self.body, "more_body": False}
        await self._gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)

    # ---- what came back ----

    @property
    def status(self) -> int:
        return self.sent[0]["status"]

    @property
    def response_headers(self) -> dict[str, str]:
        return {k.decode(): v.decode() for k, v in self.sent[0]["headers"]}

    @property
    def body_bytes(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.sent[1:])

    @property
    def complete(self) -> bool:
        """The body ended as a complete one (HTTP's closing chunk was sent)."""
        return any(
            m["type"] == "http.response.body" and not m.get("more_body", False) for m in self.sent
        )

    def json(self) -> Any:
        return json.loads(self.body_bytes)


@dataclass
class WatchedClient(Client):
    """As the real server hands a request over: the protocol tells the response when the
    client left (LEFT_EXTENSION), at once if it already had; `receive` never reports it."""

    _told: list[Any] = field(default_factory=list)

    @property
    def scope(self) -> dict[str, Any]:
        return super().scope | {"extensions": {LEFT_EXTENSION: self.watch}}

    def watch(self, callback: Any) -> Any:
        if self._gone.is_set():
            callback()
            return lambda: None
        self._told.append(callback)
        return lambda: self._told.remove(callback) if callback in self._told else None

    def leave(self) -> None:
        self._gone.set()
        for callback in self._told:
            callback()
        self._told.clear()

    async def receive(self) -> dict[str, Any]:
        self.receives += 1
        if self.receives == 1:
            return {"type": "http.request", "body": self.body, "more_body": False}
        await asyncio.Event().wait()  # only the protocol's call says the client left
        raise AssertionError("unreachable")


async def call(served: Served, client: Client) -> Response:
    response = await served.frontend.handle(client.route, client.request())
    await response(client.scope, client.receive, client.send)
    return response


def run(served: Served, client: Client) -> Client:
    asyncio.run(call(served, client))
    return client


def body(**fields: Any) -> bytes:
    return json.dumps(fields).encode()


# ---- answers ----


def test_predict_answer_and_one_count(tok: Tokenizer) -> None:
    served = serve(tok)
    client = run(served, Client(body(prompt="Hi", max_new_tokens=100)))
    assert client.status == 200 and client.complete
    answer = client.json()
    assert answer["output"] == TEXT
    assert answer["finish_reason"] == "length"
    assert answer["usage"]["completion_tokens"] == len(tok.encode(TEXT))
    assert served.counts("predict") == {"length": 1}
    assert served.frontend.admission.inflight == 0
    # The prompt reached the engine tokenized, max_new_tokens clamped to the room left.
    (gen,) = served.engine.calls
    assert gen.prompt_ids == tok.encode("Hi", bos=True)
    assert gen.sampling.max_new_tokens == LIMITS.max_seq_len - len(gen.prompt_ids)


def test_predict_stream_is_the_text(tok: Tokenizer) -> None:
    # The engine waits between steps: each chunk goes out as it is made (more than one write).
    engine = ScriptedEngine.from_ids(tok.encode(TEXT), limits=LIMITS, step_delay_s=0.001)
    served = serve(tok, engine)
    client = run(served, Client(body(prompt="Hi", stream=True, streaming_interval=2)))
    assert client.status == 200 and client.complete
    assert client.response_headers["content-type"].startswith("text/plain")
    assert client.body_bytes.decode() == TEXT
    assert len([m for m in client.sent[1:] if m.get("body")]) > 1
    assert served.counts("predict") == {"length": 1}
    assert served.frontend.admission.inflight == 0


def test_chat_stream_is_openais_sse(tok: Tokenizer) -> None:
    served = serve(tok)
    client = Client(
        body(
            messages=[{"role": "user", "content": "Hi"}],
            stream=True,
            stream_options={"include_usage": True},
        ),
        route="chat_completions",
    )
    run(served, client)
    assert client.status == 200 and client.complete
    assert client.response_headers["content-type"].startswith("text/event-stream")
    events = client.body_bytes.decode().split("\n\n")
    assert events[-2:] == ["data: [DONE]", ""]
    data = [json.loads(e.removeprefix("data: ")) for e in events[:-2]]
    assert data[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert "".join(d["choices"][0]["delta"].get("content", "") for d in data[1:-1]) == TEXT
    assert data[-2]["choices"][0]["finish_reason"] == "length"
    assert data[-1]["usage"]["completion_tokens"] == len(tok.encode(TEXT))
    assert served.counts("chat_completions") == {"length": 1}


def test_completion_answer(tok: Tokenizer) -> None:
    served = serve(tok, served_model_name="tiny")
    client = run(served, Client(body(prompt="Once", max_tokens=50), route="completions"))
    answer = client.json()
    assert (answer["object"], answer["model"]) == ("text_completion", "tiny")
    assert answer["choices"][0]["text"] == TEXT
    assert served.counts("completions") == {"length": 1}


# ---- X-Request-Id ----


@pytest.mark.parametrize("rid", ["abc-123", "a" * 128, "trace:0/1+2=3_4.5"])
def test_a_plain_request_id_is_echoed(tok: Tokenizer, rid: str) -> None:
    client = run(serve(tok), Client(body(prompt="Hi"), headers={REQUEST_ID_HEADER: rid}))
    assert client.response_headers["x-request-id"] == rid


@pytest.mark.parametrize("rid", ["a" * 129, "has space", "semi;colon", "é", "", "a\tb"])
def test_a_long_or_odd_request_id_is_replaced(tok: Tokenizer, rid: str) -> None:
    client = run(serve(tok), Client(body(prompt="Hi"), headers={REQUEST_ID_HEADER: rid}))
    echoed = client.response_headers["x-request-id"]
    assert echoed != rid
    assert len(echoed) == 32 and all(c in "0123456789abcdef" for c in echoed)


def test_a_request_id_is_made_when_none_is_given(tok: Tokenizer) -> None:
    first = run(serve(tok), Client(body(prompt="Hi")))
    second = run(serve(tok), Client(body(prompt="Hi")))
    a, b = (c.response_headers["x-request-id"] for c in (first, second))
    assert a != b and len(a) == 32


def test_request_id_from_logs_only_the_start_of_a_refused_id(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level("WARNING", logger="mistral_serving.http.frontend"):
        fresh = request_id_from("x" * 100 + " SECRET-TAIL")
    assert fresh in caplog.text
    assert "SECRET-TAIL" not in caplog.text


# ---- refusals: every one counted once, in the route's shape ----


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        (b"", "empty"),
        (b"{", "not valid JSON"),
        (b"[1]", "JSON object"),
        (b'{"prompt": "x", "temperature": NaN}', "NaN"),
        (b'{"prompt": "x", "seed": ' + b"9" * 5000 + b"}", "digits"),
        (b'{"prompt": "\\ud800"}', "surrogate"),
        (body(prompt="x", temperature="0.5"), "temperature"),
        (body(prompt="x", max_tokens=5, max_new_tokens=5), "not both"),
        (body(prompt=" ".join(["word"] * 40)), "input tokens"),
        (body(prompt="x", pad="y" * 70_000), "pad: unknown field"),  # decoded in a thread
    ],
)
def test_bad_predict_bodies_are_400s_counted_invalid(
    tok: Tokenizer, raw: bytes, needle: str
) -> None:
    served = serve(tok)
    client = run(served, Client(raw, headers={REQUEST_ID_HEADER: "r-1"}))
    assert client.status == 400
    assert needle in client.json()["error"]
    assert list(client.json()) == ["error"]
    assert client.response_headers["x-request-id"] == "r-1"
    assert served.counts("predict") == {"invalid": 1}
    assert served.engine.calls == []
    assert served.frontend.admission.inflight == 0


@pytest.mark.parametrize("route", ["chat_completions", "completions"])
def test_bad_openai_bodies_get_openais_error_shape(tok: Tokenizer, route: str) -> None:
    served = serve(tok)
    client = run(served, Client(b'{"model": "m", "n": 2}', route=route))
    assert client.status == 400
    error = client.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == "n"
    assert set(error) == {"message", "type", "param", "code"}
    assert served.counts(route) == {"invalid": 1}


def test_full_server_answers_503_before_reading_the_body(tok: Tokenizer) -> None:
    """No slot and no queue place: this replica is saturated, a 503 a gateway retries on
    another pod (429 is for a key over its quota), with Retry-After for a client alone."""
    served = serve(tok, max_inflight=1, max_waiting=0)
    client = Client(b"{ not json", route="chat_completions")

    async def main() -> None:
        held = await served.frontend.admission.acquire()
        assert served.frontend.admission.full
        await call(served, client)
        held.release()

    asyncio.run(main())
    assert client.status == 503
    assert client.receives == 0  # the body was never read: a refusal costs the same for all
    assert client.response_headers["retry-after"] == "1"
    error = client.json()["error"]
    assert (error["type"], error["code"]) == ("service_unavailable", "server_overloaded")
    assert "capacity" in error["message"]
    assert served.counts("chat_completions") == {"rejected": 1}
    assert served.rejected("queue_full") == 1
    assert served.engine.calls == []


def test_draining_server_answers_503(tok: Tokenizer) -> None:
    served = serve(tok)
    client = Client(body(prompt="Hi"))

    async def main() -> None:
        served.frontend.drainer.begin()
        assert not served.frontend.ready
        await call(served, client)

    asyncio.run(main())
    assert client.status == 503
    assert "shutting down" in client.json()["error"]
    assert client.receives == 0
    assert served.counts("predict") == {"rejected": 1}
    assert served.rejected("draining") == 1


def test_a_client_that_leaves_while_queued_is_counted_gone(tok: Tokenizer) -> None:
    served = serve(tok, max_inflight=1, max_waiting=4)
    client = Client(body(prompt="Hi"))

    async def main() -> Response:
        held = await served.frontend.admission.acquire()
        task = asyncio.ensure_future(served.frontend.handle("predict", client.request()))
        while served.frontend.admission.waiting == 0:
            await asyncio.sleep(0.001)
        client.leave()
        response = await asyncio.wait_for(task, 60)
        held.release()
        return response

    response = asyncio.run(main())
    assert response.status_code == 499
    assert served.counts("predict") == {"client_gone": 1}
    assert served.engine.calls == []
    assert served.frontend.admission.inflight == 0


# ---- generation endings ----


def test_non_streaming_client_gone_aborts_the_engine(tok: Tokenizer) -> None:
    engine = ScriptedEngine.from_ids(tok.encode(TEXT), finish_reason=None, limits=LIMITS)
    served = serve(tok, engine)
    client = Client(body(prompt="Hi"))

    async def main() -> None:
        task = asyncio.ensure_future(call(served, client))
        while not engine.calls:
            await asyncio.sleep(0.001)
        client.leave()
        await asyncio.wait_for(task, 60)

    asyncio.run(main())
    assert engine.aborted == [engine.calls[0].request_id]
    assert served.counts("predict") == {"abort": 1}
    assert served.frontend.admission.inflight == 0


def test_a_predict_stream_cut_by_abort_ends_incomplete(tok: Tokenizer) -> None:
    engine = ScriptedEngine.from_ids(tok.encode(TEXT), finish_reason=None, limits=LIMITS)
    served = serve(tok, engine)
    client = Client(body(prompt="Hi", streaming=True, streaming_interval=1))

    async def main() -> None:
        task = asyncio.ensure_future(call(served, client))
        while len(client.sent) < 2:  # the start and some text
            await asyncio.sleep(0.001)
        await asyncio.sleep(0.01)
        assert served.frontend._abort_all() == 1  # the drain's grace period is over
        await asyncio.wait_for(task, 60)

    asyncio.run(main())
    assert client.status == 200
    assert client.body_bytes.decode() == TEXT  # what was made before the abort
    assert not client.complete  # no closing chunk: the client sees an incomplete body
    assert served.counts("predict") == {"abort": 1}
    assert served.frontend.admission.inflight == 0


def test_a_chat_stream_cut_by_abort_says_so_in_band(tok: Tokenizer) -> None:
    engine = ScriptedEngine.from_ids(tok.encode(TEXT), finish_reason=None, limits=LIMITS)
    served = serve(tok, engine)
    messages = [{"role": "user", "content": "Hi"}]
    client = Client(body(messages=messages, stream=True), route="chat_completions")

    async def main() -> None:
        task = asyncio.ensure_future(call(served, client))
        while not engine.calls:
            await asyncio.sleep(0.001)
        await asyncio.sleep(0.01)
        served.frontend._abort_all()
        await asyncio.wait_for(task, 60)

    asyncio.run(main())
    assert client.complete
    events = client.body_bytes.decode().split("\n\n")
    assert events[-2] == "data: [DONE]"
    assert json.loads(events[-3].removeprefix("data: "))["choices"][0]["finish_reason"] == "abort"
    assert served.counts("chat_completions") == {"abort": 1}


@pytest.mark.parametrize("route", ["predict", "chat_completions"])
@pytest.mark.parametrize("told", [Client, WatchedClient])
def test_a_stream_whose_client_leaves_is_aborted_and_counted_once(
    tok: Tokenizer, route: str, told: type[Client]
) -> None:
    engine = ScriptedEngine.from_ids(tok.encode(TEXT), finish_reason=None, limits=LIMITS)
    served = serve(tok, engine)
    fields = (
        {"prompt": "Hi"}
        if route == "predict"
        else {"messages": [{"role": "user", "content": "Hi"}]}
    )
    client = told(body(**fields, stream=True), route=route)

    async def main() -> None:
        task = asyncio.ensure_future(call(served, client))
        while not engine.calls:
            await asyncio.sleep(0.001)
        await asyncio.sleep(0.01)
        client.leave()
        await asyncio.wait_for(task, 60)
        for _ in range(3):  # let a closed generator's cleanup run
            await asyncio.sleep(0)

    asyncio.run(main())
    assert engine.aborted == [engine.calls[0].request_id]
    assert served.counts(route) == {"abort": 1}
    assert served.frontend.admission.inflight == 0


def test_a_chat_stream_left_after_the_role_chunk_is_counted_once(tok: Tokenizer) -> None:
    """The client leaves while the first event (the role chunk) is being written: the
    request must still be counted, once."""
    served = serve(tok)
    messages = [{"role": "user", "content": "Hi"}]
    client = Client(body(messages=messages, stream=True), route="chat_completions")
    stuck = asyncio.Event()

    async def send(message: dict[str, Any]) -> None:
        client.sent.append(message)
        if message["type"] == "http.response.body":  # the role chunk: the socket stalls
            client.leave()
            await stuck.wait()

    async def main() -> None:
        response = await served.frontend.handle("chat_completions", client.request())
        await asyncio.wait_for(response(client.scope, client.receive, send), 60)
        del response
        for _ in range(3):
            await asyncio.sleep(0)

    asyncio.run(main())
    assert served.frontend.admission.inflight == 0
    # The body is pulled while the write stalls (the stream's own buffer), so this
    # scripted engine may finish first: whatever the reason, counted once.
    assert sum(served.counts("chat_completions").values()) == 1


def test_a_stream_whose_client_left_before_it_began_writes_nothing(tok: Tokenizer) -> None:
    """The protocol says at once that the client already left (while the request was
    prepared): no body byte, no engine request, the slot freed, counted once."""
    served = serve(tok)
    client = WatchedClient(body(prompt="Hi", stream=True))

    async def main() -> None:
        response = await served.frontend.handle("predict", client.request())
        client.leave()
        await asyncio.wait_for(response(client.scope, client.receive, client.send), 60)
        del response
        for _ in range(3):
            await asyncio.sleep(0)

    asyncio.run(main())
    assert [m["type"] for m in client.sent] == ["http.response.start"]
    assert served.engine.calls == []
    assert served.frontend.admission.inflight == 0
    assert served.counts("predict") == {"client_gone": 1}


def test_a_stream_never_started_is_counted_client_gone(tok: Tokenizer) -> None:
    """The response object is dropped before its body starts (the client left before
    the first byte): the slot is freed and the request counted."""
    served = serve(tok)

    async def main() -> None:
        response = await served.frontend.handle(
            "predict", Client(body(prompt="Hi", stream=True)).request()
        )
        assert isinstance(response, StreamingResponse)
        assert served.frontend.admission.inflight == 1
        del response

    asyncio.run(main())
    assert served.frontend.admission.inflight == 0
    assert served.counts("predict") == {"client_gone": 1}
    assert served.engine.calls == []


class FailsOnToken(ScriptedEngine):
    """Fails (EngineError) the requests whose prompt holds `bad`; the others play the
    script."""

    def __init__(self, bad: int, error: BaseException, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.bad = bad
        self.error = error

    async def generate(
        self, request_id: str, prompt_ids: list[int], sampling: SamplingOptions
    ) -> AsyncIterator[TokenDelta]:
        if self.bad in prompt_ids:
            self.calls.append(None)  # type: ignore[arg-type]
            yield TokenDelta(prompt_ids[-1:])  # some text first
            raise self.error
        async for delta in super().generate(request_id, prompt_ids, sampling):
            yield delta


def test_an_engine_error_is_a_500_for_that_request_only(tok: Tokenizer) -> None:
    bad = tok.encode("zebra")[-1]
    ids = tok.encode(TEXT)
    engine = FailsOnToken(
        bad, EngineError("GPU fell off"), script=[TokenDelta(ids, "stop")], limits=LIMITS
    )
    served = serve(tok, engine)
    good, failing = Client(body(prompt="Hi")), Client(body(prompt="zebra"))

    async def main() -> None:
        await asyncio.gather(call(served, failing), call(served, good))

    asyncio.run(main())
    assert failing.status == 500
    assert failing.json() == {"error": "generation failed: GPU fell off"}
    assert failing.response_headers["x-request-id"]
    assert (good.status, good.json()["output"]) == (200, TEXT)
    assert served.counts("predict") == {"error": 1, "stop": 1}
    assert served.frontend.admission.inflight == 0


def test_an_engine_error_is_openai_shaped_on_openai_routes(tok: Tokenizer) -> None:
    bad = tok.encode("zebra")[-1]
    engine = FailsOnToken(bad, EngineError("boom"), limits=LIMITS)
    served = serve(tok, engine)
    client = run(served, Client(body(prompt="zebra"), route="completions"))
    assert client.status == 500
    assert client.json()["error"]["type"] == "server_error"
    assert served.counts("completions") == {"error": 1}


def test_an_engine_refusal_is_a_400_counted_invalid(tok: Tokenizer) -> None:
    bad = tok.encode("zebra")[-1]
    engine = FailsOnToken(
        bad, EngineRequestError("response_format is not supported"), limits=LIMITS
    )
    served = serve(tok, engine)
    client = run(served, Client(body(prompt="zebra")))
    assert client.status == 400
    assert "not supported" in client.json()["error"]
    assert served.counts("predict") == {"invalid": 1}


@pytest.mark.parametrize("error", [EngineError("boom"), EngineRequestError("refused")])
def test_a_predict_stream_that_fails_ends_incomplete(tok: Tokenizer, error: Exception) -> None:
    """Mid-stream, a failure can no longer change the status: the body is cut (no closing
    chunk) and nothing escapes to the server."""
    bad = tok.encode("zebra")[-1]
    served = serve(tok, FailsOnToken(bad, error, limits=LIMITS))
    client = run(served, Client(body(prompt="zebra", streaming=True, streaming_interval=1)))
    assert client.status == 200
    assert not client.complete
    assert sum(served.counts("predict").values()) == 1
    assert served.frontend.admission.inflight == 0


def test_a_chat_stream_that_fails_is_cut_or_says_so(tok: Tokenizer) -> None:
    bad = tok.encode("zebra")[-1]
    served = serve(tok, FailsOnToken(bad, EngineRequestError("refused"), limits=LIMITS))
    messages = [{"role": "user", "content": "zebra"}]
    client = run(served, Client(body(messages=messages, stream=True), route="chat_completions"))
    events = client.body_bytes.decode().split("\n\n")
    assert events[-2] == "data: [DONE]"
    assert json.loads(events[-3].removeprefix("data: "))["error"]["message"] == "refused"
    assert served.counts("chat_completions") == {"invalid": 1}


# ---- health ----


def test_ready_and_healthy(tok: Tokenizer) -> None:
    served = serve(tok)
    assert served.frontend.ready
    assert asyncio.run(served.frontend.is_healthy()) is True
    served.frontend.admission.draining = True  # admission alone does not make it unready
    served.frontend.drainer.draining = True
    assert not served.frontend.ready


def test_not_ready_before_load() -> None:
    frontend = Frontend(Settings(), Metrics(CollectorRegistry()))
    assert not frontend.ready
    assert asyncio.run(frontend.is_healthy()) is False


def test_a_dead_engine_starts_the_drain(tok: Tokenizer) -> None:
    served = serve(tok)
    served.engine.healthy = False
    received: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, frame: received.append(signum))

    async def main() -> bool:
        served.frontend.drainer._installed = True  # keep our recorder as the handler
        healthy = await served.frontend.is_healthy()
        await asyncio.sleep(0.01)
        return healthy

    assert asyncio.run(main()) is False
    assert received == [signal.SIGTERM]  # the process asks itself to stop (restart)
    assert served.frontend.drainer.draining and served.frontend.admission.draining


def test_shutdown_stops_the_engine(tok: Tokenizer) -> None:
    served = serve(tok)
    served.frontend.shutdown()
    assert not served.engine.is_healthy()


# ---- any body, end to end through the frontend ----

JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**40), 2**40)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=10,
)
FIELDS = ["prompt", "messages", "max_tokens", "stream", "temperature", "stop", "n", "logprobs"]
BODIES = (
    st.binary(max_size=40)
    | st.dictionaries(st.sampled_from(FIELDS), JSON, max_size=4).map(
        lambda d: json.dumps(d).encode()
    )
    | st.fixed_dictionaries(
        {"prompt": st.text(max_size=20), "stream": st.booleans()},
        optional={"max_tokens": JSON, "stop": JSON, "temperature": JSON},
    ).map(lambda d: json.dumps(d).encode())
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=BODIES, route=st.sampled_from(sorted(PATHS)))
def test_any_body_is_answered_200_or_4xx_and_counted_once(
    tok: Tokenizer, raw: bytes, route: str
) -> None:
    served = serve(tok)
    client = run(served, Client(raw, route=route))
    assert client.status in (200, 400), client.body_bytes
    assert sum(served.counts(route).values()) == 1
    assert served.frontend.admission.inflight == 0
    if client.status == 400:
        error = client.json()["error"]
        assert isinstance(error if route == "predict" else error["message"], str)
    else:
        assert client.complete


# ---- settings that reach the request path and the process ----


def test_default_max_tokens_reaches_a_chat_request(tok: Tokenizer) -> None:
    served = serve(tok, default_max_tokens=3)
    messages = [{"role": "user", "content": "Hi"}]
    run(served, Client(body(messages=messages), route="chat_completions"))
    (gen,) = served.engine.calls
    assert gen.sampling.max_new_tokens == 3


def test_metrics_names_picks_the_served_prefix() -> None:
    frontend = Frontend(Settings(metrics_names="vllm"))
    assert frontend.metrics.ttft._name == "vllm:time_to_first_token_seconds"


def test_load_times_collections_and_freezes_what_loading_made(
    tok: Tokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    import mistral_serving.http.frontend as frontend_module

    steps: list[str] = []
    registry = CollectorRegistry()
    frontend = Frontend(Settings(), Metrics(registry))
    engine = ScriptedEngine(limits=LIMITS)

    def start(settings: Settings, hf_token: str | None, metrics: Metrics) -> GenerationService:
        steps.append("load")
        return GenerationService(settings, tok, engine, metrics=metrics)

    monkeypatch.setattr(frontend_module.GenerationService, "start", start)
    monkeypatch.setattr(frontend_module, "time_collections", lambda h: steps.append("time"))
    monkeypatch.setattr(
        frontend_module,
        "freeze_loaded_objects",
        lambda: steps.append("freeze" if frontend.service is not None else "freeze early"),
    )
    frontend.load(None)
    assert steps == ["time", "load", "freeze"]


# ---- slow readers ----


@dataclass
class StuckClient(Client):
    """Takes the status line, then never takes a body write (a client that stopped
    reading), on a server that offers the cut extension."""

    cuts: list[bool] = field(default_factory=list)
    _dropped: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def scope(self) -> dict[str, Any]:
        return super().scope | {"extensions": {CUT_EXTENSION: self.cut}}

    def cut(self, abort: bool) -> None:
        # What uvicorn does when the connection is dropped: a waiting write returns.
        self.cuts.append(abort)
        self._dropped.set()

    async def send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)
        if message["type"] == "http.response.body":
            await self._dropped.wait()  # the client does not read


@pytest.mark.parametrize(
    "limits",
    [
        {"stream_write_timeout_seconds": 0.01},  # a write not taken in time
        {"stream_write_timeout_seconds": 3600, "stream_buffer_bytes": 1024},  # too far behind
    ],
)
def test_a_client_that_stops_reading_is_aborted_and_counted(
    tok: Tokenizer, limits: dict[str, Any]
) -> None:
    engine = ScriptedEngine.from_ids(tok.encode("word " * 600), finish_reason=None, limits=LIMITS)
    served = serve(tok, engine, **limits)
    client = StuckClient(body(prompt="Hi", streaming=True, streaming_interval=1))

    async def main() -> None:
        await asyncio.wait_for(call(served, client), 30)  # returns: no slot held forever
        for _ in range(100):  # the engine request is closed as the body is
            if served.frontend.admission.inflight == 0 and served.counts("predict"):
                break
            await asyncio.sleep(0.01)

    asyncio.run(main())
    assert client.cuts == [True]  # dropped, not flushed: it is not read anyway
    assert served.counts("predict") == {"slow_reader": 1}
    assert served.frontend.admission.inflight == 0
    assert not client.complete


def test_tokens_are_counted_while_a_stream_runs(tok: Tokenizer) -> None:
    engine = ScriptedEngine.from_ids(tok.encode(TEXT), finish_reason=None, limits=LIMITS)
    served = serve(tok, engine)
    client = Client(body(prompt="Hi", streaming=True, streaming_interval=1))

    def tokens() -> float:
        return served.registry.get_sample_value("mtt:generation_tokens_total") or 0.0

    async def main() -> None:
        task = asyncio.ensure_future(call(served, client))
        while len(client.sent) < 2:  # the start and some text
            await asyncio.sleep(0.001)
        assert tokens() > 0  # before the stream ended
        served.frontend._abort_all()
        await asyncio.wait_for(task, 60)

    asyncio.run(main())
    assert tokens() == len(tok.encode(TEXT))  # and each counted once


def test_the_load_failure_line_keeps_the_whole_cause() -> None:
    try:
        try:
            raise OSError("disk\nfull")
        except OSError as exc:
            raise RuntimeError("cannot load\n  the engine:\n    config.json") from exc
    except RuntimeError as exc:
        line = one_line(exc)
    assert "\n" not in line
    assert (
        line == "RuntimeError: cannot load the engine: config.json | caused by: OSError: disk full"
    )


def test_frontend_for_serves_the_launchers_frontend_else_makes_one() -> None:
    made = Frontend(Settings(served_model_name="launched"), Metrics(CollectorRegistry()))
    config: dict[str, Any] = {"model_metadata": {"served_model_name": "other"}}
    assert frontend_for(config | {FRONTEND_CONFIG_KEY: made}) is made
    alone = frontend_for(config)  # Truss's own main.py: no launcher, the config's settings
    assert alone is not made and alone.settings.served_model_name == "other"


def test_a_request_before_load_is_a_503_not_a_crash() -> None:
    frontend = Frontend(Settings(), Metrics(CollectorRegistry()))  # nothing attached
    client = Client(json.dumps({"prompt": "hi"}).encode())
    with pytest.raises(HTTPException) as refused:
        asyncio.run(frontend.handle("predict", client.request()))
    assert refused.value.status_code == 503 and "loading" in refused.value.detail


@dataclass
class GatedClient(Client):
    """A client slow for a while: its first body write waits until `gate` opens."""

    gate: asyncio.Event = field(default_factory=asyncio.Event)
    first_write: asyncio.Event = field(default_factory=asyncio.Event)

    async def send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)
        if message.get("body") and not self.first_write.is_set():
            self.first_write.set()
            await self.gate.wait()


def body_writes(client: Client) -> list[bytes]:
    return [m["body"] for m in client.sent[1:] if m.get("body")]


def test_events_queued_behind_a_slow_write_go_out_in_one_write(tok: Tokenizer) -> None:
    # While one client's write waits, its stream's events queue up (the engine goes on)
    # and then leave in one write, the same bytes in the same order; another stream on
    # the same server meanwhile gets each event as it is made.
    engine = ScriptedEngine.from_ids(tok.encode(TEXT), limits=LIMITS, step_delay_s=0.001)
    served = serve(tok, engine)
    slow = GatedClient(body(prompt="Hi", stream=True, streaming_interval=1))
    fast = Client(body(prompt="Hi", stream=True, streaming_interval=1))

    async def main() -> None:
        slow_call = asyncio.ensure_future(call(served, slow))
        await asyncio.wait_for(slow.first_write.wait(), 30)
        await asyncio.wait_for(call(served, fast), 30)  # not held up by the slow one
        assert fast.complete and not slow.complete
        while served.frontend.admission.inflight:  # the slow stream's body is all made
            await asyncio.sleep(0.001)
        slow.gate.set()
        await asyncio.wait_for(slow_call, 30)

    asyncio.run(main())
    assert len(body_writes(fast)) == len(tok.encode(TEXT))  # one write per event, as made
    assert slow.complete and len(body_writes(slow)) == 2  # the first, then all the rest
    assert slow.body_bytes == fast.body_bytes == TEXT.encode()
    assert served.counts("predict") == {"length": 2}


def test_a_coalesced_sse_stream_is_byte_identical_to_one_by_one(tok: Tokenizer) -> None:
    # The same completion stream, once written event by event (the engine waits between
    # steps) and once with every event queued before the first write (a gated client).
    ids = tok.encode(TEXT)
    request = body(prompt="Hi", stream=True, max_tokens=64)

    def stream(client: Client, delay: float) -> list[bytes]:
        engine = ScriptedEngine.from_ids(ids, limits=LIMITS, step_delay_s=delay)
        served = serve(tok, engine)

        async def main() -> None:
            task = asyncio.ensure_future(call(served, client))
            if isinstance(client, GatedClient):
                await asyncio.wait_for(client.first_write.wait(), 30)
                while served.frontend.admission.inflight:
                    await asyncio.sleep(0.001)
                client.gate.set()
            await asyncio.wait_for(task, 30)

        asyncio.run(main())
        assert client.complete
        return body_writes(client)

    one_by_one = stream(Client(request, route="completions"), 0.001)
    coalesced = stream(GatedClient(request, route="completions"), 0.0)
    assert len(coalesced) < len(one_by_one)
    assert _run_free(b"".join(coalesced)) == _run_free(b"".join(one_by_one))


def _run_free(sse: bytes) -> bytes:
    # The id (a per-process count) and `created` (the clock second) are what two runs
    # of the same request may not share.
    sse = re.sub(rb'"id": ?"cmpl-[^"]*"', b'"id": "cmpl-x"', sse)
    return re.sub(rb'"created": ?\d+', b'"created": 0', sse)


def test_the_write_clock_turns_its_own_cancel_into_a_timeout_and_keeps_anothers():
    from mistral_serving.http.frontend import _WriteClock

    async def write_that_never_ends(external_cancel: bool) -> str:
        clock = _WriteClock(0.0)  # due at once: the first loop pass cancels the write
        task = asyncio.current_task()
        assert task is not None
        if external_cancel:  # a shutdown cancelling the same task in the same pass
            asyncio.get_running_loop().call_soon(task.cancel)
        try:
            await clock.timed(asyncio.get_running_loop().create_future())
        except TimeoutError:
            return "timeout"
        finally:
            clock.stop()
        return "written"

    assert asyncio.run(write_that_never_ends(False)) == "timeout"
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(write_that_never_ends(True))
