"""Telemetry: the per-request metrics and the one structured log line (prompt and output
text only when log_prompts is on)."""

from __future__ import annotations

import logging
import time

import pytest
from prometheus_client import CollectorRegistry

from mistral_serving.errors import RequestError
from mistral_serving.generation.outcome import Outcome
from mistral_serving.ops.metrics import Metrics
from mistral_serving.ops.record import RequestRecord
from mistral_serving.ops.telemetry import Telemetry

LOGGER = "mistral_serving.requests"


def make(log_prompts: bool = False) -> tuple[Telemetry, CollectorRegistry]:
    registry = CollectorRegistry()
    return Telemetry(Metrics(registry), log_prompts), registry


def value(registry: CollectorRegistry, name: str, labels: dict | None = None) -> float:
    return registry.get_sample_value(name, labels or {}) or 0.0


class Done:
    """A request that ran for half a second, and how it ended."""

    def __init__(
        self,
        route: str = "predict",
        reason: str = "length",
        prompt_tokens: int = 5,
        completion_tokens: int = 4,
        first_token: bool = True,
    ) -> None:
        self.record = RequestRecord("client-id-1", route, arrived_at=time.monotonic() - 0.5)
        if first_token:
            self.record.first_token_at = self.record.arrived_at + 0.1
        self.outcome = Outcome(reason, "generated words", prompt_tokens, completion_tokens)

    def finish(self, telemetry: Telemetry, prompt: str | None = None) -> RequestRecord:
        telemetry.finished(self.record, self.outcome, prompt)
        return self.record


def request_lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == LOGGER]


def test_outcome_usage_and_record_ttft() -> None:
    done = Done(prompt_tokens=7, completion_tokens=3)
    assert done.outcome.usage == {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}
    assert done.record.ttft_s == pytest.approx(0.1)
    assert Done(first_token=False).record.ttft_s is None
    assert RequestRecord("a", "r").engine_id != RequestRecord("a", "r").engine_id


def test_record_tpot_is_the_time_per_token_after_the_first() -> None:
    record = Done().record
    record.completion_tokens = 5
    assert record.tpot_s is None  # not ended yet
    assert record.first_token_at is not None
    record.ended_at = record.first_token_at + 0.8
    assert record.tpot_s == pytest.approx(0.2)  # 0.8 s over the 4 tokens after the first
    record.completion_tokens = 1
    assert record.tpot_s is None
    assert Done(first_token=False).record.tpot_s is None


def test_admitted_observes_queue_time() -> None:
    telemetry, registry = make()
    record = RequestRecord("r", "predict", arrived_at=time.monotonic() - 0.2)
    telemetry.admitted(record)
    assert record.admitted_at is not None and record.admitted_at >= record.arrived_at
    assert value(registry, "mtt:request_queue_time_seconds_count") == 1
    assert value(registry, "mtt:request_queue_time_seconds_sum") >= 0.2


def test_finished_updates_every_metric(caplog: pytest.LogCaptureFixture) -> None:
    telemetry, registry = make()
    done = Done(route="chat_completions", reason="stop", prompt_tokens=5, completion_tokens=4)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        record = done.finish(telemetry)
    route = {"route": "chat_completions"}
    assert value(registry, "mtt:request_finished_total", route | {"finished_reason": "stop"}) == 1
    assert value(registry, "mtt:prompt_tokens_total") == 5
    assert value(registry, "mtt:generation_tokens_total") == 4
    assert value(registry, "mtt:request_prompt_tokens_sum") == 5
    assert value(registry, "mtt:request_generation_tokens_sum") == 4
    assert value(registry, "mtt:e2e_request_latency_seconds_count", route) == 1
    assert value(registry, "mtt:e2e_request_latency_seconds_sum", route) >= 0.5
    assert value(registry, "mtt:time_to_first_token_seconds_sum", route) == pytest.approx(0.1)
    assert value(registry, "mtt:time_per_output_token_seconds_count", route) == 1
    # (ended - first token) / (tokens - 1): at least 0.4 s over 3 gaps.
    assert value(registry, "mtt:time_per_output_token_seconds_sum", route) >= 0.4 / 3
    assert record.ended_at is not None


def test_no_ttft_or_tpot_without_output(caplog: pytest.LogCaptureFixture) -> None:
    telemetry, registry = make()
    Done(first_token=False, completion_tokens=0, reason="abort").finish(telemetry)
    route = {"route": "predict"}
    assert value(registry, "mtt:time_to_first_token_seconds_count", route) == 0
    assert value(registry, "mtt:time_per_output_token_seconds_count", route) == 0
    assert value(registry, "mtt:request_finished_total", route | {"finished_reason": "abort"}) == 1


def test_single_token_has_ttft_but_no_tpot() -> None:
    telemetry, registry = make()
    Done(completion_tokens=1).finish(telemetry)
    route = {"route": "predict"}
    assert value(registry, "mtt:time_to_first_token_seconds_count", route) == 1
    assert value(registry, "mtt:time_per_output_token_seconds_count", route) == 0


def test_a_record_is_finished_once(caplog: pytest.LogCaptureFixture) -> None:
    """The record has one end: a second close is a bug, refused before it counts twice."""
    telemetry, registry = make()
    done = Done(reason="stop")
    with caplog.at_level(logging.INFO, logger=LOGGER):
        done.finish(telemetry)
        with pytest.raises(RuntimeError, match="already finished"):
            telemetry.finished(done.record, done.outcome.because("error"))
    labels = {"route": "predict", "finished_reason": "stop"}
    assert value(registry, "mtt:request_finished_total", labels) == 1
    assert not value(registry, "mtt:request_finished_total", labels | {"finished_reason": "error"})
    (line,) = request_lines(caplog)
    assert line.finish_reason == "stop" and done.record.finish_reason == "stop"


def test_one_log_line_with_fields_and_no_text_by_default(caplog: pytest.LogCaptureFixture) -> None:
    telemetry, _ = make(log_prompts=False)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        Done(reason="length").finish(telemetry, "secret prompt")
    (line,) = request_lines(caplog)
    assert line.levelno == logging.INFO
    assert line.event == "request"
    assert line.request_id == "client-id-1"
    assert line.route == "predict"
    assert (line.prompt_tokens, line.output_tokens) == (5, 4)
    assert line.finish_reason == "length"
    assert line.ttft_s == pytest.approx(0.1, abs=1e-3)
    assert line.duration_s >= 0.5
    assert not hasattr(line, "prompt") and not hasattr(line, "output")
    assert "secret prompt" not in line.getMessage()
    assert "generated words" not in line.getMessage()
    assert "client-id-1" in line.getMessage()


def test_log_prompts_adds_prompt_and_output(caplog: pytest.LogCaptureFixture) -> None:
    telemetry, _ = make(log_prompts=True)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        Done().finish(telemetry, "the prompt")
    (line,) = request_lines(caplog)
    assert line.prompt == "the prompt"
    assert line.output == "generated words"


@pytest.mark.parametrize(
    ("status", "reason"),
    [
        (400, "invalid"),
        (404, "invalid"),
        (408, "invalid"),
        (413, "invalid"),
        (429, "rejected"),
        (503, "rejected"),
        (499, "client_gone"),
        (500, "error"),
    ],
)
def test_a_refusal_is_counted_under_its_reason(status: int, reason: str) -> None:
    telemetry, registry = make()
    record = RequestRecord("r", "completions")
    telemetry.finished(record, Outcome(RequestError("no", status=status).finish_reason))
    labels = {"route": "completions", "finished_reason": reason}
    assert value(registry, "mtt:request_finished_total", labels) == 1
    assert value(registry, "mtt:time_to_first_token_seconds_count", {"route": "completions"}) == 0


@pytest.mark.parametrize("reason", ["invalid", "rejected", "client_gone"])
def test_a_refusal_is_counted_but_not_put_in_the_histograms(reason: str) -> None:
    telemetry, registry = make()
    record = RequestRecord(request_id="r", route="predict")
    telemetry.finished(record, Outcome(reason))
    route = {"route": "predict"}
    assert value(registry, "mtt:request_finished_total", route | {"finished_reason": reason}) == 1
    assert not value(registry, "mtt:e2e_request_latency_seconds_count", route)
    assert not value(registry, "mtt:request_prompt_tokens_count")
    assert not value(registry, "mtt:request_generation_tokens_count")
