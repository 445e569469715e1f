"""OpenTelemetry spans per request (mistral_serving.ops.tracing) through Frontend.handle, with
an in-memory exporter: the phases, their parent, the caller's traceparent continued, the
request id as an attribute; a refusal's spans; off by default."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator, Sequence

import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from mistral_serving.ops.tracing import Tracing, tracing_for
from mistral_serving.settings import Settings
from mistral_serving.text.tokenizer import Tokenizer
from tests.unit.test_frontend import TEXT, Client, Served, body, run, serve

PATIENCE_S = 60

TRACE_ID = 0x0AF7651916CD43DD8448EB211C80319C
PARENT_ID = 0xB7AD6B7169203331
TRACEPARENT = f"00-{TRACE_ID:032x}-{PARENT_ID:016x}-01"


@pytest.fixture(autouse=True)
def restore_sigterm() -> Iterator[None]:
    previous = signal.getsignal(signal.SIGTERM)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def traced(tok: Tokenizer) -> tuple[Served, InMemorySpanExporter]:
    served = serve(tok)
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    assert served.frontend.service is not None
    served.frontend.service.telemetry.tracing = Tracing(provider)
    return served, exporter


def by_name(spans: tuple[ReadableSpan, ...]) -> dict[str, ReadableSpan]:
    found = {s.name: s for s in spans}
    assert len(found) == len(spans), [s.name for s in spans]  # one of each
    return found


def test_tracing_is_off_by_default() -> None:
    assert Settings().otlp_traces_endpoint == ""
    assert tracing_for("") is None


def test_a_streamed_request_has_every_phase_under_the_callers_trace(tok: Tokenizer) -> None:
    served, exporter = traced(tok)
    headers = {"traceparent": TRACEPARENT, "X-Request-Id": "trace-me"}
    client = run(served, Client(body(prompt="Hi", stream=True), headers=headers))
    assert client.status == 200 and client.body_bytes.decode() == TEXT
    spans = by_name(exporter.get_finished_spans())
    assert set(spans) == {"request", "parse", "queue", "tokenize", "prefill", "decode", "stream"}
    root = spans["request"]
    assert root.kind == SpanKind.SERVER
    assert root.context.trace_id == TRACE_ID  # continued, not a new trace
    assert root.parent is not None and root.parent.span_id == PARENT_ID
    assert root.parent.is_remote
    assert root.attributes["request.id"] == "trace-me"
    assert root.attributes["request.finish_reason"] == "length"
    assert root.attributes["gen_ai.usage.output_tokens"] == len(tok.encode(TEXT))
    for name in ("parse", "queue", "tokenize", "prefill", "decode", "stream"):
        span = spans[name]
        assert span.parent is not None and span.parent.span_id == root.context.span_id, name
        assert span.context.trace_id == TRACE_ID
        assert span.attributes["request.id"] == "trace-me"
        assert root.start_time <= span.start_time <= span.end_time <= root.end_time, name
    order = ["parse", "queue", "tokenize", "prefill", "decode"]
    starts = [spans[n].start_time for n in order]
    assert starts == sorted(starts)
    assert spans["parse"].end_time <= spans["queue"].start_time + 1


def test_without_a_traceparent_the_request_starts_a_trace(tok: Tokenizer) -> None:
    served, exporter = traced(tok)
    run(served, Client(body(prompt="Hi")))
    spans = by_name(exporter.get_finished_spans())
    assert spans["request"].parent is None
    assert "stream" not in spans  # not streamed
    assert {"parse", "queue", "tokenize", "prefill", "decode"} <= set(spans)


def test_a_refused_request_has_the_phases_it_reached(tok: Tokenizer) -> None:
    served, exporter = traced(tok)
    client = run(served, Client(body(prompt="Hi", temperature=9)))
    assert client.status == 400
    spans = by_name(exporter.get_finished_spans())
    assert set(spans) == {"request", "parse"}
    assert spans["request"].attributes["request.finish_reason"] == "invalid"
    assert not spans["request"].status.is_ok


@hsettings(max_examples=40, deadline=None)
@given(st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=80))
def test_any_traceparent_header_is_served(tok: Tokenizer, header: str) -> None:
    served, exporter = traced(tok)
    client = run(served, Client(body(prompt="Hi"), headers={"traceparent": header}))
    assert client.status == 200
    root = by_name(exporter.get_finished_spans())["request"]
    if root.parent is not None:  # a valid one is continued, anything else starts a trace
        assert f"{root.parent.span_id:016x}" in header.lower()


class HungExporter(SpanExporter):
    """A collector that never answers: every export waits until the test ends it."""

    def __init__(self) -> None:
        self.exporting = threading.Event()
        self.release = threading.Event()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.exporting.set()
        self.release.wait()
        return SpanExportResult.FAILURE

    def shutdown(self) -> None:
        pass


def test_a_hung_collector_holds_the_stop_for_a_bounded_time(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The stop waits SHUTDOWN_FLUSH_S at most for a collector that never answers (it
    waited for the exporter's timeouts and retries: ~30 s a stop)."""
    exporter = HungExporter()
    tracing = Tracing.with_exporter(exporter)
    span = tracing.tracer.start_span("request")
    span.end()
    stopper = threading.Thread(target=tracing.shutdown, daemon=True)
    try:
        stopper.start()
        assert exporter.exporting.wait(PATIENCE_S)
        stopper.join(PATIENCE_S)  # a bound on a wait that must end, not a measurement
        assert not stopper.is_alive()
        assert "did not flush" in caplog.text
    finally:
        exporter.release.set()
