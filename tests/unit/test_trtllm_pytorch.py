"""The PyTorch-backend kind (trtllm_pytorch). The TensorRT-LLM adapter against the `tensorrt_llm` test double (tests/doubles/fake_tensorrt_llm,
see its README; the fixture is tests/unit/conftest.py::fake_trtllm). Nothing of TensorRT-LLM runs here."""

from __future__ import annotations

import asyncio
import sys

import pytest

from mistral_serving.engines.base import (
    Engine,
    EngineLimits,
    SamplingOptions,
)
from mistral_serving.engines.trtllm.checks import EngineCheckError
from mistral_serving.engines.trtllm.pytorch_backend import TrtLlmPytorchEngine
from mistral_serving.settings import Settings
from tests.doubles.trtllm_helpers import (
    EOS,
    load,
    load_pytorch_kind,
    make_checkpoint_dir,
    make_engine_dir,
    run,
    settle,
    tokens_of,
)

# -- the PyTorch-backend engine kind -----------------------------------------------------


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
    assert args.sampler_type == "TRTLLMSampler"  # applies the penalties (trtllm_sampler)
    assert engine.limits == EngineLimits(max_input_len=2047, max_seq_len=2048, max_batch_size=16)
    assert isinstance(engine, Engine) and engine.info.name == "trtllm_pytorch"


def test_pytorch_kind_limits_default_to_the_checkpoint(fake_trtllm, tmp_path):
    engine = load_pytorch_kind(tmp_path)
    assert engine.limits.max_seq_len == 4096 and engine.limits.max_input_len == 4095


def test_pytorch_kind_shares_streaming_abort_logprobs_and_stats(fake_trtllm, tmp_path):
    engine = load_pytorch_kind(tmp_path)
    deltas = run(engine, SamplingOptions(max_new_tokens=4, logprobs=0, presence_penalty=0.4))
    assert tokens_of(deltas) == engine.llm.script[:4] and deltas[-1].finish_reason == "length"
    assert all(len(d.logprobs) == len(d.token_ids) for d in deltas)
    sp = engine.llm.requests[0].sampling_params
    assert sp.prompt_ignore_length == 3 and not sp._generation_logits_auto_enabled

    async def main():
        stream = engine.generate("r2", [1] * 40, SamplingOptions(max_new_tokens=50))
        await stream.__anext__()
        await settle()
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
    from mistral_serving.artifacts.artifact import ArtifactError, open_artifact
    from mistral_serving.engines.factory import engine_name_for, start_engine
    from mistral_serving.text.tokenizer import load_tokenizer

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

    from mistral_serving.generation.service import GenerationService
    from mistral_serving.http.frontend import Frontend
    from mistral_serving.http.server import extend
    from mistral_serving.ops.metrics import Metrics
    from mistral_serving.text.tokenizer import load_tokenizer

    engine = load(tmp_path)
    executor = engine.llm._executor
    settings = Settings()
    metrics = Metrics(CollectorRegistry())
    front = Frontend(settings, metrics)
    front.attach(GenerationService(settings, load_tokenizer(dev_model), engine, metrics=metrics))
    with TestClient(extend(FastAPI(), front)) as client:
        assert client.get("/health").status_code == 200
        assert executor.shutdown_calls == 0
    assert executor.shutdown_calls == 1 and executor.is_shutdown()


def test_pytorch_kind_pads_batches_to_cuda_graphs(fake_trtllm, tmp_path):
    engine = load_pytorch_kind(tmp_path / "a", Settings(max_batch_size=256))
    graphs = engine.llm.args.cuda_graph_config
    assert graphs.enable_padding and graphs.max_batch_size == 256
    assert graphs.batch_sizes[:4] == [1, 2, 4, 8] and graphs.batch_sizes[-1] == 256
    assert engine.info.details["cuda_graph_padding"] is True
    exact = load_pytorch_kind(tmp_path / "b", Settings(trtllm_cuda_graph_padding=False))
    assert not exact.llm.args.cuda_graph_config.enable_padding
    assert exact.llm.args.cuda_graph_config.max_batch_size == 64
