"""The TensorRT-LLM adapter against the `tensorrt_llm` test double
(tests/doubles/fake_tensorrt_llm, see its README). Nothing of TensorRT-LLM runs here."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hyp_settings
from hypothesis import strategies as st

from mistral_serving.engine_checks import EngineCheckError, GpuInfo
from mistral_serving.engines import trtllm
from mistral_serving.engines.base import (
    Engine,
    EngineError,
    EngineLimits,
    EngineRequestError,
    GuidedDecoding,
    SamplingOptions,
    TokenDelta,
)
from mistral_serving.engines.trtllm import TrtLlmEngine, to_sampling_params
from mistral_serving.engines.trtllm_pytorch import TrtLlmPytorchEngine
from mistral_serving.manifest import BuildManifest, GpuRecord, write_manifest
from mistral_serving.settings import Settings

REPO = Path(__file__).resolve().parents[2]
FAKE_ROOT = REPO / "tests" / "doubles" / "fake_tensorrt_llm"
EOS = 2
H100 = GpuInfo(name="NVIDIA H100 80GB HBM3", capability="9.0", count=1)


def _drop_tensorrt_llm_modules() -> None:
    for name in list(sys.modules):
        if name == "tensorrt_llm" or name.startswith("tensorrt_llm."):
            del sys.modules[name]


@pytest.fixture
def fake_trtllm(monkeypatch: pytest.MonkeyPatch):
    """Import `tensorrt_llm` from the test double, fresh for this test."""
    for name in list(sys.modules):
        if name == "tensorrt_llm" or name.startswith("tensorrt_llm."):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.syspath_prepend(str(FAKE_ROOT))
    import tensorrt_llm

    assert Path(tensorrt_llm.__file__).is_relative_to(FAKE_ROOT)
    yield tensorrt_llm
    _drop_tensorrt_llm_modules()


def make_engine_dir(
    root: Path,
    *,
    version: str = "1.2.1",
    max_input_len: int | None = 1024,
    max_seq_len: int = 2048,
    max_batch_size: int = 8,
    capability: str = "9.0",
    paged_context_fmha: bool = True,
) -> Path:
    engine_dir = root / "engine"
    engine_dir.mkdir(parents=True)
    build = {
        "max_batch_size": max_batch_size,
        "max_seq_len": max_seq_len,
        "max_num_tokens": 8192,
        "plugin_config": {"use_paged_context_fmha": paged_context_fmha},
    }
    if max_input_len is not None:
        build["max_input_len"] = max_input_len
    config = {
        "version": version,
        "pretrained_config": {
            "architecture": "LlamaForCausalLM",
            "dtype": "bfloat16",
            "vocab_size": 32000,
            "max_position_embeddings": 32768,
            "mapping": {"world_size": 1, "tp_size": 1, "pp_size": 1},
        },
        "build_config": build,
    }
    (engine_dir / "config.json").write_text(json.dumps(config))
    (engine_dir / "rank0.engine").write_bytes(b"\0" * 16)
    write_manifest(
        engine_dir,
        BuildManifest(
            kind="trtllm_engine",
            source_model="mistralai/Mistral-7B-Instruct-v0.2",
            versions={"tensorrt_llm": version},
            gpu=GpuRecord(name="NVIDIA H100 80GB HBM3", compute_capability=capability),
        ),
    )
    return engine_dir


def load(tmp_path: Path, settings: Settings | None = None, **engine_dir_kwargs) -> TrtLlmEngine:
    engine_dir = make_engine_dir(tmp_path, **engine_dir_kwargs)
    return TrtLlmEngine.load(engine_dir, settings or Settings(), eos_token_id=EOS, gpu=H100)


async def consume(engine: TrtLlmEngine, rid: str, prompt: list[int], opts: SamplingOptions):
    return [delta async for delta in engine.generate(rid, prompt, opts)]


def run(engine: TrtLlmEngine, opts: SamplingOptions, prompt: list[int] | None = None, rid="r1"):
    return asyncio.run(consume(engine, rid, prompt or [1, 5, 6], opts))


def tokens_of(deltas: list[TokenDelta]) -> list[int]:
    return [t for d in deltas for t in d.token_ids]


# -- import without tensorrt_llm -------------------------------------------------------


def test_module_imports_without_tensorrt_llm():
    # Importing must not import tensorrt_llm (absent here; slow to import where present).
    code = (
        "import sys, mistral_serving.engines.trtllm, mistral_serving.engine_checks\n"
        "assert 'tensorrt_llm' not in sys.modules, 'tensorrt_llm imported eagerly'\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO / "mistral-trt-truss" / "packages")}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


# -- sampling mapping ------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 31, 33, 512, 4096])
def test_max_tokens_is_always_set(fake_trtllm, n):
    sp = to_sampling_params(SamplingOptions(max_new_tokens=n), EOS, None)
    assert sp.max_tokens == n
    assert fake_trtllm.SamplingParams().max_tokens == 32  # the default we must never keep


options_strategy = st.builds(
    SamplingOptions,
    max_new_tokens=st.integers(1, 32768),
    temperature=st.floats(0.0, 2.0),
    top_k=st.integers(0, 200),
    top_p=st.floats(0.0, 1.0),
    seed=st.none() | st.integers(0, 2**31 - 1),
    repetition_penalty=st.floats(0.5, 2.0),
    presence_penalty=st.floats(-2.0, 2.0),
    frequency_penalty=st.floats(-2.0, 2.0),
    stop_token_ids=st.lists(st.integers(0, 31999), max_size=4).map(tuple),
    ignore_eos=st.booleans(),
    min_tokens=st.integers(0, 64),
    logprobs=st.none() | st.integers(0, 20),
)


@hyp_settings(suppress_health_check=[HealthCheck.function_scoped_fixture], max_examples=200)
@given(
    opts=options_strategy, pad=st.none() | st.integers(0, 31999), prompt_len=st.integers(1, 4096)
)
def test_mapping_invariants(fake_trtllm, opts, pad, prompt_len):
    sp = to_sampling_params(opts, EOS, pad, prompt_len=prompt_len)
    penalised = opts.presence_penalty != 0 or opts.frequency_penalty != 0
    assert sp.prompt_ignore_length == (prompt_len if penalised else None)
    assert sp.ignore_eos == opts.ignore_eos
    assert (sp.min_tokens or 0) == opts.min_tokens
    assert sp.logprobs == (None if opts.logprobs is None else max(opts.logprobs, 1))
    assert isinstance(sp, fake_trtllm.SamplingParams)
    assert sp.max_tokens == opts.max_new_tokens
    assert sp.end_id == EOS
    assert sp.pad_id == (EOS if pad is None else pad)
    assert sp.detokenize is False
    assert sp.n == 1 and not sp.use_beam_search
    assert sp._greedy_decoding == opts.greedy
    if opts.seed is not None:
        assert sp.seed == opts.seed
    if not opts.greedy:
        assert isinstance(sp.seed, int)


def test_greedy_by_top_k_one(fake_trtllm):
    sp = to_sampling_params(SamplingOptions(max_new_tokens=8, temperature=0.9, top_k=1), EOS, 0)
    assert (sp.top_k, sp.top_p, sp.temperature) == (1, None, None)
    assert sp._greedy_decoding


def test_greedy_by_zero_temperature(fake_trtllm):
    sp = to_sampling_params(SamplingOptions(max_new_tokens=8, temperature=0.0, top_k=50), EOS, 0)
    assert sp.top_k == 1 and sp.temperature is None
    assert sp._greedy_decoding


def test_sampling_sets_every_knob_explicitly(fake_trtllm):
    sp = to_sampling_params(
        SamplingOptions(max_new_tokens=8, temperature=0.7, top_k=40, top_p=0.9), EOS, 0
    )
    assert (sp.temperature, sp.top_k, sp.top_p) == (0.7, 40, 0.9)
    assert not sp._greedy_decoding


def test_sampling_off_switches_map_to_explicit_values(fake_trtllm):
    # top_k 0 and top_p 1.0 are "off": all logits, full nucleus, not the C++ defaults.
    sp = to_sampling_params(SamplingOptions(max_new_tokens=8, temperature=0.8), EOS, 0)
    assert (sp.top_k, sp.top_p, sp.temperature) == (0, 1.0, 0.8)
    assert not sp._greedy_decoding


def test_top_p_zero_means_off_not_greedy(fake_trtllm):
    sp = to_sampling_params(SamplingOptions(max_new_tokens=8, temperature=0.8, top_p=0.0), EOS, 0)
    assert sp.top_p == 1.0


def test_seed_is_passed_through(fake_trtllm):
    sp = to_sampling_params(SamplingOptions(max_new_tokens=8, temperature=0.8, seed=1234), EOS, 0)
    assert sp.seed == 1234


def test_unseeded_sampling_gets_a_fresh_seed_per_request(fake_trtllm):
    opts = SamplingOptions(max_new_tokens=8, temperature=0.8)
    seeds = {to_sampling_params(opts, EOS, 0).seed for _ in range(5)}
    assert None not in seeds and len(seeds) > 1


def test_neutral_penalties_stay_unset(fake_trtllm):
    sp = to_sampling_params(SamplingOptions(max_new_tokens=8), EOS, 0)
    assert (sp.repetition_penalty, sp.presence_penalty, sp.frequency_penalty) == (None,) * 3


def test_penalties_are_passed_through(fake_trtllm):
    opts = SamplingOptions(
        max_new_tokens=8, repetition_penalty=1.2, presence_penalty=0.5, frequency_penalty=-0.3
    )
    sp = to_sampling_params(opts, EOS, 0)
    assert (sp.repetition_penalty, sp.presence_penalty, sp.frequency_penalty) == (1.2, 0.5, -0.3)


def test_stop_token_ids_deduplicated_without_eos(fake_trtllm):
    opts = SamplingOptions(max_new_tokens=8, stop_token_ids=(13, EOS, 13, 7))
    assert to_sampling_params(opts, EOS, 0).stop_token_ids == [13, 7]
    assert to_sampling_params(SamplingOptions(max_new_tokens=8), EOS, 0).stop_token_ids is None


@pytest.mark.parametrize(
    "opts",
    [
        SamplingOptions(max_new_tokens=0),
        SamplingOptions(max_new_tokens=8, temperature=0.8, top_p=1.5),
        SamplingOptions(max_new_tokens=8, temperature=0.8, top_p=-0.1),
        SamplingOptions(max_new_tokens=8, repetition_penalty=0.0),
    ],
)
def test_invalid_options_are_request_errors(fake_trtllm, opts):
    with pytest.raises(EngineRequestError):
        to_sampling_params(opts, EOS, 0)


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


# -- penalties, EOS, min_tokens, logprobs, guided decoding ----------------------------------


@pytest.mark.parametrize(
    ("presence", "frequency", "expected"), [(0.0, 0.0, None), (0.5, 0.0, 3), (0.0, -0.3, 3)]
)
def test_prompt_ignore_length_is_the_prompt_when_penalties_apply(
    fake_trtllm, tmp_path, presence, frequency, expected
):
    # Upstream counts prompt tokens in presence/frequency penalties unless told to skip them.
    engine = load(tmp_path)
    opts = SamplingOptions(max_new_tokens=3, presence_penalty=presence, frequency_penalty=frequency)
    run(engine, opts, prompt=[1, 5, 6])
    assert engine.llm.requests[0].sampling_params.prompt_ignore_length == expected


def test_repetition_penalty_alone_leaves_prompt_ignore_length_unset(fake_trtllm):
    # Repetition penalty counts the prompt by contract (HF semantics); prompt_ignore_length
    # applies to presence/frequency only.
    opts = SamplingOptions(max_new_tokens=3, repetition_penalty=1.3)
    assert to_sampling_params(opts, EOS, 0, prompt_len=9).prompt_ignore_length is None


def test_ignore_eos_streams_the_eos_token_and_runs_to_length(fake_trtllm, tmp_path):
    engine = load(tmp_path)
    engine.llm.script = [10, EOS, 11, 12]
    deltas = run(engine, SamplingOptions(max_new_tokens=4, ignore_eos=True))
    assert engine.llm.requests[0].sampling_params.ignore_eos is True
    assert tokens_of(deltas) == [10, EOS, 11, 12]
    assert deltas[-1].finish_reason == "length"


def test_min_tokens_is_passed_and_holds_off_stop_tokens(fake_trtllm, tmp_path):
    engine = load(tmp_path)
    engine.llm.script = [10, 13, 11, 13, 12]
    deltas = run(engine, SamplingOptions(max_new_tokens=9, stop_token_ids=(13,), min_tokens=3))
    assert engine.llm.requests[0].sampling_params.min_tokens == 3
    assert tokens_of(deltas) == [10, 13, 11] and deltas[-1].finish_reason == "stop"
    assert to_sampling_params(SamplingOptions(max_new_tokens=3), EOS, 0).min_tokens is None


def test_logprobs_need_an_engine_that_gathers_generation_logits(fake_trtllm, tmp_path):
    engine = load(tmp_path)
    with pytest.raises(EngineRequestError, match="gather_generation_logits"):
        run(engine, SamplingOptions(max_new_tokens=3, logprobs=2))
    assert engine.llm.requests == [] and engine.is_healthy()
    assert "gather_generation_logits" not in vars(engine.llm.args)


def load_with_logits(tmp_path: Path) -> TrtLlmEngine:
    engine_dir = make_engine_dir(tmp_path)
    config = json.loads((engine_dir / "config.json").read_text())
    config["build_config"]["gather_generation_logits"] = True
    (engine_dir / "config.json").write_text(json.dumps(config))
    return TrtLlmEngine.load(engine_dir, Settings(), eos_token_id=EOS, gpu=H100)


@pytest.mark.parametrize("k", [0, 1, 3])
def test_logprobs_stream_with_their_tokens(fake_trtllm, tmp_path, k):
    engine = load_with_logits(tmp_path)
    assert engine.llm.args.gather_generation_logits is True
    engine.llm.tokens_per_step = 2
    engine.llm.script = [10, 11, 12, 13, EOS]
    deltas = run(engine, SamplingOptions(max_new_tokens=9, logprobs=k))
    sp = engine.llm.requests[0].sampling_params
    # logprobs=0 would mean "off" upstream: top-1 is asked for, the chosen token only kept.
    assert sp.logprobs == max(k, 1) and sp._generation_logits_auto_enabled
    assert tokens_of(deltas) == [10, 11, 12, 13]
    for delta in deltas:
        assert [lp.token_id for lp in delta.logprobs] == delta.token_ids
        for lp in delta.logprobs:
            assert lp.logprob == -0.25 and len(lp.top) == k
            assert all(a[1] >= b[1] for a, b in zip(lp.top, lp.top[1:], strict=False))
            if k:
                assert lp.top[0] == (lp.token_id, -0.25)


def test_logprobs_of_a_trimmed_stop_token_are_dropped(fake_trtllm, tmp_path):
    engine = load_with_logits(tmp_path)
    engine.llm.script = [10, EOS]
    engine.llm.include_end_id_in_output = True  # the runtime returns the end token too
    deltas = run(engine, SamplingOptions(max_new_tokens=9, logprobs=1))
    assert [d.token_ids for d in deltas] == [[10], []]
    assert [len(d.logprobs) for d in deltas] == [1, 0]


def test_no_logprobs_when_not_asked(fake_trtllm, tmp_path):
    deltas = run(load_with_logits(tmp_path), SamplingOptions(max_new_tokens=3))
    assert all(d.logprobs is None for d in deltas)


def test_guided_decoding_maps_to_guided_decoding_params(fake_trtllm, tmp_path):
    schema = '{"type": "object", "properties": {"a": {"type": "integer"}}}'
    engine = load(tmp_path)
    run(engine, SamplingOptions(max_new_tokens=3, guided=GuidedDecoding("json_object")))
    run(engine, SamplingOptions(3, guided=GuidedDecoding("json_schema", schema)), rid="r2")
    first, second = (r.sampling_params.guided_decoding for r in engine.llm.requests)
    assert first == fake_trtllm.sampling_params.GuidedDecodingParams(json_object=True)
    assert second == fake_trtllm.sampling_params.GuidedDecodingParams(json=schema)
    assert to_sampling_params(SamplingOptions(3), EOS, 0).guided_decoding is None


@pytest.mark.parametrize("policy", ["guaranteed_no_evict", "max_utilization", "static_batch"])
def test_capacity_scheduler_policy_setting(fake_trtllm, tmp_path, policy):
    engine = load(tmp_path, Settings(trtllm_capacity_scheduler_policy=policy))
    assert engine.llm.args.scheduler_config.capacity_scheduler_policy == policy.upper()
    assert engine.info.details["capacity_scheduler_policy"] == policy


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


# -- KV-cache usage ------------------------------------------------------------------------


async def stats_polled(engine) -> None:
    """Wait for the background stats poll the last kv_cache_usage() call started."""
    while engine._stats_task is not None:
        await asyncio.sleep(0)


@pytest.mark.parametrize("as_json", [False, True])
def test_kv_cache_usage_reads_the_iteration_stats(fake_trtllm, tmp_path, monkeypatch, as_json):
    monkeypatch.setattr(trtllm, "STATS_INTERVAL_S", 0.0)
    engine = load(tmp_path)
    engine.llm.stats_as_json = as_json
    engine.llm.tokens_per_block, engine.llm.max_num_blocks = 32, 64
    seen = []

    async def main():
        assert engine.kv_cache_usage() == 0.0  # nothing running
        async for delta in engine.generate("r1", [7] * 40, SamplingOptions(max_new_tokens=30)):
            if len(tokens_of([delta])) and delta.token_ids[0] == engine.llm.script[2]:
                engine.kv_cache_usage()  # starts a poll
                await stats_polled(engine)
                seen.append(engine.kv_cache_usage())
        seen.append(engine.kv_cache_usage())

    asyncio.run(main())
    assert seen[0] == 2 / 64  # ceil((40 prompt + 3 generated) / 32) blocks of 64
    assert seen[-1] == 0.0  # idle again


def test_kv_cache_usage_polls_at_most_once_per_interval(fake_trtllm, tmp_path, monkeypatch):
    monkeypatch.setattr(trtllm, "STATS_INTERVAL_S", 1e9)
    engine = load(tmp_path)

    async def main():
        stream = engine.generate("r1", [1, 2], SamplingOptions(max_new_tokens=50))
        for _ in range(3):
            await stream.__anext__()
            for _ in range(100):
                engine.kv_cache_usage()
            await asyncio.sleep(0)
        await stream.aclose()

    asyncio.run(main())
    assert engine.llm.stats_calls == 1


@pytest.mark.parametrize(
    ("stat", "expected"),
    [
        ({"kvCacheStats": {"usedNumBlocks": 3, "maxNumBlocks": 12}}, 0.25),
        ('{"kvCacheStats": {"usedNumBlocks": 12, "maxNumBlocks": 12}}', 1.0),
        ({"kvCacheStats": {"usedNumBlocks": 1, "maxNumBlocks": 0}}, None),
        ({"iter": 3}, None),
        ([], None),
    ],
)
def test_kv_usage_from_stat(stat, expected):
    assert trtllm.kv_usage_from_stat(stat) == expected


# -- the PyTorch-backend engine kind -----------------------------------------------------


def make_checkpoint_dir(root: Path, max_positions: int = 4096) -> Path:
    ckpt = root / "checkpoint"
    ckpt.mkdir(parents=True)
    config = {
        "architectures": ["MistralForCausalLM"],
        "model_type": "mistral",
        "max_position_embeddings": max_positions,
        "vocab_size": 32000,
    }
    (ckpt / "config.json").write_text(json.dumps(config))
    return ckpt


def load_pytorch_kind(root: Path, settings: Settings | None = None) -> TrtLlmPytorchEngine:
    return TrtLlmPytorchEngine.load(
        make_checkpoint_dir(root), settings or Settings(), eos_token_id=EOS
    )


def test_pytorch_kind_starts_the_pytorch_backend(fake_trtllm, tmp_path):
    settings = Settings(max_seq_len=2048, max_batch_size=16, max_num_tokens=4096)
    engine = load_pytorch_kind(tmp_path, settings)
    llm = engine.llm
    assert type(llm) is fake_trtllm.LLM and not llm._on_trt_backend
    args = llm.args
    assert args.model == args.tokenizer == str(tmp_path / "checkpoint")
    assert (args.max_seq_len, args.max_batch_size, args.max_num_tokens) == (2048, 16, 4096)
    assert args.enable_chunked_prefill and args.enable_iter_perf_stats
    assert args.guided_decoding_backend == "xgrammar"
    assert args.sampler_type == "TRTLLMSampler"  # applies the penalties
    assert engine.limits == EngineLimits(max_input_len=2047, max_seq_len=2048, max_batch_size=16)
    assert isinstance(engine, Engine) and engine.info.name == "trtllm_pytorch"


def test_pytorch_kind_limits_default_to_the_checkpoint(fake_trtllm, tmp_path):
    engine = load_pytorch_kind(tmp_path)
    assert engine.limits.max_seq_len == 4096 and engine.limits.max_input_len == 4095


def test_pytorch_kind_shares_streaming_abort_logprobs_and_stats(fake_trtllm, tmp_path, monkeypatch):
    monkeypatch.setattr(trtllm, "STATS_INTERVAL_S", 0.0)
    engine = load_pytorch_kind(tmp_path)
    deltas = run(engine, SamplingOptions(max_new_tokens=4, logprobs=2, presence_penalty=0.4))
    assert tokens_of(deltas) == engine.llm.script[:4] and deltas[-1].finish_reason == "length"
    assert all(len(d.logprobs) == len(d.token_ids) for d in deltas)
    sp = engine.llm.requests[0].sampling_params
    assert sp.prompt_ignore_length == 3 and not sp._generation_logits_auto_enabled

    async def main():
        stream = engine.generate("r2", [1] * 40, SamplingOptions(max_new_tokens=50))
        await stream.__anext__()
        engine.kv_cache_usage()
        await stats_polled(engine)
        usage = engine.kv_cache_usage()
        engine.abort("r2")
        rest = [d async for d in stream]
        return usage, rest

    usage, rest = asyncio.run(main())
    assert usage == 2 / 64 and rest[-1].finish_reason == "abort"


def test_pytorch_kind_refuses_an_engine_dir(fake_trtllm, tmp_path):
    engine_dir = make_engine_dir(tmp_path)
    with pytest.raises(EngineCheckError, match="not a Hugging Face checkpoint"):
        TrtLlmPytorchEngine.load(engine_dir, Settings(), eos_token_id=EOS)


def test_pytorch_backend_refuses_tensorrt_only_arguments(fake_trtllm, tmp_path):
    with pytest.raises(ValueError, match="specific to TensorRT backend"):
        fake_trtllm.LLM(model=str(make_checkpoint_dir(tmp_path)), build_config=object())


def test_pytorch_kind_without_tensorrt_llm_says_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorrt_llm", None)
    with pytest.raises(EngineCheckError, match="engine=pytorch"):
        load_pytorch_kind(tmp_path)


def test_the_engine_setting_starts_the_pytorch_kind_on_the_dev_model(fake_trtllm, dev_model):
    from mistral_serving.artifacts import ArtifactError, open_artifact
    from mistral_serving.engines.factory import engine_name_for, start_engine
    from mistral_serving.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(dev_model)
    settings = Settings(artifact=str(dev_model), engine="trtllm_pytorch")
    engine = start_engine(open_artifact(dev_model, settings), settings, tokenizer)
    assert type(engine) is TrtLlmPytorchEngine and engine.eos_token_id == tokenizer.eos_id
    assert engine.llm.args.model == str(dev_model)
    assert engine_name_for("hf_checkpoint", "auto") == "pytorch"  # auto keeps today's choice
    with pytest.raises(ArtifactError):
        engine_name_for("trtllm_engine", "trtllm_pytorch")


def test_the_servers_shutdown_stops_the_executor(fake_trtllm, tmp_path, dev_model):
    """The drain's end: leaving the server app's lifespan shuts the engine down, which
    shuts TensorRT-LLM's executor (and its MPI workers) down."""
    from fastapi import FastAPI
    from prometheus_client import CollectorRegistry
    from starlette.testclient import TestClient

    from mistral_serving import frontend as frontend_module
    from mistral_serving.frontend import Frontend
    from mistral_serving.metrics import Metrics
    from mistral_serving.server import extend
    from mistral_serving.service import GenerationService
    from mistral_serving.tokenizer import load_tokenizer

    engine = load(tmp_path)
    executor = engine.llm._executor
    settings = Settings()
    metrics = Metrics(CollectorRegistry())
    front = Frontend(settings, metrics)
    front.attach(GenerationService(settings, load_tokenizer(dev_model), engine, metrics=metrics))
    previous = frontend_module.current()
    frontend_module.register(front)
    try:
        with TestClient(extend(FastAPI(), settings)) as client:
            assert client.get("/health").status_code == 200
            assert executor.shutdown_calls == 0
        assert executor.shutdown_calls == 1 and executor.is_shutdown()
    finally:
        frontend_module.register(previous)
