"""Start the engine the artifact calls for (or the one settings force): the one place
that chooses an engine, the PyTorch engine's KV-cache kind included."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from mistral_serving.artifacts import Artifact, ArtifactError, ArtifactKind
from mistral_serving.engines.base import Engine
from mistral_serving.settings import Settings
from mistral_serving.tokenizer import Tokenizer

if TYPE_CHECKING:
    from mistral_serving.engines.pytorch import TorchEngine


def engine_name_for(kind: ArtifactKind, setting: str) -> str:
    wanted = {"trtllm_engine": "tensorrt_llm", "hf_checkpoint": "pytorch"}[kind]
    if kind == "hf_checkpoint" and setting == "trtllm_pytorch":  # TensorRT-LLM's PyTorch backend
        return setting
    if setting not in ("auto", wanted):
        raise ArtifactError(
            f"engine={setting} but the artifact is a "
            f"{'TensorRT-LLM engine' if kind == 'trtllm_engine' else 'Hugging Face checkpoint'}; "
            + (
                "build an engine from it with `python build.py engine`"
                if kind == "hf_checkpoint"
                else "set engine=auto or serve a checkpoint"
            )
        )
    return wanted


def start_engine(artifact: Artifact, settings: Settings, tokenizer: Tokenizer) -> Engine:
    """The engine for this artifact (read once by `artifacts.load_artifact`)."""
    artifact_dir, kind = artifact.path, artifact.kind
    # Engines import lazily: each pulls in its own heavy stack (torch, tensorrt_llm).
    if settings.engine == "replay":  # benchmarks only: see engines/replay.py
        from mistral_serving.engines.replay import ReplayEngine

        return ReplayEngine.for_tokenizer(
            tokenizer,
            settings.max_batch_size,
            settings.max_seq_len,
            settings.max_input_len,
            settings.replay_step_ms,
        )
    if engine_name_for(kind, settings.engine) == "tensorrt_llm":
        from mistral_serving.engines.trtllm import TrtLlmEngine

        manifest = artifact.manifest
        return TrtLlmEngine.load(
            artifact_dir,
            settings,
            eos_token_id=tokenizer.eos_id,
            pad_token_id=tokenizer.eos_id,
            tokenizer_vocab_size=tokenizer.vocab_size,
            config=artifact.config,
            built_capability=manifest.gpu.compute_capability
            if manifest is not None and manifest.gpu is not None
            else None,
        )
    if engine_name_for(kind, settings.engine) == "trtllm_pytorch":
        from mistral_serving.engines.trtllm_pytorch import TrtLlmPytorchEngine

        return TrtLlmPytorchEngine.load(
            artifact_dir, settings, eos_token_id=tokenizer.eos_id, pad_token_id=tokenizer.eos_id
        )
    from mistral_serving.engines.process import wants_own_process

    if wants_own_process(settings):  # engine_process: the step loop off the server's GIL
        from mistral_serving.engines.process import ProcessEngine

        return ProcessEngine.start(artifact_dir, settings, tokenizer.eos_id)
    return start_guided_torch_engine(artifact_dir, settings, tokenizer)


def start_guided_torch_engine(
    model_dir: Path, settings: Settings, tokenizer: Tokenizer
) -> TorchEngine:
    """The PyTorch engine in this process, with structured output (response_format,
    xgrammar). The engine process (`worker.py`) starts its engine with this too."""
    from mistral_serving.guided import GuidedDecoder

    engine = start_torch_engine(model_dir, settings, tokenizer.eos_id)
    engine.guided = GuidedDecoder(tokenizer, engine.vocab_size)
    return engine


def start_torch_engine(model_dir: Path, settings: Settings, eos_token_id: int) -> TorchEngine:
    """The PyTorch engine for a checkpoint: `pytorch_kv_cache` picks static or dynamic."""
    if settings.pytorch_kv_cache == "static":
        from mistral_serving.engines.pytorch_static import StaticTorchEngine

        return StaticTorchEngine.from_pretrained(model_dir, settings, eos_token_id)
    from mistral_serving.engines.pytorch import TorchEngine

    return TorchEngine.from_pretrained(model_dir, settings, eos_token_id)
