"""OpenTelemetry spans for each request, exported over OTLP/HTTP when
`otlp_traces_endpoint` is set (off by default).

One trace per request, continuing the caller's W3C `traceparent` (and `tracestate`): a
`request` span (server kind; the request id, route, finish reason and token counts as
attributes) with one child per phase, in order: `parse` (body read, decoded, checked),
`queue` (waiting for a slot), `tokenize`, `prefill` (engine submission to the first output
text), `decode` (first to last output), and `stream` for a streamed answer (its first event
to its last output). A phase the request never reached has no span. What a gateway said
of the request (its objective and priority, fairness id, session) rides on `request`.

The spans are made when the request ends, from the times its `RequestRecord` already
keeps, so tracing costs the request path nothing while a request runs and nothing at all
when it is off (no tracer exists then). The provider is this module's own, not the global
one: the Truss server's tracer (its own spans, its own switch) is left alone.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from opentelemetry import trace
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

if TYPE_CHECKING:
    from mistral_serving.ops.record import RequestRecord

log = logging.getLogger(__name__)

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
SERVICE = "mistral-trt-truss"
_PROPAGATOR = TraceContextTextMapPropagator()
SHUTDOWN_FLUSH_S = 2.0  # the most a stop waits for the spans still queued


class Tracing:
    """Makes a finished request's spans on `provider`."""

    def __init__(self, provider: TracerProvider) -> None:
        self.provider = provider
        self.tracer = provider.get_tracer("mistral_serving")
        # monotonic -> epoch nanoseconds (the records keep monotonic times)
        self._offset_ns = time.time_ns() - time.monotonic_ns()

    @classmethod
    def with_exporter(cls, exporter: SpanExporter) -> Tracing:
        provider = TracerProvider(resource=Resource.create({SERVICE_NAME: SERVICE}))
        provider.add_span_processor(BatchSpanProcessor(exporter))
        return cls(provider)

    def _ns(self, monotonic_s: float) -> int:
        return int(monotonic_s * 1e9) + self._offset_ns

    def export(self, record: RequestRecord) -> None:
        """The request's spans (it has ended: `record.ended_at` is set)."""
        end = record.ended_at if record.ended_at is not None else time.monotonic()
        carrier = {TRACEPARENT: record.traceparent or ""}
        if record.tracestate:
            carrier[TRACESTATE] = record.tracestate
        parent = _PROPAGATOR.extract(carrier) if record.traceparent else None
        root = self.tracer.start_span(
            "request",
            context=parent,
            kind=trace.SpanKind.SERVER,
            start_time=self._ns(record.arrived_at),
            attributes={
                "request.id": record.request_id,
                "request.route": record.route,
                "request.finish_reason": record.finish_reason or "error",
                "gen_ai.usage.input_tokens": record.prompt_tokens,
                "gen_ai.usage.output_tokens": record.completion_tokens,
                **gateway_attributes(record),
            },
        )
        if record.finish_reason not in ("stop", "length"):
            root.set_status(trace.Status(trace.StatusCode.ERROR, record.finish_reason or "error"))
        inside = trace.set_span_in_context(root)
        for name, start, stop in _phases(record, end):
            span = self.tracer.start_span(
                name,
                context=inside,
                start_time=self._ns(start),
                attributes={"request.id": record.request_id},
            )
            span.end(end_time=self._ns(max(start, stop)))
        root.end(end_time=self._ns(end))

    def shutdown(self, timeout_s: float = SHUTDOWN_FLUSH_S) -> None:
        """Flush what is queued (the server is stopping), for at most `timeout_s`: the
        exporter's own timeouts and retries let a hung collector add ~30 s to every stop.
        What is not sent by then is dropped (the flush goes on in a daemon thread)."""
        flush = threading.Thread(target=self._flush, name="otlp-flush", daemon=True)
        flush.start()
        flush.join(timeout_s)
        if flush.is_alive():
            log.warning(
                "the trace exporter did not flush within %gs (otlp_traces_endpoint "
                "unreachable?); the spans still queued are dropped",
                timeout_s,
            )

    def _flush(self) -> None:
        try:
            self.provider.shutdown()
        except Exception:  # exiting anyway: never raise from the shutdown path
            log.warning("flushing the trace exporter failed", exc_info=True)


# The span attribute of each field `RequestRecord.gateway_said` gives (OpenTelemetry's
# `session.id` for the session).
GATEWAY_ATTRIBUTES = {
    "objective": "llm_d.objective",
    "priority": "request.priority",
    "fairness_id": "llm_d.fairness_id",
    "session_id": "session.id",
}


def gateway_attributes(record: RequestRecord) -> dict[str, str | int]:
    """The gateway's objective, fairness id and session, and the queue priority, where
    the request had them."""
    return {GATEWAY_ATTRIBUTES[name]: value for name, value in record.gateway_said().items()}


def _phases(record: RequestRecord, end: float) -> Sequence[tuple[str, float, float]]:
    """(name, start, end) of each phase the request reached, from its record's times."""
    out: list[tuple[str, float, float]] = []
    marks = [
        ("parse", record.arrived_at, record.parsed_at),
        ("queue", record.parsed_at, record.admitted_at),
        ("tokenize", record.admitted_at, record.submitted_at),
    ]
    for name, start, stop in marks:
        if start is not None:
            out.append((name, start, stop if stop is not None else end))
            if stop is None:
                return out  # it ended in this phase
    if record.submitted_at is None:
        return out
    first = record.first_token_at
    out.append(("prefill", record.submitted_at, first if first is not None else end))
    if first is not None:
        out.append(("decode", first, end))
    if record.stream_started_at is not None:
        out.append(("stream", record.stream_started_at, end))
    return out


_tracing: dict[str, Tracing] = {}


def tracing_for(endpoint: str) -> Tracing | None:
    """The process's tracing for this OTLP/HTTP endpoint (made once), or None when empty."""
    if not endpoint:
        return None
    if endpoint not in _tracing:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        _tracing[endpoint] = Tracing.with_exporter(OTLPSpanExporter(endpoint=endpoint))
        log.info("exporting request traces to %s", endpoint)
    return _tracing[endpoint]
