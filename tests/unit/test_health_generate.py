"""The deep probe (`GET /health/generate`, http/health.py): one greedy token straight from
the engine within its deadline (200, state ready, no request counted), an engine that
gives none in time or fails it (503, state dead, the probe aborted), a server that is not
ready (503 with its state, the engine never asked), and concurrent probes sharing one
generation that a prober's leaving does not cancel."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry

from mistral_serving.engines.base import EngineError, EngineLimits
from mistral_serving.generation.service import GenerationService
from mistral_serving.http.frontend import Frontend
from mistral_serving.http.health import DeepProbe
from mistral_serving.http.server import extend
from mistral_serving.http.server_state import STATE_HEADER
from mistral_serving.ops.metrics import Metrics
from mistral_serving.settings import Settings
from mistral_serving.text.tokenizer import Tokenizer
from tests.doubles.scripted_engine import ScriptedEngine

LIMITS = EngineLimits(max_input_len=32, max_seq_len=64, max_batch_size=4)
PATH = "/health/generate"

pytestmark = pytest.mark.usefixtures("restore_sigterm")


def served(tok: Tokenizer, engine: ScriptedEngine, timeout: float = 30) -> Frontend:
    metrics = Metrics(CollectorRegistry())
    frontend = Frontend(Settings(health_generate_timeout_seconds=timeout), metrics)
    frontend.attach(GenerationService(frontend.settings, tok, engine, metrics=metrics))
    return frontend


def finished(frontend: Frontend) -> float:
    return sum(s.value for m in frontend.metrics.finished.collect() for s in m.samples)


def test_an_answering_engine_is_ready(tok: Tokenizer) -> None:
    engine = ScriptedEngine.from_ids(tok.encode("fine thanks"), limits=LIMITS)
    frontend = served(tok, engine)
    with TestClient(extend(FastAPI(), frontend)) as client:
        answer = client.get(PATH)
    assert answer.status_code == 200 and answer.headers[STATE_HEADER] == "ready"
    body = answer.json()
    assert body["status"] == "ready" and body["seconds"] >= 0
    (call,) = engine.calls
    assert call.request_id.startswith("health-probe-")
    assert (call.sampling.max_new_tokens, call.sampling.top_k) == (1, 1)
    assert call.prompt_ids == tok.encode("ok", bos=True)
    assert engine.aborted == [call.request_id]  # one token was enough: the rest is stopped
    assert finished(frontend) == 0  # not a client's request
    assert frontend.service is not None and frontend.service.live == set()


@pytest.mark.parametrize("failure", ["hung", "fails"])
def test_an_engine_that_gives_no_token_is_dead(tok: Tokenizer, failure: str) -> None:
    script: list[Any] = [] if failure == "hung" else [EngineError("executor died")]
    engine = ScriptedEngine(script, limits=LIMITS)
    frontend = served(tok, engine, timeout=0.05)  # the deadline only bounds a hung engine
    with TestClient(extend(FastAPI(), frontend)) as client:
        answer = client.get(PATH)
        plain = client.get("/health")
    assert answer.status_code == 503 and answer.headers[STATE_HEADER] == "dead"
    reason = answer.json()["reason"]
    assert reason == ("no token within 0.05s" if failure == "hung" else "executor died")
    (call,) = engine.calls
    assert engine.aborted == [call.request_id]
    assert frontend.service is not None and frontend.service.live == set()
    # The verdict is the deep probe's own: the plain probe still says what it knows.
    assert (plain.status_code, plain.headers[STATE_HEADER]) == (200, "ready")


def test_a_server_that_is_not_ready_asks_no_engine(tok: Tokenizer) -> None:
    loading = Frontend(Settings(), Metrics(CollectorRegistry()))
    with TestClient(extend(FastAPI(), loading)) as client:
        answer = client.get(PATH)
    assert (answer.status_code, answer.headers[STATE_HEADER]) == (503, "starting")
    engine = ScriptedEngine.from_ids([5, 6], limits=LIMITS)
    draining = served(tok, engine)
    draining.drainer.draining = draining.admission.draining = True
    with TestClient(extend(FastAPI(), draining)) as client:
        answer = client.get(PATH)
    assert (answer.status_code, answer.headers[STATE_HEADER]) == (503, "draining")
    assert answer.json() == {"status": "draining"} and engine.calls == []


def test_concurrent_probes_share_one_generation_and_a_leaver_cancels_none(
    tok: Tokenizer,
) -> None:
    # Each step waits a little, so the generation is still running when a prober leaves.
    engine = ScriptedEngine.from_ids([7, 8], limits=LIMITS, step_delay_s=0.05)
    probe = DeepProbe(served(tok, engine))

    async def main() -> None:
        answers = await asyncio.gather(probe.answer(), probe.answer(), probe.answer())
        assert [a.status_code for a in answers] == [200, 200, 200]
        assert len(engine.calls) == 1  # one generation for the three
        leaver = asyncio.create_task(probe.answer())
        other = asyncio.create_task(probe.answer())
        await asyncio.sleep(0)  # both wait on the same generation now
        assert probe._running is not None and not probe._running.done()
        leaver.cancel()  # a prober that hung up
        assert (await other).status_code == 200
        assert len(engine.calls) == 2

    asyncio.run(main())
