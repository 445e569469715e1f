"""Helpers shared by the TensorRT-LLM adapter tests (tests/unit/test_trtllm_*.py): engine and
checkpoint directories the double loads, and small runners. The `fake_trtllm` fixture that
imports the double lives in tests/unit/conftest.py."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from mistral_serving.artifacts.manifest import BuildManifest, GpuRecord, write_manifest
from mistral_serving.engines.base import SamplingOptions, TokenDelta
from mistral_serving.engines.trtllm.checks import GpuInfo
from mistral_serving.engines.trtllm.engine import LlmApiEngine, TrtLlmEngine
from mistral_serving.engines.trtllm.pytorch_backend import TrtLlmPytorchEngine
from mistral_serving.settings import Settings

REPO = Path(__file__).resolve().parents[2]
FAKE_ROOT = REPO / "tests" / "doubles" / "fake_tensorrt_llm"
EOS = 2
H100 = GpuInfo(name="NVIDIA H100 80GB HBM3", capability="9.0", count=1)


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


async def consume(engine: LlmApiEngine, rid: str, prompt: list[int], opts: SamplingOptions):
    return [delta async for delta in engine.generate(rid, prompt, opts)]


def run(engine: LlmApiEngine, opts: SamplingOptions, prompt: list[int] | None = None, rid="r1"):
    return asyncio.run(consume(engine, rid, prompt or [1, 5, 6], opts))


def tokens_of(deltas: list[TokenDelta]) -> list[int]:
    return [t for d in deltas for t in d.token_ids]


def load_with_logits(tmp_path: Path, settings: Settings | None = None) -> TrtLlmEngine:
    engine_dir = make_engine_dir(tmp_path)
    config = json.loads((engine_dir / "config.json").read_text())
    config["build_config"]["gather_generation_logits"] = True
    (engine_dir / "config.json").write_text(json.dumps(config))
    return TrtLlmEngine.load(engine_dir, settings or Settings(), eos_token_id=EOS, gpu=H100)


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


async def settle() -> None:
    """Let background tasks (the adapter's stats reader) run what is ready."""
    for _ in range(10):
        await asyncio.sleep(0)
