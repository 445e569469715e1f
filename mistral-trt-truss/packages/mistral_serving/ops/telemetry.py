"""When a request ends: its record closed, one structured log line, the metrics and the
spans."""

from __future__ import annotations

import logging
import time

from mistral_serving.errors import REFUSAL_REASONS
from mistral_serving.ops.metrics import Metrics
from mistral_serving.ops.record import Ending, RequestRecord
from mistral_serving.ops.tracing import Tracing

log = logging.getLogger("mistral_serving.requests")

# Reasons a request ended before generating: counted, not put in the latency/size histograms.
REFUSED = frozenset(REFUSAL_REASONS.values())


class Telemetry:
    def __init__(
        self, metrics: Metrics, log_prompts: bool = False, tracing: Tracing | None = None
    ) -> None:
        self.metrics = metrics
        self.log_prompts = log_prompts
        self.tracing = tracing

    def admitted(self, record: RequestRecord) -> None:
        record.admitted_at = time.monotonic()
        self.metrics.queue_time.observe(record.admitted_at - record.arrived_at)

    def finished(self, record: RequestRecord, ending: Ending, prompt: str | None = None) -> None:
        """Close the record with how the request ended (once: a second close is a bug),
        then count it, log its line and export its spans."""
        if record.ended_at is not None:
            raise RuntimeError(f"request {record.request_id} was already finished")
        record.ended_at = time.monotonic()
        record.finish_reason = ending.reason
        record.prompt_tokens = ending.prompt_tokens
        record.completion_tokens = ending.completion_tokens
        m, route = self.metrics, record.route
        duration = record.ended_at - record.arrived_at
        m.finished.labels(route, ending.reason).inc()
        m.prompt_tokens.inc(record.prompt_tokens)
        m.generation_tokens.inc(record.completion_tokens - record.tokens_counted)
        record.tokens_counted = record.completion_tokens
        # Refusals would pull these toward 0; a request that timed out while generating
        # was no refusal.
        timed_out_generating = ending.reason == "timeout" and record.submitted_at
        if ending.reason not in REFUSED or timed_out_generating:
            m.request_prompt_tokens.observe(record.prompt_tokens)
            m.request_generation_tokens.observe(record.completion_tokens)
            m.e2e.labels(route).observe(duration)
        if record.ttft_s is not None:
            m.ttft.labels(route).observe(record.ttft_s)
        if record.tpot_s is not None:
            m.tpot.labels(route).observe(record.tpot_s)
        line = {
            "event": "request",
            "request_id": record.request_id,
            "route": route,
            "prompt_tokens": record.prompt_tokens,
            "output_tokens": record.completion_tokens,
            "ttft_s": None if record.ttft_s is None else round(record.ttft_s, 4),
            "duration_s": round(duration, 4),
            "finish_reason": ending.reason,
        }
        line |= record.gateway_said()  # its log line's keys are the record's names
        if self.log_prompts:
            line |= {"prompt": prompt, "output": ending.text}
        # Under the Truss server's JSON log formatter the `extra` fields become keys of
        # the one log line of this request.
        log.info("request %s %s %s", record.request_id, route, line["finish_reason"], extra=line)
        if self.tracing is not None:
            try:
                self.tracing.export(record)
            except Exception:  # a trace must never fail a request
                log.warning("request %s: making its spans failed", record.request_id, exc_info=True)
