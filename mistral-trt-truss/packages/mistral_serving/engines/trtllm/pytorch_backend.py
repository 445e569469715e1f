"""TensorRT-LLM's PyTorch backend as an engine kind (`engine: trtllm_pytorch`).

`tensorrt_llm.LLM(model=<Hugging Face checkpoint dir>)` (`llmapi/llm.py::LLM`, a
`_TorchLLM`) is TensorRT-LLM's default runtime since 1.0: no engine build, and it keeps
working on releases that no longer build TensorRT engines. Streaming, abort, sampling,
per-request errors and the KV gauge are `LlmApiEngine`'s, shared with the engine kind.

What differs from the TensorRT-engine backend (read in `llmapi/llm.py` and
`llmapi/llm_args.py`, `TorchLlmArgs`):
- the limits are arguments, not build options: `max_seq_len`, `max_batch_size`,
  `max_num_tokens` (we pass the settings; max_seq_len defaults to the checkpoint's
  `max_position_embeddings`);
- `_check_arguments` checks only the prompt against max_num_tokens, and only without
  chunked prefill, which we turn on: `EngineLimits.fit` is the guard, as for engines;
- iteration stats (the KV gauge) exist only with `enable_iter_perf_stats=True`;
- logprobs need no `gather_generation_logits`;
- the sampler (`sampler_type`, setting `trtllm_sampler`) decides what a request may ask:
  `TRTLLMSampler` (the C++ sampler) applies repetition/presence/frequency penalties,
  `prompt_ignore_length` included, but its `update_requests`
  (`_torch/pyexecutor/sampler.py`) returns only the sampled token's logprob, with rank 1,
  whatever k was asked: top_logprobs above 0 are refused. `TorchSampler` (upstream's
  "auto") returns the top k but ignores the penalties in 1.2: requests with penalties are
  refused. TRTLLMSampler is gone in 1.3.0rc26.
- `cuda_graph_config` (`llm_args.py::CudaGraphConfig`): CUDA graphs are on by default for
  batch sizes up to 128 without padding, so a decode batch of a size with no graph (any
  size above 31 but 32, 64, 128) runs eagerly. We capture up to max_batch_size with
  `enable_padding` (setting `trtllm_cuda_graph_padding`): a batch runs in the next larger
  graph (sizes 1, 2, 4, 8, 16, ..., 128, then powers of two, then max_batch_size).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mistral_serving.artifacts.artifact import read_config
from mistral_serving.engines.base import EngineError, EngineInfo, EngineLimits
from mistral_serving.engines.trtllm.checks import EngineCheckError, release_line
from mistral_serving.engines.trtllm.engine import (
    LlmApiEngine,
    PromptLogitsBudget,
    kv_cache_config,
    prompt_logits_limit,
    scheduler_config,
)
from mistral_serving.settings import TrtllmSettings

# Setting trtllm_sampler -> TorchLlmArgs.sampler_type.
SAMPLER_TYPES: dict[str, str] = {"trtllm": "TRTLLMSampler", "torch": "TorchSampler"}
TRTLLM_SAMPLER_TOP_LOGPROBS = (
    "top_logprobs above 0 are not available here: TensorRT-LLM's TRTLLMSampler returns only "
    "the sampled token's logprob; serve with trtllm_sampler=torch for top-k logprobs"
)
# TRTLLMSampler (trtllm_sampler=trtllm) is gone from TensorRT-LLM 1.3.0rc26 on.
SAMPLER_GONE_FROM = (1, 3, 26)


def trtllm_sampler_exists(version: str) -> bool:
    """Whether this TensorRT-LLM still has TRTLLMSampler ("1.2.1", "1.3.0rc25": yes)."""
    line = release_line(version)
    if line is None or line < (1, 3):
        return True
    if line > (1, 3):
        return False
    rc = version.partition("rc")[2]
    digits = "".join(c for c in rc.split(".")[0] if c.isdigit())
    return bool(rc) and bool(digits) and (1, 3, int(digits)) < SAMPLER_GONE_FROM


TORCH_SAMPLER_PENALTIES = (
    "repetition, presence and frequency penalties are not applied by TensorRT-LLM's "
    "TorchSampler (1.2); serve with trtllm_sampler=trtllm for penalties"
)


def checkpoint_limits(config: dict[str, Any], settings: TrtllmSettings) -> EngineLimits:
    """Limits from the checkpoint's config.json, lowered by the settings."""
    positions = config.get("max_position_embeddings")
    if not isinstance(positions, int) or positions < 2:
        raise EngineCheckError(
            "config.json has no usable max_position_embeddings; set max_seq_len explicitly"
        )
    max_seq_len = min(positions, settings.max_seq_len or positions)
    max_input_len = min(settings.max_input_len or max_seq_len - 1, max_seq_len - 1)
    return EngineLimits(
        max_input_len=max_input_len,
        max_seq_len=max_seq_len,
        max_batch_size=settings.max_batch_size,
    )


class TrtLlmPytorchEngine(LlmApiEngine):
    """A Hugging Face checkpoint served by TensorRT-LLM's PyTorch backend."""

    @classmethod
    def load(
        cls,
        checkpoint_dir: Path,
        settings: TrtllmSettings,
        *,
        eos_token_id: int,
        pad_token_id: int | None = None,
        config: dict[str, Any] | None = None,
    ) -> TrtLlmPytorchEngine:
        tensorrt_llm, LLM, RequestError, CudaGraphConfig = _import_backend()
        if settings.trtllm_sampler == "trtllm" and not trtllm_sampler_exists(
            tensorrt_llm.__version__
        ):
            raise EngineCheckError(
                f"trtllm_sampler=trtllm: TensorRT-LLM {tensorrt_llm.__version__} has no "
                "TRTLLMSampler (gone from 1.3.0rc26); set trtllm_sampler=torch, or serve from "
                "the 1.2.1 release image"
            )
        checkpoint_dir = Path(checkpoint_dir)
        if config is None:  # a bare directory; a load hands over the Artifact's
            config = read_config(checkpoint_dir)
        if "pretrained_config" in config:
            raise EngineCheckError(
                f"{checkpoint_dir} is not a Hugging Face checkpoint (a TensorRT engine? "
                "serve it with engine=tensorrt_llm or auto)"
            )
        limits = checkpoint_limits(config, settings)
        llm = _start_llm(LLM, CudaGraphConfig, checkpoint_dir, settings, limits)
        info = EngineInfo(
            name="trtllm_pytorch",
            details={
                "checkpoint_dir": str(checkpoint_dir),
                "tensorrt_llm_version": tensorrt_llm.__version__,
                "architecture": (config.get("architectures") or [None])[0],
                "kv_cache_free_gpu_memory_fraction": settings.kv_cache_free_gpu_memory_fraction,
                "capacity_scheduler_policy": settings.trtllm_capacity_scheduler_policy,
                "max_num_tokens": settings.max_num_tokens,
                "sampler": settings.trtllm_sampler,
                "cuda_graph_padding": settings.trtllm_cuda_graph_padding,
            },
        )
        return cls(
            llm,
            limits=limits,
            eos_token_id=eos_token_id,
            pad_token_id=pad_token_id,
            info=info,
            request_error=RequestError,
            top_logprobs_unavailable=TRTLLM_SAMPLER_TOP_LOGPROBS
            if settings.trtllm_sampler == "trtllm"
            else None,
            penalties_unavailable=TORCH_SAMPLER_PENALTIES
            if settings.trtllm_sampler == "torch"
            else None,
            prompt_logits=PromptLogitsBudget(
                prompt_logits_limit(settings), int(config.get("vocab_size") or 0)
            ),
        )


def _import_backend() -> tuple[Any, Any, type[BaseException], Any]:
    """tensorrt_llm, its `LLM`, `RequestError` and `CudaGraphConfig`, imported here so the
    package imports (and its tests run) without tensorrt_llm."""
    try:
        import tensorrt_llm
        from tensorrt_llm import LLM
        from tensorrt_llm.llmapi import RequestError
        from tensorrt_llm.llmapi.llm_args import CudaGraphConfig
    except ImportError as exc:
        raise EngineCheckError(
            f"engine=trtllm_pytorch but tensorrt_llm cannot be imported ({exc}); serve "
            "from the TensorRT-LLM release image, or set engine=pytorch"
        ) from exc
    return tensorrt_llm, LLM, RequestError, CudaGraphConfig


def _start_llm(
    LLM: Any,
    CudaGraphConfig: Any,
    checkpoint_dir: Path,
    settings: TrtllmSettings,
    limits: EngineLimits,
) -> Any:
    """TensorRT-LLM's PyTorch backend over the checkpoint, with the settings' limits,
    scheduler, sampler and CUDA graphs."""
    try:
        return LLM(
            model=str(checkpoint_dir),
            tokenizer=str(checkpoint_dir),  # xgrammar builds its tables from it
            kv_cache_config=kv_cache_config(settings),
            scheduler_config=scheduler_config(settings),
            max_seq_len=limits.max_seq_len,
            max_batch_size=limits.max_batch_size,
            max_num_tokens=settings.max_num_tokens,
            enable_chunked_prefill=True,
            guided_decoding_backend="xgrammar",
            enable_iter_perf_stats=True,
            sampler_type=SAMPLER_TYPES[settings.trtllm_sampler],
            cuda_graph_config=CudaGraphConfig(
                enable_padding=settings.trtllm_cuda_graph_padding,
                max_batch_size=limits.max_batch_size,
            ),
        )
    except Exception as exc:
        raise EngineError(
            f"TensorRT-LLM (PyTorch backend) could not start {checkpoint_dir}: {exc}"
        ) from exc
