"""Deadlines through Frontend.handle, as the ASGI server drives it (helpers of
test_frontend.py): a request queued past its deadline never reaches the engine (504); one
that passes it while generating ends visibly (504 with the partial answer when not
streamed; `finish_reason: "timeout"` in-band on an OpenAI stream; a cut predict stream).
The scripted engine's streams wait for an abort once their script is played, so what ends
them is the deadline, whatever the machine's speed."""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import Iterator

import pytest

from mistral_serving.text.tokenizer import Tokenizer
from tests.doubles.scripted_engine import ScriptedEngine
from tests.unit.test_frontend import LIMITS, TEXT, Client, body, call, run, serve


@pytest.fixture(autouse=True)
def restore_sigterm() -> Iterator[None]:
    previous = signal.getsignal(signal.SIGTERM)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def endless(tok: Tokenizer) -> ScriptedEngine:
    """Plays TEXT, then waits (a long generation) until aborted."""
    return ScriptedEngine.from_ids(tok.encode(TEXT), finish_reason=None, limits=LIMITS)


def test_a_request_queued_past_its_deadline_is_a_504_and_never_reaches_the_engine(
    tok: Tokenizer,
) -> None:
    served = serve(tok, endless(tok), max_inflight=1, max_waiting=4)
    holder = Client(body(prompt="Hi"))
    late = Client(body(prompt="Hi"), headers={"X-Request-Timeout": "0.2"})

    async def main() -> None:
        first = asyncio.ensure_future(call(served, holder))
        while not served.engine.calls:  # the slot is taken, and stays so
            await asyncio.sleep(0.01)
        await call(served, late)
        holder.leave()
        await first

    asyncio.run(main())
    assert late.status == 504
    assert "deadline passed while queued" in late.json()["error"]
    assert len(served.engine.calls) == 1  # only the holder's
    assert served.finished("predict", "timeout") == 1
    assert served.frontend.admission.waiting == 0


def test_a_non_streamed_answer_past_its_deadline_is_a_504_with_the_partial_answer(
    tok: Tokenizer,
) -> None:
    served = serve(tok, endless(tok))
    client = run(served, Client(body(prompt="Hi"), headers={"X-Request-Timeout": "0.3"}))
    assert client.status == 504
    answer = client.json()
    assert answer["finish_reason"] == "timeout" and answer["output"] == TEXT
    assert "deadline passed while generating" in answer["error"]
    assert served.engine.aborted == [served.engine.calls[0].request_id]
    assert served.finished("predict", "timeout") == 1


def test_the_setting_alone_sets_the_deadline(tok: Tokenizer) -> None:
    served = serve(tok, endless(tok), request_timeout_seconds=0.3)
    client = run(served, Client(body(prompt="Hi"), route="completions"))
    assert client.status == 504
    assert client.json()["choices"][0]["finish_reason"] == "timeout"
    assert client.json()["error"]["message"].startswith("the request's deadline passed")


def test_an_openai_stream_past_its_deadline_says_timeout_in_band(tok: Tokenizer) -> None:
    served = serve(tok, endless(tok))
    messages = [{"role": "user", "content": "Hi"}]
    client = run(
        served,
        Client(
            body(model="m", messages=messages, stream=True),
            headers={"X-Request-Timeout": "0.3"},
            route="chat_completions",
        ),
    )
    assert client.status == 200 and client.complete
    events = [e for e in client.body_bytes.decode().split("\n\n") if e.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(e[6:]) for e in events[:-1]]
    reasons = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    assert reasons[-1] == "timeout"
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == TEXT
    assert served.engine.aborted


def test_a_predict_stream_past_its_deadline_is_cut(tok: Tokenizer) -> None:
    served = serve(tok, endless(tok))
    client = run(
        served,
        Client(body(prompt="Hi", stream=True), headers={"X-Request-Timeout": "0.3"}),
    )
    assert client.status == 200 and not client.complete  # no closing chunk: visibly cut
    assert client.body_bytes.decode() == TEXT
    assert served.engine.aborted


@pytest.mark.parametrize("route", ["predict", "chat_completions"])
def test_a_bad_timeout_header_is_a_400_in_the_routes_shape(tok: Tokenizer, route: str) -> None:
    served = serve(tok)
    payload = (
        body(prompt="Hi")
        if route == "predict"
        else body(model="m", messages=[{"role": "user", "content": "Hi"}])
    )
    client = run(served, Client(payload, headers={"X-Request-Timeout": "soon"}, route=route))
    assert client.status == 400
    error = client.json()["error"]
    message = error if route == "predict" else error["message"]
    assert "X-Request-Timeout" in message
    assert not served.engine.calls


def test_the_gateways_headers_are_accepted(tok: Tokenizer) -> None:
    # What the endpoint picker and an Envoy gateway put on a request they route here.
    served = serve(tok)
    headers = {
        "x-request-id": "gw-123",
        "x-gateway-destination-endpoint": "10.0.0.7:8080",
        "x-gateway-inference-objective": "chat",
        "x-gateway-model-name-rewrite": "mistral",
        "x-gateway-inference-fairness-id": "team-a",
        "x-envoy-expected-rq-timeout-ms": "60000",
        "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    }
    client = run(served, Client(body(prompt="Hi"), headers=headers))
    assert client.status == 200 and client.json()["output"] == TEXT
    assert client.response_headers["x-request-id"] == "gw-123"
