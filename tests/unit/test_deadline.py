"""A deadline per request (mistral_serving.generation.deadline): the rule, and what the service does
when it passes, on every engine kind (both PyTorch engines, replay, the engine process, and
both TensorRT-LLM kinds through the double in tests/doubles/fake_tensorrt_llm).

No assertion here rests on how fast a machine is: the consumer waits until the deadline
has passed (on the monotonic clock) before it asks for more, so the outcome is decided by
the clock, not by the engine's speed."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from mistral_gpu_fallback.replay import ReplayEngine
from mistral_serving.artifacts.artifact import open_artifact
from mistral_serving.engines.base import EngineLimits, SamplingOptions
from mistral_serving.engines.factory import start_engine, start_torch_engine
from mistral_serving.errors import RequestError
from mistral_serving.generation import deadline
from mistral_serving.generation.outcome import Outcome
from mistral_serving.generation.service import GenerationService, PreparedRequest
from mistral_serving.ops.metrics import Metrics
from mistral_serving.ops.record import RequestRecord
from mistral_serving.settings import Settings
from mistral_serving.text.tokenizer import Tokenizer
from tests.doubles.trtllm_helpers import load, load_pytorch_kind

WAIT_S = 60  # a bound on waiting for a condition, never a speed assertion
LONG = SamplingOptions(max_new_tokens=200, top_k=1, ignore_eos=True)
PROMPT = [1, 415, 5565, 302]


# ---- the rule ----------------------------------------------------------------------------


def test_no_setting_and_no_header_is_no_deadline() -> None:
    assert deadline.deadline_for({}, 0.0, 100.0) is None


def test_the_shortest_limit_wins_and_a_header_never_lifts_the_setting() -> None:
    assert deadline.deadline_for({}, 30.0, 100.0) == 130.0
    assert deadline.deadline_for({"X-Request-Timeout": "2.5"}, 30.0, 100.0) == 102.5
    assert deadline.deadline_for({"X-Request-Timeout": "90"}, 30.0, 100.0) == 130.0
    assert deadline.deadline_for({"X-Request-Timeout": "90"}, 0.0, 100.0) == 190.0
    envoy = {"x-envoy-expected-rq-timeout-ms": "1500", "X-Request-Timeout": "9"}
    assert deadline.deadline_for(envoy, 30.0, 100.0) == 101.5


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "1e9", "soon", "", "1" * 40])
def test_a_bad_header_is_a_400_in_one_line(value: str) -> None:
    with pytest.raises(RequestError) as err:
        deadline.deadline_for({"X-Request-Timeout": value}, 0.0, 0.0)
    assert err.value.status == 400 and "\n" not in err.value.message
    assert len(err.value.message) < 200


@hsettings(max_examples=200, deadline=None)
@given(
    st.text(max_size=64), st.sampled_from([deadline.TIMEOUT_HEADER, deadline.ENVOY_TIMEOUT_HEADER])
)
def test_any_header_value_gives_a_deadline_or_a_400(value: str, name: str) -> None:
    try:
        found = deadline.deadline_for({name: value}, 0.0, 10.0)
    except RequestError as err:
        assert err.status == 400 and "\n" not in err.message
    else:
        assert found is not None and 10.0 < found <= 10.0 + deadline.MAX_TIMEOUT_S


def test_within_gives_the_result_or_a_504_and_cancels() -> None:
    cancelled = []

    async def slow() -> str:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise
        return "late"

    async def main() -> None:
        assert await deadline.within(None, asyncio.sleep(0, "now"), "x") == "now"
        with pytest.raises(RequestError) as err:
            await deadline.within(time.monotonic() + 0.05, slow(), "while queued")
        assert err.value.status == 504 and "while queued" in err.value.message

    asyncio.run(main())
    assert cancelled == [True]


# ---- every engine kind -------------------------------------------------------------------


def _torch(dev_model: Path, **settings: Any) -> Any:
    return start_torch_engine(
        dev_model, Settings(artifact=str(dev_model), device="cpu", **settings), 2
    )


def _process(dev_model: Path, tok: Tokenizer) -> Any:
    s = Settings(artifact=str(dev_model), device="cpu", engine_process="on")
    return start_engine(open_artifact(dev_model, s), s, tok)


ENGINES: dict[str, Callable[..., Any]] = {
    "pytorch": lambda dev_model, tok, tmp: _torch(dev_model),
    "pytorch_static": lambda dev_model, tok, tmp: _torch(
        dev_model, pytorch_kv_cache="static", max_seq_len=512
    ),
    "replay": lambda dev_model, tok, tmp: ReplayEngine(
        list(range(1000, 1300)),
        eos_token_id=2,
        limits=EngineLimits(max_input_len=64, max_seq_len=512, max_batch_size=4),
        step_s=0.001,
    ),
    "process": lambda dev_model, tok, tmp: _process(dev_model, tok),
    "tensorrt_llm": lambda dev_model, tok, tmp: load(tmp),
    "trtllm_pytorch": lambda dev_model, tok, tmp: load_pytorch_kind(tmp),
}


@pytest.fixture(params=list(ENGINES))
def any_engine(
    request: pytest.FixtureRequest, dev_model: Path, tok: Tokenizer, tmp_path: Path
) -> Iterator[Any]:
    if request.param in ("tensorrt_llm", "trtllm_pytorch"):
        request.getfixturevalue("fake_trtllm")
    engine = ENGINES[request.param](dev_model, tok, tmp_path)
    if hasattr(engine, "llm"):
        engine.llm.script = list(range(1000, 1300))
    yield engine
    engine.shutdown()


def service_on(engine: Any, tok: Tokenizer) -> GenerationService:
    return GenerationService(Settings(), tok, engine, metrics=Metrics(CollectorRegistry()))


async def wait_for(condition: Callable[[], bool], what: str) -> None:
    end = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < end, what
        await asyncio.sleep(0.01)


def test_a_deadline_that_passes_while_generating_aborts_the_engine_request(
    any_engine: Any, tok: Tokenizer
) -> None:
    service = service_on(any_engine, tok)
    record = RequestRecord("deadline", "predict")
    chunks: list[str] = []

    async def main() -> Outcome | None:
        record.deadline = time.monotonic() + 1.0
        generation = service.generate(PreparedRequest(PROMPT, LONG, (), 1), record)
        async for chunk in generation:
            chunks.append(chunk.text)
            if len(chunks) == 1:
                # Past the deadline before asking for more: the outcome is the clock's.
                await asyncio.sleep(max(0.0, record.deadline - time.monotonic()) + 0.01)
        await wait_for(lambda: any_engine.num_running() == 0, "the engine request was aborted")
        return generation.outcome

    outcome = asyncio.run(main())
    assert outcome is not None and outcome.reason == "timeout"
    assert len(chunks) >= 1 and outcome.completion_tokens < LONG.max_new_tokens
    assert outcome.text == "".join(chunks)
    if hasattr(any_engine, "llm"):  # the double saw the cancel (upstream: result.abort())
        assert any_engine.llm.requests[-1].aborted()


def test_a_deadline_already_past_never_reaches_the_engine(any_engine: Any, tok: Tokenizer) -> None:
    service = service_on(any_engine, tok)
    record = RequestRecord("late", "predict")
    record.deadline = time.monotonic() - 0.001

    generation = service.generate(PreparedRequest(PROMPT, LONG, (), 1), record)

    async def main() -> list[str]:
        return [c.text async for c in generation]

    before = len(any_engine.llm.requests) if hasattr(any_engine, "llm") else None
    assert asyncio.run(main()) == []
    assert generation.outcome is not None and generation.outcome.reason == "timeout"
    assert record.submitted_at is None
    assert any_engine.num_running() == 0
    if before is not None:
        assert len(any_engine.llm.requests) == before  # generate_async never called


def test_the_service_counts_a_timeout_once_with_its_reason(tok: Tokenizer) -> None:
    registry = CollectorRegistry()
    engine = ReplayEngine(
        list(range(1000, 1100)),
        eos_token_id=2,
        limits=EngineLimits(max_input_len=64, max_seq_len=512, max_batch_size=4),
        step_s=0.001,
    )
    service = GenerationService(Settings(), tok, engine, metrics=Metrics(registry))
    record = RequestRecord("t", "completions")

    async def main() -> None:
        # As the frontend runs it: the generation, then the record closed with its outcome.
        record.deadline = time.monotonic() + 0.5
        generation = service.generate(PreparedRequest(PROMPT, LONG, (), 1), record)
        async for _ in generation:
            await asyncio.sleep(max(0.0, record.deadline - time.monotonic()) + 0.01)
        assert generation.outcome is not None
        service.telemetry.finished(record, generation.outcome)

    try:
        asyncio.run(main())
    finally:
        engine.shutdown()
    value = registry.get_sample_value(
        "mtt:request_finished_total", {"route": "completions", "finished_reason": "timeout"}
    )
    assert value == 1.0
    # it was generating: its latency is observed (a refusal's would not be)
    assert (
        registry.get_sample_value("mtt:e2e_request_latency_seconds_count", {"route": "completions"})
        == 1.0
    )


@pytest.mark.parametrize(
    "raw",
    [
        [(b"x-request-timeout", b"3600"), (b"x-request-timeout", b"2")],
        [(b"x-request-timeout", b"2"), (b"x-request-timeout", b"3600")],
        [
            (b"x-envoy-expected-rq-timeout-ms", b"9000000"),
            (b"x-envoy-expected-rq-timeout-ms", b"2000"),
        ],
    ],
)
def test_a_header_sent_twice_counts_with_its_smallest_value(raw: list[tuple[bytes, bytes]]) -> None:
    """A client's larger timeout sent before a gateway's smaller one does not lift it."""
    from starlette.datastructures import Headers

    assert deadline.deadline_for(Headers(raw=raw), 0, 100.0) == 102.0
