"""Start the engine the artifact calls for (or the one settings force): the one place
that chooses an engine, the PyTorch engine's KV-cache kind included."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
    model_validator,
)

from mistral_serving.artifacts.artifact import Artifact, ArtifactError, ArtifactKind, read_config
from mistral_serving.artifacts.manifest import shown
from mistral_serving.engines import fallback
from mistral_serving.engines.base import Engine
from mistral_serving.settings import Settings, TorchEngineSettings
from mistral_serving.text.tokenizer import Tokenizer

if TYPE_CHECKING:
    from mistral_serving.engines.pytorch.dynamic import TorchEngine

log = logging.getLogger(__name__)
NO_CUDA = "no CUDA GPU"


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


class ModelConfig(BaseModel):
    """The config.json fields of a Hugging Face checkpoint the engines use (sequence
    limits, tensor shapes), each within what a real decoder has; the others are
    transformers' business. Absent is allowed where transformers has a default (the
    static path's own checks then apply); present, a field must be sane: an absurd value
    (`max_position_embeddings` 1e12, `num_hidden_layers` -1) would be served."""

    model_config = ConfigDict(extra="allow")

    max_position_embeddings: StrictInt | None = Field(None, ge=2, le=1 << 24)
    num_hidden_layers: StrictInt | None = Field(None, ge=1, le=1024)
    hidden_size: StrictInt | None = Field(None, ge=1, le=1 << 17)
    num_attention_heads: StrictInt | None = Field(None, ge=1, le=1024)
    num_key_value_heads: StrictInt | None = Field(None, ge=1, le=1024)
    head_dim: StrictInt | None = Field(None, ge=1, le=4096)
    intermediate_size: StrictInt | None = Field(None, ge=1, le=1 << 20)
    vocab_size: StrictInt | None = Field(None, ge=1, le=1 << 22)
    rms_norm_eps: StrictFloat | StrictInt | None = Field(None, gt=0, lt=1)
    rope_theta: StrictFloat | StrictInt | None = Field(None, gt=0, le=1e12)
    sliding_window: StrictInt | None = Field(None, ge=1, le=1 << 24)
    tie_word_embeddings: StrictBool | None = None
    architectures: list[StrictStr] | None = Field(None, max_length=16)

    @model_validator(mode="after")
    def _shapes_agree(self) -> ModelConfig:
        heads, kv = self.num_attention_heads, self.num_key_value_heads
        if heads is not None and kv is not None and heads % kv:
            raise ValueError(
                f"num_attention_heads {heads} is not a multiple of num_key_value_heads {kv}"
            )
        hidden = self.hidden_size
        if self.head_dim is None and heads is not None and hidden is not None and hidden % heads:
            raise ValueError(
                f"hidden_size {hidden} is not a multiple of num_attention_heads {heads} "
                "(and no head_dim is given)"
            )
        return self


def check_model_config(config: object, where: str) -> ModelConfig:
    """`config` (a checkpoint's parsed config.json) validated, or ArtifactError with one
    line naming the field: refused at load, before any engine sizes anything from it."""
    try:
        return ModelConfig.model_validate(config)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(shown(p, 60) for p in first["loc"]) or "config"
        got = f" (got {shown(first['input'], 60)})" if first["loc"] else ""
        message = shown(first["msg"].removeprefix("Value error, "), 200)
        raise ArtifactError(f"{where}: {field}: {message}{got}") from None


def start_engine(artifact: Artifact, settings: Settings, tokenizer: Tokenizer) -> Engine:
    """The engine for this artifact (read once by `artifacts.load_artifact`)."""
    artifact_dir, kind = artifact.path, artifact.kind
    replay = settings.engine == "replay"  # benchmarks only (the GPU fallback package)
    if kind == "hf_checkpoint" and not replay:
        check_model_config(artifact.config, str(artifact_dir / "config.json"))
    # Engines import lazily: each pulls in its own heavy stack (torch, tensorrt_llm).
    if not replay:
        keep_compiled_kernels(settings.cache_path)
        name = engine_name_for(kind, settings.engine)
        if name != "pytorch" and settings.frontend_processes > 1:
            raise ArtifactError(
                f"frontend_processes={settings.frontend_processes} needs an engine that runs "
                f"in the engine process (the PyTorch engine, engine_process: on); {name} "
                "serves from one front-end process: set frontend_processes=1"
            )
        if name == "tensorrt_llm":
            from mistral_serving.engines.trtllm.engine import TrtLlmEngine

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
        if name == "trtllm_pytorch":
            from mistral_serving.engines.trtllm.pytorch_backend import TrtLlmPytorchEngine

            return TrtLlmPytorchEngine.load(
                artifact_dir,
                settings,
                eos_token_id=tokenizer.eos_id,
                pad_token_id=tokenizer.eos_id,
                config=artifact.config,
            )
    # The engine process and the replay engine live in the GPU fallback package.
    if settings.engine_process == "on":
        return fallback.required("engine_process: on").start_engine(artifact, settings, tokenizer)
    if replay:
        return fallback.required("engine: replay").start_engine(artifact, settings, tokenizer)
    return start_guided_torch_engine(artifact_dir, settings, tokenizer, artifact.config)


def compiled_kernels_dir(cache: Path) -> Path:
    """Where Triton keeps its compiled kernels: TRITON_CACHE_DIR when set, else `triton/`
    in the service's cache directory (the engine-cache volume in the pod)."""
    return Path(os.environ.get("TRITON_CACHE_DIR") or cache / "triton")


def keep_compiled_kernels(cache: Path) -> None:
    """Point Triton at `compiled_kernels_dir` before anything compiles (the PyTorch
    engine's fused ops compile at start), so a restarted server reads its kernels instead
    of compiling them again; the engine process inherits the variable."""
    os.environ["TRITON_CACHE_DIR"] = str(compiled_kernels_dir(cache))


def start_guided_torch_engine(
    model_dir: Path,
    settings: TorchEngineSettings,
    tokenizer: Tokenizer,
    config: dict[str, Any] | None = None,
) -> TorchEngine:
    """The PyTorch engine in this process, with structured output (response_format,
    xgrammar). The engine process (`worker.py`) starts its engine with this too."""
    from mistral_serving.engines.pytorch.guided import GuidedDecoder

    engine = start_torch_engine(model_dir, settings, tokenizer.eos_id, config)
    engine.guided = GuidedDecoder(tokenizer, engine.vocab_size, settings.grammar_cache_bytes)
    return engine


def runs_on_cuda(settings: TorchEngineSettings) -> bool:
    """Whether the PyTorch engine will run on a CUDA GPU (`device`, else what torch sees)."""
    from mistral_serving.engines.pytorch.dynamic import pick_device

    return pick_device(settings.device).type == "cuda"


def kv_cache_choice(setting: str, on_cuda: bool, config: dict[str, Any]) -> tuple[str, str | None]:
    """`pytorch_kv_cache` resolved: ("static" | "dynamic", why `auto` did not pick static).
    `auto` is the fast path on a CUDA GPU for the checkpoints it runs, where the GPU
    fallback package is installed: on a CPU its CUDA graphs do not apply and the dynamic
    engine runs any causal LM."""
    if setting != "auto":
        return setting, None
    if not on_cuda:
        return "dynamic", NO_CUDA
    plugin = fallback.installed()
    if plugin is None:
        return "dynamic", fallback.NOT_INSTALLED
    why = plugin.static_path_problem(config)
    return ("dynamic", why) if why else ("static", None)


def start_torch_engine(
    model_dir: Path,
    settings: TorchEngineSettings,
    eos_token_id: int,
    config: dict[str, Any] | None = None,
) -> TorchEngine:
    """The PyTorch engine for a checkpoint: `pytorch_kv_cache` picks static or dynamic.
    `config` is the checkpoint's config.json when the caller has read it (the Artifact)."""
    from mistral_serving.engines.pytorch.dynamic import TorchEngine

    if config is None:
        config = read_config(Path(model_dir))
    check_model_config(config, str(Path(model_dir) / "config.json"))
    kind, why = kv_cache_choice(settings.pytorch_kv_cache, runs_on_cuda(settings), config)
    if why is not None:  # a GPU without the fast path is worth a warning; a CPU is not
        level = logging.INFO if why == NO_CUDA else logging.WARNING
        log.log(level, "pytorch_kv_cache=auto: the dynamic KV cache, because %s", why)
    if kind == "dynamic":
        return TorchEngine.from_pretrained(model_dir, settings, eos_token_id)
    plugin = fallback.required("pytorch_kv_cache: static")
    return plugin.start_static_torch_engine(Path(model_dir), settings, eos_token_id, config)
