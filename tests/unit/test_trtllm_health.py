"""Health, per-request failures and shutdown. The TensorRT-LLM adapter against the `tensorrt_llm` test double (tests/doubles/fake_tensorrt_llm,
see its README; the fixture is tests/unit/conftest.py::fake_trtllm). Nothing of TensorRT-LLM runs here."""

from __future__ import annotations

import asyncio
import sys

import pytest

from mistral_serving.engines.base import (
    EngineError,
    EngineLimits,
    SamplingOptions,
)
from mistral_serving.engines.trtllm.checks import EngineCheckError
from mistral_serving.engines.trtllm.engine import TrtLlmEngine
from mistral_serving.settings import Settings
from tests.doubles.trtllm_helpers import (
    EOS,
    H100,
    load,
    make_engine_dir,
    run,
    tokens_of,
)

# -- health and shutdown -------------------------------------------------------------------


def test_fatal_executor_error_marks_unhealthy(fake_trtllm, tmp_path):
    engine = load(tmp_path)
    assert engine.is_healthy()

    async def main():
        stream = engine.generate("r1", [1, 2], SamplingOptions(max_new_tokens=50))
        await stream.__anext__()
        engine.llm.fail_background(RuntimeError("CUDA error: an illegal memory access"))
        with pytest.raises(EngineError, match="illegal memory access"):
            await stream.__anext__()

    asyncio.run(main())
    assert not engine.is_healthy()


def test_unhealthy_from_the_executor_state_alone(fake_trtllm, tmp_path):
    engine = load(tmp_path)
    engine.llm._executor.shutdown()  # e.g. shut down by another request's failure
    assert not engine.is_healthy()


def test_generate_after_executor_is_gone_fails_and_marks_unhealthy(fake_trtllm, tmp_path):
    engine = load(tmp_path)
    engine.llm.shutdown()  # "LLM is shutting down" from generate_async
    with pytest.raises(EngineError, match="shutting down"):
        run(engine, SamplingOptions(max_new_tokens=3))
    assert not engine.is_healthy()


def test_per_request_error_keeps_the_engine_healthy(fake_trtllm, tmp_path):
    engine = load(tmp_path)
    engine.llm.next_request_error = "Encountered an error in forwardAsync for this request"
    with pytest.raises(EngineError, match="forwardAsync"):
        run(engine, SamplingOptions(max_new_tokens=3))
    assert engine.is_healthy()
    assert tokens_of(run(engine, SamplingOptions(max_new_tokens=3), rid="r2"))


def test_shutdown_calls_llm_shutdown_once(fake_trtllm, tmp_path):
    engine = load(tmp_path)
    engine.shutdown()
    engine.shutdown()
    assert engine.llm.shutdown_calls == 1
    assert not engine.is_healthy()


def test_fatal_error_stays_unhealthy_even_if_the_executor_looks_fine(fake_trtllm, tmp_path):
    engine = load(tmp_path)
    engine.llm.fail_background(RuntimeError("NCCL error"))
    with pytest.raises(EngineError):
        run(engine, SamplingOptions(max_new_tokens=3))
    engine.llm._executor.doing_shutdown = False  # a runtime that does not report it
    engine.llm._executor.background_error = None
    assert not engine.is_healthy()


def test_health_without_a_visible_executor(fake_trtllm, tmp_path):
    class OpaqueLLM:  # a future LLM API without the private `_executor`
        def shutdown(self) -> None:
            pass

    engine = TrtLlmEngine(OpaqueLLM(), limits=EngineLimits(16, 32, 1), eos_token_id=EOS)
    assert engine.is_healthy()
    engine.shutdown()
    assert not engine.is_healthy()


def test_load_without_tensorrt_llm_says_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorrt_llm", None)  # import -> ImportError
    engine_dir = make_engine_dir(tmp_path)
    with pytest.raises(EngineCheckError, match="cannot be imported"):
        TrtLlmEngine.load(engine_dir, Settings(), eos_token_id=EOS, gpu=H100)


# -- per-request failures, abort once, shutdown --------------------------------------------


def test_a_request_error_leaves_the_result_unfinished_and_is_cancelled_once(fake_trtllm, tmp_path):
    engine = load(tmp_path)
    engine.llm.next_request_error = "Encountered an error for this request"
    with pytest.raises(EngineError, match="this request"):
        run(engine, SamplingOptions(max_new_tokens=3))
    request = engine.llm.requests[0]
    assert not request.finished  # as upstream: not marked done
    assert engine.llm._executor.aborted_ids == [request.request_id]  # one extra cancel
    assert engine.is_healthy() and engine.num_running() == 0


async def _collect(engine, rid, prompt, opts, poison_after=None):
    deltas = []
    async for delta in engine.generate(rid, prompt, opts):
        deltas.append(delta)
        if poison_after is not None and len(deltas) == poison_after:
            result = engine._results[rid]
            engine.llm.fail_request(result, "CUDA error in this request's sampler")
    return deltas


def test_a_poisoned_request_fails_alone_in_a_running_batch(fake_trtllm, tmp_path):
    prompts = {f"r{i}": [1, 2, 3 + i] for i in range(4)}
    opts = SamplingOptions(max_new_tokens=12, temperature=0.7, seed=5)

    async def batch(engine, poison: str | None):
        tasks = {
            rid: asyncio.create_task(_collect(engine, rid, p, opts, 4 if rid == poison else None))
            for rid, p in prompts.items()
        }
        await asyncio.wait(tasks.values())
        return {rid: (t.exception() or t.result()) for rid, t in tasks.items()}

    clean_engine = load(tmp_path / "a")
    clean = asyncio.run(batch(clean_engine, None))
    engine = load(tmp_path / "b")
    poisoned = asyncio.run(batch(engine, "r2"))
    assert isinstance(poisoned["r2"], EngineError) and "sampler" in str(poisoned["r2"])
    for rid in ("r0", "r1", "r3"):
        assert poisoned[rid] == clean[rid]
        assert poisoned[rid][-1].finish_reason == "length"
    assert engine.is_healthy() and engine.num_running() == 0
    assert tokens_of(run(engine, opts, rid="after")) == tokens_of(clean["r0"])


def test_abort_then_client_gone_cancels_once(fake_trtllm, tmp_path):
    engine = load(tmp_path)

    async def main():
        stream = engine.generate("r1", [1, 2], SamplingOptions(max_new_tokens=50))
        await stream.__anext__()
        engine.abort("r1")
        engine.abort("r1")
        await stream.aclose()  # the stream's cleanup would cancel again

    asyncio.run(main())
    assert engine.llm._executor.aborted_ids == [engine.llm.requests[0].request_id]


def test_shutdown_stops_the_executor(fake_trtllm, tmp_path):
    engine = load(tmp_path)
    executor = engine.llm._executor
    engine.shutdown()
    assert executor.shutdown_calls == 1 and executor.is_shutdown()
    assert engine.llm._executor is None
    with pytest.raises(EngineError, match="shutting down"):
        run(engine, SamplingOptions(max_new_tokens=3))


def test_shutdown_never_raises(fake_trtllm, tmp_path):
    engine = load(tmp_path)

    def broken() -> None:
        raise RuntimeError("MPI finalize failed")

    engine.llm.shutdown = broken
    engine.shutdown()
    assert not engine.is_healthy()
