"""One settings object for the whole service.

Values come from the Truss `config.yaml` `model_metadata` block; any field can be
overridden by an environment variable `MTT_<FIELD NAME IN UPPER CASE>` (what the
Kubernetes manifests and `make serve` use). The same names appear in `build.py`,
the manifests and the README's settings table.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

ENV_PREFIX = "MTT_"


class SettingsError(ValueError):
    """A setting is missing or invalid; the message is one actionable line."""


class Settings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    # What to serve.
    artifact: str = Field(
        "",
        description="Local directory, or Hugging Face repo id, of a TensorRT-LLM engine "
        "artifact or a Hugging Face checkpoint.",
    )
    artifact_revision: str | None = Field(
        None, description="Pinned revision (commit sha or tag) when `artifact` is a repo id."
    )
    cache_dir: str = Field(
        "~/.cache/mistral-trt-truss", description="Where downloaded artifacts are cached."
    )
    engine: Literal["auto", "tensorrt_llm", "trtllm_pytorch", "pytorch", "replay"] = Field(
        "auto",
        description="`auto` picks from the artifact: engine dir -> tensorrt_llm. "
        "`trtllm_pytorch` serves a Hugging Face checkpoint with TensorRT-LLM's PyTorch backend "
        "(no engine build; needs the TensorRT-LLM image and a GPU). "
        "`replay` is for benchmarks only: it emits pre-made tokens without a model.",
    )
    served_model_name: str = Field(
        "mistral-7b-instruct", description="Model name returned by the OpenAI routes."
    )
    verify_hashes: bool = Field(
        True, description="Check artifact file hashes against its build manifest on load."
    )

    # PyTorch engine.
    device: Literal["auto", "cpu", "cuda"] = "auto"
    torch_dtype: Literal["auto", "float32", "float16", "bfloat16"] = "auto"
    max_batch_size: int = Field(64, ge=1, description="Sequences decoded together per step.")
    max_num_tokens: int = Field(
        8192,
        ge=16,
        description="Prompt tokens prefilled per engine step, padding included (rows x "
        "the longest prompt): bounds step latency and prefill memory.",
    )
    prefill_logits_bytes: int = Field(
        256 * 2**20,
        ge=1,
        description="PyTorch engines: the most logits one prefill projection may hold "
        "(bytes). Prompt logprobs (echo) are computed for the rows that ask, this many "
        "bytes of logits at a time, and the rows prefilled together are limited so their "
        "last-position logits fit too.",
    )
    pytorch_kv_cache: Literal["auto", "dynamic", "static"] = Field(
        "auto",
        description="`static`: preallocated KV slots, our own Llama/Mistral forward pass and "
        "CUDA graphs (engines/pytorch_static.py; the fast path on a GPU). `dynamic`: "
        "transformers' forward over a growing, left-padded DynamicCache (any causal LM). "
        "`auto`: static on a CUDA GPU for the checkpoints it supports (Llama/Mistral "
        "without sliding window or biases), else dynamic, logging why.",
    )
    load_prefetch_threads: int = Field(
        0,
        ge=0,
        description="Threads that read the artifact's weight files into the page cache "
        "from the server's first moment, while Python and torch start; 0: off (the loader "
        "streams the files itself; on the H200 VM's disk reading ahead slowed the start).",
    )
    gil_switch_interval_ms: float = Field(
        0.5,
        gt=0,
        description="PyTorch engine on a GPU: the process's GIL switch interval "
        "(sys.setswitchinterval); the engine thread and the event loop share the GIL.",
    )
    engine_process: Literal["off", "on"] = Field(
        "off",
        description="PyTorch engines: `on` runs the model and its step loop in a process of "
        "their own (token ids to the server over a socket; the two no longer share one "
        "GIL). Measured on an H200 it served the same throughput as `off` with a later "
        "first token, so it is off by default.",
    )
    cuda_graphs: bool = Field(
        True,
        description="With pytorch_kv_cache=static on a GPU: replay decode steps as CUDA graphs.",
    )
    torch_threads: int | None = Field(
        None,
        ge=1,
        description="PyTorch engine: torch's intra-op CPU threads. Unset: the CPUs this "
        "process may really use (cgroup CPU quota, CPU affinity), so a container on a big "
        "node does not run one thread per host core.",
    )

    replay_step_ms: float = Field(
        10.0,
        gt=0,
        description="engine=replay (benchmarks only): milliseconds per step; "
        "each step emits one token to every live request.",
    )

    # Limits (never above what the engine allows).
    max_input_len: int | None = Field(None, ge=1, description="Lower the engine's input limit.")
    max_seq_len: int | None = Field(None, ge=2, description="Lower the engine's sequence limit.")

    # TensorRT-LLM engine.
    kv_cache_free_gpu_memory_fraction: float = Field(
        0.9,
        gt=0,
        le=1,
        description="Share of free GPU memory for the KV cache (TensorRT-LLM, "
        "and the static PyTorch cache when max_seq_len is unset).",
    )
    trtllm_capacity_scheduler_policy: Literal[
        "guaranteed_no_evict", "max_utilization", "static_batch"
    ] = Field(
        "guaranteed_no_evict",
        description="TensorRT-LLM's admission policy (SchedulerConfig.capacity_scheduler_policy)."
        " guaranteed_no_evict admits a request only if KV for prompt + max_tokens is free; "
        "max_utilization admits more and pauses requests when the cache runs out.",
    )

    # Requests.
    default_max_tokens: int = Field(
        2048,
        ge=1,
        description="OpenAI chat requests without max_tokens generate at most this many "
        "tokens (clamped to what the engine allows); a smaller default keeps the KV cache "
        "a request reserves small.",
    )
    max_body_bytes: int = Field(
        8 * 2**20, ge=1024, description="Largest request body; larger ones get 413."
    )
    body_timeout_seconds: float = Field(
        30.0, gt=0, description="A request body must arrive within this; else 408."
    )
    metrics_names: Literal["mtt", "vllm"] = Field(
        "mtt",
        description="Prefix of the Prometheus metrics: `mtt:` (ours) or `vllm:` (so vLLM "
        "dashboards and the Inference Gateway's endpoint picker work unchanged).",
    )

    http_parser: Literal["httptools", "h11"] = Field(
        "httptools",
        description="uvicorn's HTTP/1.1 parser: `httptools` (C; uvicorn's own default when "
        "installed, as in vLLM) or `h11` (pure Python; Truss's choice, ~15% more server CPU "
        "per streamed token).",
    )

    # Admission control and shutdown.
    max_inflight: int = Field(256, ge=1, description="Requests generating at once.")
    max_waiting: int = Field(512, ge=0, description="Requests waiting for a slot; more get 429.")
    drain_grace_seconds: float = Field(
        60.0, ge=0, description="On SIGTERM, how long in-flight streams may finish."
    )

    # Logging.
    log_prompts: bool = Field(False, description="Log prompt and output text (off: privacy).")

    @model_validator(mode="after")
    def _check_limits(self) -> Settings:
        if self.max_input_len and self.max_seq_len and self.max_input_len >= self.max_seq_len:
            raise ValueError("max_input_len must be below max_seq_len")
        return self

    @model_validator(mode="after")
    def _check_paths(self) -> Settings:
        for name in ("artifact", "cache_dir"):
            value = getattr(self, name)
            try:
                Path(value).expanduser()
            except (RuntimeError, ValueError):  # "~nobody/x": no such user's home
                raise ValueError(f"{name}: cannot expand '~' in {value[:80]!r}") from None
        return self

    @property
    def metrics_prefix(self) -> str:
        """What every exported metric name starts with: `mtt:` or `vllm:`."""
        return self.metrics_names + ":"

    @property
    def cache_path(self) -> Path:
        return Path(self.cache_dir).expanduser()

    @classmethod
    def load(
        cls, model_metadata: dict[str, Any] | None, env: dict[str, str] | None = None
    ) -> Settings:
        """Settings from `model_metadata`, overridden by `MTT_*` environment variables."""
        env = dict(os.environ) if env is None else env
        values: dict[str, Any] = {
            k: v for k, v in (model_metadata or {}).items() if k in cls.model_fields
        }
        for name in cls.model_fields:
            raw = env.get(ENV_PREFIX + name.upper())
            if raw is not None:
                values[name] = None if raw == "" and name != "artifact" else raw
        try:
            return cls(**values)
        except ValidationError as exc:
            problems = "; ".join(
                ": ".join(
                    part
                    for part in (
                        ".".join(str(p) for p in e["loc"]),
                        e["msg"].removeprefix("Value error, "),
                    )
                    if part
                )
                for e in exc.errors()
            )
            raise SettingsError(f"invalid settings: {problems}") from None
