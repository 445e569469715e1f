"""The gateway's request headers (ops/gateway_headers.py) and what they do: the parser
(fuzzed: any header set is read, the new name over the old, or refused as a 400 naming the
header), the waiting queue ordered by the objective's priority (higher first, arrival order
within one), the frontend putting them on the record (the log line, the trace) and a
malformed one answered 400 before the body is read, and the settings map that names
priorities."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry

from mistral_serving.errors import RequestError
from mistral_serving.generation.admission import Admission
from mistral_serving.ops.gateway_headers import (
    FAIRNESS_HEADERS,
    OBJECTIVE_HEADERS,
    SESSION_HEADERS,
    GatewayContext,
    gateway_context,
)
from mistral_serving.ops.metrics import Metrics
from mistral_serving.ops.tracing import Tracing
from mistral_serving.settings import Settings, SettingsError
from mistral_serving.text.tokenizer import Tokenizer
from tests.unit.test_frontend import Client, body, run, serve

pytestmark = pytest.mark.usefixtures("restore_sigterm")

NAMES = [*OBJECTIVE_HEADERS, *FAIRNESS_HEADERS, *SESSION_HEADERS]
VALUES = st.one_of(
    st.from_regex(r"[a-z0-9]([-a-z0-9.]{0,20}[a-z0-9])?", fullmatch=True),
    st.text(max_size=300),
    st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=300),
)


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(st.sampled_from(NAMES), VALUES, max_size=6))
def test_any_headers_are_read_or_refused_naming_the_header(headers: dict[str, str]) -> None:
    try:
        context = gateway_context(headers)
    except RequestError as err:
        assert err.status == 400 and err.param in headers
        assert err.param in err.message and len(err.message) < 400  # bounded, one line
        return
    for group, got in (
        (OBJECTIVE_HEADERS, context.objective),
        (FAIRNESS_HEADERS, context.fairness_id),
        (SESSION_HEADERS, context.session_id),
    ):
        given_values = [headers[n] for n in group if n in headers]
        assert got == (given_values[0] if given_values else None)  # the new name first


def test_examples() -> None:
    assert gateway_context({}) == GatewayContext()
    both = {"x-llm-d-inference-objective": "interactive", "x-gateway-inference-objective": "b"}
    assert gateway_context(both).objective == "interactive"
    assert (
        gateway_context({"x-gateway-inference-fairness-id": "tenant-7"}).fairness_id == "tenant-7"
    )
    for bad in ({"x-llm-d-inference-objective": "Interactive"}, {"x-session-id": "a b"}):
        with pytest.raises(RequestError):
            gateway_context(bad)


# ---- the queue's order ----


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(-5, 5), min_size=1, max_size=8))
def test_waiters_get_the_slot_by_priority_then_arrival(priorities: list[int]) -> None:
    admission = Admission(1, 100, Metrics(CollectorRegistry()))
    order: list[int] = []

    async def waiter(i: int) -> None:
        ticket = await admission.acquire(priority=priorities[i], poll_s=60)
        order.append(i)
        ticket.release()

    async def main() -> None:
        held = await admission.acquire()
        tasks = []
        for i in range(len(priorities)):
            tasks.append(asyncio.ensure_future(waiter(i)))
            await asyncio.sleep(0)
        assert admission.waiting == len(priorities)
        held.release()
        await asyncio.gather(*tasks)

    asyncio.run(main())
    assert order == sorted(range(len(priorities)), key=lambda i: (-priorities[i], i))
    assert admission.waiting == 0 and admission.inflight == 0


def test_a_waiter_that_leaves_takes_only_its_own_place() -> None:
    admission = Admission(1, 100, Metrics(CollectorRegistry()))
    order: list[str] = []

    async def waiter(name: str, priority: int) -> None:
        ticket = await admission.acquire(priority=priority, poll_s=60)
        order.append(name)
        ticket.release()

    async def main() -> None:
        held = await admission.acquire()
        low = asyncio.ensure_future(waiter("low", -1))
        await asyncio.sleep(0)
        high = asyncio.ensure_future(waiter("high", 9))
        await asyncio.sleep(0)
        high.cancel()  # its client went away
        await asyncio.gather(high, return_exceptions=True)
        assert admission.waiting == 1
        held.release()
        await low

    asyncio.run(main())
    assert order == ["low"]


# ---- through the frontend ----

GATEWAY = {
    "x-llm-d-inference-objective": "interactive",
    "x-llm-d-inference-fairness-id": "tenant-7",
    "x-session-id": "chat-42",
}


def traced(tok: Tokenizer, **values: Any) -> tuple[Any, InMemorySpanExporter]:
    served = serve(tok, **values)
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    assert served.frontend.service is not None
    served.frontend.service.telemetry.tracing = Tracing(provider)
    return served, exporter


def test_the_headers_are_logged_and_traced_with_the_priority(
    tok: Tokenizer, caplog: pytest.LogCaptureFixture
) -> None:
    served, exporter = traced(tok, objective_priorities={"interactive": 10})
    with caplog.at_level(logging.INFO, logger="mistral_serving.requests"):
        client = run(served, Client(body(prompt="Hi", max_new_tokens=2), headers=GATEWAY))
    assert client.status == 200
    (line,) = [r for r in caplog.records if r.name == "mistral_serving.requests"]
    logged = {
        k: getattr(line, k, None) for k in ("objective", "priority", "fairness_id", "session_id")
    }
    assert logged == {
        "objective": "interactive",
        "priority": 10,
        "fairness_id": "tenant-7",
        "session_id": "chat-42",
    }
    (root,) = [s for s in exporter.get_finished_spans() if s.name == "request"]
    assert root.attributes is not None
    assert root.attributes["llm_d.objective"] == "interactive"
    assert root.attributes["request.priority"] == 10
    assert root.attributes["llm_d.fairness_id"] == "tenant-7"
    assert root.attributes["session.id"] == "chat-42"


def test_an_unknown_objective_is_priority_zero_and_none_says_nothing(
    tok: Tokenizer, caplog: pytest.LogCaptureFixture
) -> None:
    served, exporter = traced(tok, objective_priorities={"interactive": 10})
    with caplog.at_level(logging.INFO, logger="mistral_serving.requests"):
        run(
            served,
            Client(
                body(prompt="Hi", max_new_tokens=2),
                headers={"x-llm-d-inference-objective": "other"},
            ),
        )
        run(served, Client(body(prompt="Hi", max_new_tokens=2)))
    first, second = [r for r in caplog.records if r.name == "mistral_serving.requests"]
    assert (first.objective, first.priority) == ("other", 0)  # type: ignore[attr-defined]
    assert not hasattr(second, "objective") and not hasattr(second, "session_id")
    roots = [s for s in exporter.get_finished_spans() if s.name == "request"]
    assert roots[1].attributes is not None and "llm_d.objective" not in roots[1].attributes


def test_a_malformed_header_is_a_400_before_the_body_is_read(tok: Tokenizer) -> None:
    served = serve(tok)
    client = run(
        served,
        Client(b"{ not even json", route="chat_completions", headers={"x-session-id": "a b"}),
    )
    assert client.status == 400
    error = client.json()["error"]
    assert error["param"] == "x-session-id" and "x-session-id" in error["message"]
    assert served.counts("chat_completions") == {"invalid": 1}
    assert served.engine.calls == []


@pytest.mark.parametrize(
    "value",
    ['{"Interactive": 1}', '{"a": 1.5}', '{"a": 2147483648}', '["a"]', "not json", '{"a": true}'],
)
def test_a_bad_priorities_map_is_refused_in_one_line(value: str) -> None:
    with pytest.raises(SettingsError) as caught:
        Settings.load({}, env={"MTT_OBJECTIVE_PRIORITIES": value})
    assert "objective_priorities" in str(caught.value) and "\n" not in str(caught.value)
    assert Settings.load(
        {}, env={"MTT_OBJECTIVE_PRIORITIES": '{"a.b-1": -3}'}
    ).objective_priorities == {"a.b-1": -3}
