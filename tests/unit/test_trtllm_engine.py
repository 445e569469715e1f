"""Loading, streaming and abort. The TensorRT-LLM adapter against the `tensorrt_llm` test double (tests/doubles/fake_tensorrt_llm,
see its README; the fixture is tests/unit/conftest.py::fake_trtllm). Nothing of TensorRT-LLM runs here."""

from __future__ import annotations

import asyncio

import pytest

from mistral_serving.engines.base import (
    Engine,
    EngineLimits,
    EngineRequestError,
    SamplingOptions,
    TokenDelta,
)
from mistral_serving.engines.trtllm.checks import EngineCheckError
from mistral_serving.engines.trtllm.engine import TrtLlmEngine, to_sampling_params
from mistral_serving.settings import Settings
from tests.doubles.trtllm_helpers import (
    EOS,
    consume,
    load,
    run,
    tokens_of,
)

# -- load --------------------------------------------------------------------------------


def test_load_constructs_llm_for_token_ids(fake_trtllm, tmp_path):
    engine = load(tmp_path, Settings(kv_cache_free_gpu_memory_fraction=0.55))
    args = engine.llm.args
    assert args.model == str(tmp_path / "engine")
    # The artifact's tokenizer files: xgrammar builds its tables from the LLM's tokenizer.
    assert args.skip_tokenizer_init is False and args.tokenizer == str(tmp_path / "engine")
    assert args.guided_decoding_backend == "xgrammar"
    assert args.kv_cache_config.free_gpu_memory_fraction == 0.55
    policy = args.scheduler_config.capacity_scheduler_policy
    assert policy == fake_trtllm.llmapi.CapacitySchedulerPolicy.GUARANTEED_NO_EVICT
    assert isinstance(engine, Engine)
    assert engine.eos_token_id == EOS
    assert engine.info.name == "tensorrt_llm"
    assert engine.info.details["tensorrt_llm_version"] == "1.2.1"


@pytest.mark.parametrize("paged_context_fmha", [True, False])
def test_chunked_prefill_follows_the_engines_paged_context_fmha(
    fake_trtllm, tmp_path, paged_context_fmha
):
    engine = load(tmp_path, paged_context_fmha=paged_context_fmha)
    assert engine.llm.args.enable_chunked_prefill is paged_context_fmha


def test_limits_come_from_config_json(fake_trtllm, tmp_path):
    engine = load(tmp_path, max_input_len=1500, max_seq_len=3000, max_batch_size=16)
    assert engine.limits == EngineLimits(max_input_len=1500, max_seq_len=3000, max_batch_size=16)


def test_settings_lower_the_limits(fake_trtllm, tmp_path):
    engine = load(tmp_path, Settings(max_input_len=512, max_seq_len=1024))
    assert engine.limits == EngineLimits(max_input_len=512, max_seq_len=1024, max_batch_size=8)


def test_input_limit_leaves_room_for_one_output_token(fake_trtllm, tmp_path):
    engine = load(tmp_path, max_input_len=None, max_seq_len=2048)
    assert engine.limits.max_input_len == 2047


def test_load_refuses_an_engine_from_another_version(fake_trtllm, tmp_path):
    with pytest.raises(EngineCheckError, match="1.2.0rc5"):
        load(tmp_path, version="1.2.0rc5")
    assert fake_trtllm._tensorrt_engine.LLM.instances == []  # never started


def test_load_refuses_an_engine_for_another_gpu(fake_trtllm, tmp_path):
    with pytest.raises(EngineCheckError, match="8.0"):
        load(tmp_path, capability="8.0")
    assert fake_trtllm._tensorrt_engine.LLM.instances == []


def test_load_refuses_settings_above_the_engine(fake_trtllm, tmp_path):
    with pytest.raises(EngineCheckError, match="max_seq_len"):
        load(tmp_path, Settings(max_seq_len=4096))


# -- streaming -----------------------------------------------------------------------------


def test_streams_one_delta_per_step_and_ends_with_length(fake_trtllm, tmp_path):
    engine = load(tmp_path)
    deltas = run(engine, SamplingOptions(max_new_tokens=5, top_k=1))
    script = engine.llm.script
    assert [d.token_ids for d in deltas] == [[t] for t in script[:5]]
    assert [d.finish_reason for d in deltas] == [None] * 4 + ["length"]
    request = engine.llm.requests[0]
    assert request.prompt_token_ids == [1, 5, 6]
    assert request.sampling_params.max_tokens == 5
    assert request._streaming is True


def test_streams_several_tokens_per_step(fake_trtllm, tmp_path):
    engine = load(tmp_path)
    engine.llm.tokens_per_step = 3
    deltas = run(engine, SamplingOptions(max_new_tokens=7))
    assert [len(d.token_ids) for d in deltas] == [3, 3, 1]
    assert tokens_of(deltas) == engine.llm.script[:7]


@pytest.mark.parametrize("runtime_includes_eos", [False, True])
def test_eos_ends_with_stop_and_is_not_streamed(fake_trtllm, tmp_path, runtime_includes_eos):
    engine = load(tmp_path)
    engine.llm.script = [10, 11, 12, EOS, 99]
    engine.llm.include_end_id_in_output = runtime_includes_eos
    deltas = run(engine, SamplingOptions(max_new_tokens=50))
    assert tokens_of(deltas) == [10, 11, 12]
    assert deltas[-1].finish_reason == "stop"
    assert all(d.finish_reason is None for d in deltas[:-1])


def test_stop_token_ends_with_stop_and_is_not_streamed(fake_trtllm, tmp_path):
    engine = load(tmp_path)
    engine.llm.script = [10, 11, 13, 12]
    deltas = run(engine, SamplingOptions(max_new_tokens=50, stop_token_ids=(13,)))
    assert tokens_of(deltas) == [10, 11]
    assert deltas[-1].finish_reason == "stop"


def test_max_tokens_is_clamped_to_the_sequence_limit(fake_trtllm, tmp_path):
    engine = load(tmp_path, max_input_len=2047, max_seq_len=2048)
    deltas = run(engine, SamplingOptions(max_new_tokens=100), prompt=[7] * 2040)
    assert engine.llm.requests[0].sampling_params.max_tokens == 8
    assert len(tokens_of(deltas)) == 8 and deltas[-1].finish_reason == "length"


def test_prompt_above_input_limit_is_a_request_error(fake_trtllm, tmp_path):
    engine = load(tmp_path, max_input_len=16)
    with pytest.raises(EngineRequestError, match="17 tokens"):
        run(engine, SamplingOptions(max_new_tokens=4), prompt=[7] * 17)
    assert engine.llm.requests == [] and engine.is_healthy()


def test_empty_prompt_is_a_request_error(fake_trtllm, tmp_path):
    engine = load(tmp_path)
    with pytest.raises(EngineRequestError):
        asyncio.run(consume(engine, "r1", [], SamplingOptions(max_new_tokens=4)))


def test_value_error_from_generate_async_is_a_request_error(fake_trtllm, tmp_path):
    # The adapter believes in a longer max_seq_len than the engine's; without chunked
    # prefill the LLM API refuses (`_check_arguments`).
    real = load(tmp_path, max_seq_len=64, max_input_len=32, paged_context_fmha=False)
    engine = TrtLlmEngine(
        real.llm, limits=EngineLimits(32, 4096, 8), eos_token_id=EOS, request_error=None
    )
    with pytest.raises(EngineRequestError, match="max_seq_len"):
        run(engine, SamplingOptions(max_new_tokens=100))
    assert engine.is_healthy()


def test_duplicate_request_id_is_refused(fake_trtllm, tmp_path):
    engine = load(tmp_path)

    async def main():
        first = engine.generate("same", [1, 2], SamplingOptions(max_new_tokens=10))
        await first.__anext__()
        with pytest.raises(EngineRequestError, match="same"):
            await consume(engine, "same", [1, 2], SamplingOptions(max_new_tokens=10))
        await first.aclose()

    asyncio.run(main())


# -- abort -------------------------------------------------------------------------------


def test_closing_the_stream_early_aborts_the_request(fake_trtllm, tmp_path):
    engine = load(tmp_path)

    async def main():
        stream = engine.generate("r1", [1, 2], SamplingOptions(max_new_tokens=50))
        await stream.__anext__()
        await stream.__anext__()
        await stream.aclose()  # what the server does when the client goes away

    asyncio.run(main())
    request = engine.llm.requests[0]
    assert request.aborted()
    assert engine.llm._executor.aborted_ids == [request.request_id]
    assert engine._results == {}


def test_cancelling_the_consumer_aborts_the_request(fake_trtllm, tmp_path):
    engine = load(tmp_path)
    engine.llm.step_delay = 0.01

    async def main():
        first = asyncio.Event()

        async def reader():
            async for _ in engine.generate("r1", [1, 2], SamplingOptions(max_new_tokens=50)):
                first.set()

        task = asyncio.create_task(reader())
        await first.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert engine.llm.requests[0].aborted()


def test_abort_by_request_id_ends_the_stream_with_abort(fake_trtllm, tmp_path):
    engine = load(tmp_path)

    async def main():
        deltas = []
        async for delta in engine.generate("r7", [1, 2], SamplingOptions(max_new_tokens=50)):
            deltas.append(delta)
            if len(deltas) == 2:
                engine.abort("r7")
        return deltas

    deltas = asyncio.run(main())
    # abort() only queues the cancel: one more step of tokens arrives, then 'cancelled'.
    assert [d.token_ids for d in deltas] == [[1000], [1001], [1002], []]
    assert deltas[-1] == TokenDelta(token_ids=[], finish_reason="abort")
    assert engine.llm._executor.aborted_ids == [engine.llm.requests[0].request_id]


def test_abort_of_unknown_or_finished_request_does_nothing(fake_trtllm, tmp_path):
    engine = load(tmp_path)
    engine.abort("nobody")
    run(engine, SamplingOptions(max_new_tokens=3))
    engine.abort("r1")
    assert engine.llm._executor.aborted_ids == []


def test_finished_stream_is_not_aborted(fake_trtllm, tmp_path):
    engine = load(tmp_path)
    engine.llm.script = [10, EOS]
    run(engine, SamplingOptions(max_new_tokens=3))
    run(engine, SamplingOptions(max_new_tokens=3), rid="r2")
    assert engine.llm._executor.aborted_ids == []
    assert not any(r.aborted() for r in engine.llm.requests)


# -- the LLM API's argument checks: chunked prefill leaves the length to us -------------


def test_with_chunked_prefill_the_llm_api_does_not_check_the_length(fake_trtllm, tmp_path):
    # `_check_arguments` skips prompt + max_tokens <= max_seq_len when chunked prefill is on
    # (always, for our engines): the adapter's clamp is the only guard.
    engine = load(tmp_path, max_input_len=32, max_seq_len=64)
    assert engine.llm.args.enable_chunked_prefill is True
    sp = to_sampling_params(SamplingOptions(max_new_tokens=100), EOS, 0)
    engine.llm.generate_async([1] * 10, sampling_params=sp, streaming=True)  # no ValueError
    deltas = run(engine, SamplingOptions(max_new_tokens=100), prompt=[1] * 10, rid="ok")
    assert engine.llm.requests[-1].sampling_params.max_tokens == 54
    assert len(tokens_of(deltas)) == 54 and deltas[-1].finish_reason == "length"
