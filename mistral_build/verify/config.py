"""The fixed settings of a verify-gpu run: the tiny model's shape, the engine limits, the
server settings every kind gets."""

from __future__ import annotations

import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from mistral_build.deploy_settings import DeploySettings
from mistral_build.paths import CACHE_DIR

Kind = Literal["tensorrt_llm", "trtllm_pytorch", "pytorch"]
KIND_CHOICES = ("tensorrt_llm", "trtllm_pytorch", "all", "pytorch")
GPU_KINDS: tuple[Kind, ...] = ("tensorrt_llm", "trtllm_pytorch")
DEFAULT_OUT = CACHE_DIR / "verify-gpu"

# The tiny checkpoint: the dev model's vocabulary and tokenizer (Mistral's own), with
# shapes TensorRT-LLM's attention kernels take (head_dim 64; the dev model's 16 is not
# among them) and Mistral-7B's context, so long streams last long enough on a fast GPU.
TINY_SHAPE: dict[str, object] = {
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 32768,
}
TINY_DTYPE = "float16"
# Engine limits: what the checks need, small enough to build in a couple of minutes.
ENGINE_LIMITS = {
    "max_batch_size": 16,
    "max_input_len": 8192,
    "max_seq_len": 32768,
    # Below max_input_len: the long-prompt check sends a prompt longer than this, which
    # only chunked prefill serves.
    "max_num_tokens": 2048,
}

# Server settings every kind gets (model_metadata keys): small admission limits so the
# 503 check fills them with a handful of streams; a grace period the drain check can wait.
MAX_INFLIGHT = 8
MAX_WAITING = 2
DRAIN_GRACE_S = 20.0
COMMON_SETTINGS = {
    "max_inflight": str(MAX_INFLIGHT),
    "max_waiting": str(MAX_WAITING),
    "drain_grace_seconds": str(DRAIN_GRACE_S),
    "metrics_names": "mtt",
}
# The tiny model needs little KV cache; the default 0.9 of free GPU memory takes long to
# allocate on a large GPU for nothing.
# Block reuse off: a request whose prefix is cached runs other kernels than one that is
# not, which flips greedy near-ties between otherwise equal requests.
GPU_SETTINGS = {"kv_cache_free_gpu_memory_fraction": "0.2", "trtllm_kv_block_reuse": "false"}
# Prompt tokens per engine step, per kind (the server setting max_num_tokens; the
# tensorrt_llm kind's comes from the engine it serves): the long-prompt check goes past it.
MAX_NUM_TOKENS = {"tensorrt_llm": 2048, "trtllm_pytorch": 2048, "pytorch": 64}
# After the drain, the engine's shutdown (llm.shutdown()) and the process exit must take
# no longer than the Deployment leaves them: its terminationGracePeriodSeconds is preStop +
# drain + this margin (deploy_settings), so the same number is the budget here.
SHUTDOWN_BUDGET_S = float(DeploySettings.model_fields["shutdown_margin_seconds"].default)
SHUTDOWN_BUDGET_NAME = "shutdown_margin_seconds"

PREDICT = "/v1/models/model:predict"
# uvicorn re-raises the SIGTERM it handled after a graceful shutdown: -15 from Popen.
EXITED_ON_SIGTERM = (0, -signal.SIGTERM)
GREEDY = {"top_k": 1, "temperature": 1.0}


@dataclass
class VerifyOptions:
    kinds: list[Kind]
    out: Path = DEFAULT_OUT
    engine_dir: Path | None = None
    gpu: str | None = None
    examples_dir: str = "/app/tensorrt_llm/examples"
    overrides: dict[str, str] = field(default_factory=dict)
    ready_timeout: float = 900.0
    bench_prompts: int = 32
    long_tokens: int = 4000
    drain_tokens: int = 512
    # The image's own server folders (/app, /packages: the verify image names them), served
    # from as they are; None: a build context rendered by truss (a checkout).
    app_dir: Path | None = None
    packages_dir: Path | None = None
