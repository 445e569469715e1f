"""One request's record: its ids, trace context and times, filled in as it runs, and how
it ended, written once when it ends (`Telemetry.finished`, its one writer of the end)."""

from __future__ import annotations

import itertools
import logging
import re
import time
import uuid
from dataclasses import dataclass, field
from typing import Protocol

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
    # What a gateway said of it (ops/gateway_headers.py), and the queue priority it got.
    objective: str | None = None
    fairness_id: str | None = None
    session_id: str | None = None
    priority: int = 0
    tokens_counted: int = 0  # output tokens already in generation_tokens_total
    # How it ended: set once, by Telemetry.finished.
    finish_reason: str | None = None  # stop, length, abort, timeout, error; or a refusal's
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def __post_init__(self) -> None:
        if not self.engine_id:
            self.engine_id = f"{self.request_id}-{next(_ENGINE_SEQ)}"

    def gateway_said(self) -> dict[str, str | int]:
        """What a gateway said of the request, and the priority it got, by field name: only
        what was said (the priority comes with an objective)."""
        said: dict[str, str | int] = {}
        if self.objective is not None:
            said |= {"objective": self.objective, "priority": self.priority}
        if self.fairness_id is not None:
            said["fairness_id"] = self.fairness_id
        if self.session_id is not None:
            said["session_id"] = self.session_id
        return said

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_at is None else self.first_token_at - self.arrived_at

    @property
    def tpot_s(self) -> float | None:
        """Time per output token after the first; None until the request ended with 2+."""
        if self.first_token_at is None or self.ended_at is None or self.completion_tokens < 2:
            return None
        return (self.ended_at - self.first_token_at) / (self.completion_tokens - 1)


class Ending(Protocol):
    """How a request ended, as the record is closed with it (generation's `Outcome`)."""

    @property
    def reason(self) -> str: ...

    @property
    def text(self) -> str: ...

    @property
    def prompt_tokens(self) -> int: ...

    @property
    def completion_tokens(self) -> int: ...
