"""Per-request record: one structured log line and the metrics, when a request ends."""

from __future__ import annotations

import itertools
import logging
import re
import time
import uuid
from dataclasses import dataclass, field

from mistral_serving.errors import REFUSAL_REASONS
from mistral_serving.ops.metrics import Metrics
from mistral_serving.ops.tracing import Tracing

log = logging.getLogger("mistral_serving.requests")

REQUEST_ID_HEADER = "X-Request-Id"
_REQUEST_ID = re.compile(r"[A-Za-z0-9._:/+=-]{1,128}")


def request_id_from(header: str | None) -> str:
    """The client's X-Request-Id when it is short and plain, else a fresh one (the
    rejected value is never logged in full)."""
    if header is None:
        return uuid.uuid4().hex
    if _REQUEST_ID.fullmatch(header):
        return header
    fresh = uuid.uuid4().hex
    log.warning(
        "X-Request-Id refused (%d characters, starts %r); using %s", len(header), header[:16], fresh
    )
    return fresh


_ENGINE_SEQ = itertools.count(1)


@dataclass
class RequestRecord:
    """What happened to one request; filled in as it runs."""

    request_id: str  # the client's X-Request-Id, or one we made: logged and returned
    route: str
    # The id the engine knows (and names in its log lines): "<request_id>-<n>", so a
    # search for the request id finds the engine's lines too; unique in the process even
    # when clients reuse an X-Request-Id.
    engine_id: str = ""
    arrived_at: float = field(default_factory=time.monotonic)
    parsed_at: float | None = None  # body read, decoded and checked
    admitted_at: float | None = None
    submitted_at: float | None = None  # handed to the engine (tokenized, within limits)
    first_token_at: float | None = None
    stream_started_at: float | None = None  # a streamed answer's first event
    ended_at: float | None = None
    deadline: float | None = (
        None  # monotonic time it must end by (mistral_serving.generation.deadline)
    )
    traceparent: str | None = None  # the caller's W3C trace context, continued by tracing
    tracestate: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    tokens_counted: int = 0  # of completion_tokens, already in generation_tokens_total
    finish_reason: str | None = None  # stop, length, abort, error; or a refusal's (REFUSED)
    output: str = ""

    def __post_init__(self) -> None:
        if not self.engine_id:
            self.engine_id = f"{self.request_id}-{next(_ENGINE_SEQ)}"

    @property
    def usage(self) -> dict[str, int]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
        }

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_at is None else self.first_token_at - self.arrived_at

    @property
    def tpot_s(self) -> float | None:
        """Time per output token after the first; None until the request ended with 2+."""
        if self.first_token_at is None or self.ended_at is None or self.completion_tokens < 2:
            return None
        return (self.ended_at - self.first_token_at) / (self.completion_tokens - 1)


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

    def finished(self, record: RequestRecord, prompt: str | None = None) -> None:
        record.ended_at = time.monotonic()
        m, route = self.metrics, record.route
        duration = record.ended_at - record.arrived_at
        m.finished.labels(route, record.finish_reason or "error").inc()
        m.prompt_tokens.inc(record.prompt_tokens)
        m.generation_tokens.inc(record.completion_tokens - record.tokens_counted)
        record.tokens_counted = record.completion_tokens
        # Refusals would pull these toward 0; a request that timed out while generating
        # was no refusal.
        timed_out_generating = record.finish_reason == "timeout" and record.submitted_at
        if record.finish_reason not in REFUSED or timed_out_generating:
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
            "finish_reason": record.finish_reason or "error",
        }
        if self.log_prompts:
            line |= {"prompt": prompt, "output": record.output}
        # Under the Truss server's JSON log formatter the `extra` fields become keys of
        # the one log line of this request.
        log.info("request %s %s %s", record.request_id, route, line["finish_reason"], extra=line)
        if self.tracing is not None:
            try:
                self.tracing.export(record)
            except Exception:  # a trace must never fail a request
                log.warning("request %s: making its spans failed", record.request_id, exc_info=True)
