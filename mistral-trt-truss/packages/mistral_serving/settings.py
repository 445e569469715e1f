"""Every setting of the service, by concern, and the one way they are loaded.

Values come from the Truss `config.yaml` `model_metadata` block; any of them can be
overridden by an environment variable `MTT_<SETTING NAME IN UPPER CASE>` (what the
Kubernetes manifests and `make serve` use). The names are flat and the same in `build.py`,
the manifests and the README's settings table.

Each concern is a model of its own (`ArtifactSettings`, `ServerSettings`, ...) and
`Settings` combines them by inheritance, so a `Settings` is every one of them: a layer or an
engine typed to take one concern gets the process's settings object and mypy stops it from
reading another concern's knob. The launcher loads them once (`Settings.load`) and hands
them down.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import EnvSettingsSource
from pydantic_settings import SettingsError as PydanticSettingsError

from mistral_serving.ops.gateway_headers import OBJECTIVE_NAME
from mistral_serving.ops.metrics import prefix_for

ENV_PREFIX = "MTT_"
MAX_TEXT_CHARS = 4096  # any text setting (paths, repo ids, names)
MAX_MODEL_NAME_CHARS = 256


class SettingsError(ValueError):
    """A setting is missing or invalid; the message is one actionable line."""


class _Concern(BaseModel):
    # No inf/nan for any float: "inf seconds" is a typo, not a setting.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class ArtifactSettings(_Concern):
    """What to serve and where it is kept (artifacts/)."""

    artifact: str = Field(
        "",
        description="Local directory, or Hugging Face repo id, of a TensorRT-LLM engine "
        "artifact or a Hugging Face checkpoint.",
    )
    artifact_revision: str | None = Field(
        None, description="Pinned revision (commit sha or tag) when `artifact` is a repo id."
    )
    artifact_manifest_sha256: str | None = Field(
        None,
        pattern=r"^[0-9a-f]{64}$",
        description="sha256 of the build manifest the artifact must have (a mounted bucket "
        "or volume is pinned by it, as a repo id is by its revision); another refuses to load.",
    )
    cache_dir: str = Field(
        "~/.cache/mistral-trt-truss",
        description="Where downloaded artifacts and compiled kernels are cached.",
    )
    verify_hashes: bool = Field(
        True, description="Check artifact file hashes against its build manifest on load."
    )

    @field_validator("artifact", mode="before")
    @classmethod
    def _unset_artifact_is_empty(cls, value: object) -> object:
        # `MTT_ARTIFACT=""` clears it like any other setting, to "" (no artifact) rather
        # than to None.
        return "" if value is None else value

    @model_validator(mode="after")
    def _check_paths(self) -> ArtifactSettings:
        for name in ("artifact", "cache_dir"):
            value = getattr(self, name)
            try:
                Path(value).expanduser()
            except (RuntimeError, ValueError):  # "~nobody/x": no such user's home
                raise ValueError(f"{name}: cannot expand '~' in {value[:80]!r}") from None
        return self

    @property
    def cache_path(self) -> Path:
        return Path(self.cache_dir).expanduser()


class ServerSettings(_Concern):
    """The HTTP server: listening, bodies, connections, streams (http/)."""

    served_model_name: str = Field(
        "mistral-7b-instruct", description="Model name returned by the OpenAI routes."
    )
    host: str = Field(
        "0.0.0.0",
        pattern=r"^[0-9A-Za-z.:-]{1,64}$",
        description="Address the server listens on: every interface in the image (the pod's "
        "port); `make serve` and `build.py serve` use 127.0.0.1 unless given `--host`.",
    )
    max_body_bytes: int = Field(
        8 * 2**20, ge=1024, le=2**30, description="Largest request body; larger ones get 413."
    )
    api_keys_file: str = Field(
        "",
        description="File of API keys (one a line, e.g. a mounted Secret); when set, the "
        "generation routes need `Authorization: Bearer <key>` (else 401). Empty: no auth.",
    )
    body_timeout_seconds: float = Field(
        30.0, gt=0, le=3600, description="A request body must arrive within this; else 408."
    )
    max_header_bytes: int = Field(
        32 * 1024,
        ge=1024,
        le=2**24,
        description="Largest request line + headers of one request; past it 431 and the "
        "connection is closed (checked before the parser buffers the bytes).",
    )
    max_header_count: int = Field(
        100,
        ge=8,
        le=10_000,
        description="Most header lines in one request; more get 431 and a close.",
    )
    header_timeout_seconds: float = Field(
        10.0,
        gt=0,
        le=3600,
        description="Once a request's first byte arrives, its headers must be complete "
        "within this; else 408 and the connection is closed (slowloris).",
    )
    keepalive_timeout_seconds: float = Field(
        5.0,
        gt=0,
        le=3600,
        description="A connection with no request in progress (new, or between requests) "
        "is closed after this long.",
    )
    max_connections: int = Field(
        2048,
        ge=4,
        le=1_000_000,
        description="Most open client connections. Past `max_connections` minus "
        "`probe_reserve_connections` the oldest idle connection is closed to make room, "
        "and a new one that finds none serves only probes (GET /health, "
        "/v1/models/{name}, /, /ping, /metrics); past `max_connections` a new one gets 503.",
    )
    probe_reserve_connections: int = Field(
        16,
        ge=1,
        le=1_000_000,
        description="Connections kept for probes and metrics scrapes out of `max_connections`.",
    )
    stream_write_timeout_seconds: float = Field(
        30.0,
        gt=0,
        le=3600,
        description="A streamed answer whose client has not taken a write for this long is "
        "aborted (finished_reason slow_reader), and its engine request with it.",
    )
    stream_buffer_bytes: int = Field(
        256 * 2**10,
        ge=1024,
        le=2**30,
        description="Output one connection may hold unsent in each of three places: the "
        "kernel's send buffer (SO_SNDBUF), the server's transport buffer and the stream's "
        "own; a client that falls further behind is aborted (finished_reason slow_reader).",
    )

    @model_validator(mode="after")
    def _check_connections(self) -> ServerSettings:
        if self.probe_reserve_connections >= self.max_connections:
            raise ValueError("probe_reserve_connections must be below max_connections")
        return self


class AdmissionSettings(_Concern):
    """Who may generate now, who waits, what a request gets by default, and the drain
    (generation/admission.py, ops/shutdown.py, the wire formats)."""

    default_max_tokens: int = Field(
        2048,
        ge=1,
        le=2**21,
        description="OpenAI chat requests without max_tokens generate at most this many "
        "tokens (clamped to what the engine allows); a smaller default keeps the KV cache "
        "a request reserves small.",
    )
    max_inflight: int = Field(256, ge=1, le=65536, description="Requests generating at once.")
    max_waiting: int = Field(
        512,
        ge=0,
        le=100_000,
        description="Requests waiting for a slot; more get 503 with Retry-After (this "
        "replica is saturated: a gateway or client retries another).",
    )
    objective_priorities: dict[str, StrictInt] = Field(
        default_factory=dict,
        max_length=64,
        description="InferenceObjective name -> priority: a request whose "
        "`x-llm-d-inference-objective` names one waits for a slot ahead of lower ones "
        "(higher first, then arrival; unnamed or unknown: 0), as the router's flow control "
        "orders them. As JSON in MTT_OBJECTIVE_PRIORITIES.",
    )
    max_inflight_per_key: int = Field(
        0,
        ge=0,
        le=65536,
        description="With API keys: requests one key may have running or waiting at once "
        "on this server; more get 429 with Retry-After (a tenant over its share: the client "
        "slows down). 0: no per-key limit.",
    )
    drain_grace_seconds: float = Field(
        45.0,
        ge=0,
        le=3600,
        description="On SIGTERM, how long in-flight streams may finish (45 s: KServe's and "
        "llm-d's drain of vLLM, --shutdown-timeout).",
    )
    drain_listen_seconds: float = Field(
        5.0,
        ge=0,
        le=3600,
        description="On SIGTERM the server is unready at once (503 `draining` to probes and "
        "new requests) and keeps its listener open this long (at most the drain grace) "
        "before closing it, so load balancers see the drain rather than refused connections.",
    )
    request_timeout_seconds: float = Field(
        0.0,
        ge=0,
        le=86_400,
        description="Default deadline of a request from its arrival (0: none); the "
        "`X-Request-Timeout` header (seconds) or a gateway's `x-envoy-expected-rq-timeout-ms` "
        "may lower it. Past it: 504 before the answer began, else the engine request is "
        "aborted and the answer ends with finish_reason `timeout`.",
    )

    @field_validator("objective_priorities")
    @classmethod
    def _objective_names(cls, value: dict[str, int]) -> dict[str, int]:
        for name, priority in value.items():
            if not OBJECTIVE_NAME.fullmatch(name):
                raise ValueError(f"{name[:80]!r} cannot name an InferenceObjective")
            if not -(2**31) <= priority < 2**31:
                raise ValueError(f"{name!r}: priority {priority} is not an int32")
        return value


class ResponseStoreSettings(_Concern):
    """Stored answers of the Responses API, kept for `previous_response_id` and
    `GET /v1/responses/{id}` (protocols/responses/store.py): in this process's memory, the
    oldest dropped first past either bound."""

    responses_store_max_entries: int = Field(
        1024,
        ge=0,
        le=1_000_000,
        description="Stored responses kept at most (0: none is stored; `store: true` is "
        "then answered but cannot be continued).",
    )
    responses_store_max_bytes: int = Field(
        64 * 1024 * 1024,
        ge=0,
        le=1 << 36,  # 64 GiB: more than a pod's memory
        description="Their total size at most (each counted as its conversation's and "
        "answer's text, in UTF-8 bytes); one larger than this is not stored.",
    )
    responses_store_max_age_seconds: float = Field(
        3600.0,
        gt=0,
        le=30 * 86_400,
        description="How long a stored response may be continued or read; older ones are dropped.",
    )


class LimitsSettings(_Concern):
    """Sequence, batch and memory sizing every engine kind reads (never above what the
    engine allows)."""

    max_input_len: int | None = Field(
        None, ge=1, le=2**21, description="Lower the engine's input limit."
    )
    max_seq_len: int | None = Field(
        None, ge=2, le=2**21, description="Lower the engine's sequence limit."
    )
    max_batch_size: int = Field(
        64, ge=1, le=4096, description="Sequences decoded together per step."
    )
    max_num_tokens: int = Field(
        8192,
        ge=16,
        le=2**21,
        description="Prompt tokens prefilled per engine step, padding included (rows x "
        "the longest prompt): bounds step latency and prefill memory.",
    )
    kv_cache_free_gpu_memory_fraction: float = Field(
        0.9,
        gt=0,
        le=1,
        description="Share of free GPU memory for the KV cache (TensorRT-LLM, "
        "and the static PyTorch cache when max_seq_len is unset).",
    )
    prefill_logits_bytes: int = Field(
        256 * 2**20,
        ge=1,
        le=2**36,
        description="The most prompt logits (bytes) held at once for echo's prompt "
        "logprobs. PyTorch engines: computed for the rows that ask, this many bytes at a "
        "time, and the rows prefilled together limited so their last-position logits fit "
        "too. TensorRT-LLM kinds: a request whose [prompt, vocab] float32 context logits "
        "exceed it is refused (400); others wait for room.",
    )

    @model_validator(mode="after")
    def _check_limits(self) -> LimitsSettings:
        if self.max_input_len and self.max_seq_len and self.max_input_len >= self.max_seq_len:
            raise ValueError("max_input_len must be below max_seq_len")
        return self


class TorchEngineSettings(LimitsSettings):
    """The PyTorch engine (engine=pytorch): the CPU/dev engine of the core, and the GPU
    fallback's static KV cache when chosen."""

    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto",
        description="Where the PyTorch engine runs: `auto` is a CUDA GPU when torch sees one.",
    )
    torch_dtype: Literal["auto", "float32", "float16", "bfloat16"] = Field(
        "auto",
        description="The PyTorch engine's weights: `auto` is bf16 on a GPU that has it, else "
        "fp16; fp32 on a CPU.",
    )
    pytorch_kv_cache: Literal["auto", "dynamic", "static"] = Field(
        "auto",
        description="`static`: preallocated KV slots, our own Llama/Mistral forward pass and "
        "CUDA graphs (the GPU fallback package; the fast path on a GPU). `dynamic`: "
        "transformers' forward over a growing, left-padded DynamicCache (any causal LM). "
        "`auto`: static on a CUDA GPU for the checkpoints it supports (Llama/Mistral "
        "without sliding window or biases), else dynamic, logging why.",
    )
    gil_switch_interval_ms: float = Field(
        0.5,
        gt=0,
        le=1000,
        description="PyTorch engine on a GPU (and the replay engine, which stands in for "
        "one): the process's GIL switch interval (sys.setswitchinterval); the engine "
        "thread and the event loop share the GIL.",
    )
    torch_threads: int | None = Field(
        None,
        ge=1,
        le=1024,
        description="PyTorch engine: torch's intra-op CPU threads. Unset: the CPUs this "
        "process may really use (cgroup CPU quota, CPU affinity) less one, left to the event "
        "loop, so a container on a big node does not run one thread per host core and a busy "
        "small one does not spin its threads against the server.",
    )
    grammar_cache_bytes: int = Field(
        64 * 2**20,
        ge=0,
        le=2**36,
        description="PyTorch engines: memory of compiled grammars kept for reuse (LRU); "
        "0 keeps none.",
    )


class TrtllmSettings(LimitsSettings):
    """The two TensorRT-LLM engine kinds (engine=tensorrt_llm, trtllm_pytorch)."""

    trtllm_capacity_scheduler_policy: Literal[
        "guaranteed_no_evict", "max_utilization", "static_batch"
    ] = Field(
        "guaranteed_no_evict",
        description="TensorRT-LLM's admission policy (SchedulerConfig.capacity_scheduler_policy)."
        " guaranteed_no_evict admits a request only if KV for prompt + max_tokens is free; "
        "max_utilization admits more and pauses requests when the cache runs out.",
    )
    trtllm_sampler: Literal["trtllm", "torch"] = Field(
        "trtllm",
        description="engine=trtllm_pytorch: TensorRT-LLM's sampler. trtllm (TRTLLMSampler) "
        "applies repetition/presence/frequency penalties but returns only the sampled "
        "token's logprob (top_logprobs above 0 are refused); torch (TorchSampler) returns "
        "top-k logprobs but ignores penalties in 1.2 (requests with penalties are refused).",
    )
    trtllm_logprobs_abort_safe: bool = Field(
        False,
        description="engine=tensorrt_llm: serve logprobs from an engine built with "
        "gather_generation_logits (`build.py engine` builds none: for logprobs, use "
        "engine=trtllm_pytorch). Off: logprobs are refused, because aborting a request with "
        "logprobs crashes the executor on TensorRT-LLM 1.1.0 and 1.2.0rc7. Turn on only "
        "after verify-gpu's abort-with-logprobs check passed on the release you serve.",
    )
    trtllm_cuda_graph_padding: bool = Field(
        True,
        description="engine=trtllm_pytorch: pad decode batches up to the next captured CUDA "
        "graph size (CudaGraphConfig.enable_padding; graphs up to max_batch_size), so every "
        "decode step replays a graph instead of launching kernels one by one.",
    )
    trtllm_kv_block_reuse: bool = Field(
        True,
        description="TensorRT-LLM's KV-cache block reuse (KvCacheConfig.enable_block_reuse, on "
        "upstream by default): requests sharing a prompt prefix reuse its cached blocks. "
        "verify-gpu turns it off so equal greedy requests run the same kernels.",
    )


class GpuFallbackSettings(_Concern):
    """The GPU fallback package: the PyTorch engine's static KV
    cache, the engine in its own process, several front-end processes over it, and the
    replay engine of the benchmarks. A TensorRT-LLM deployment uses none of them; an image
    built without the package refuses each (engines/fallback.py)."""

    prefill_chunk_tokens: int = Field(
        0,
        ge=0,
        le=2**21,
        description="Static PyTorch engine: chunked prefill. Prompt tokens added to a "
        "decode step (one forward pass over the decoding rows' tokens and these; long "
        "prompts are split over steps), so a burst of prompts no longer stalls every "
        "decoding stream for a whole prefill; 0: off (each admitted prompt is prefilled "
        "whole, up to max_num_tokens per step).",
    )
    cuda_graphs: bool = Field(
        True,
        description="With pytorch_kv_cache=static on a GPU: replay decode steps as CUDA graphs.",
    )
    fused_kernels: Literal["auto", "on", "off"] = Field(
        "auto",
        description="Static PyTorch engine: the forward pass's element-wise chain (residual "
        "add + RMSNorm, RoPE of q and k, SiLU x up) and the decode step's attention (each "
        "row over its own columns) as Triton kernels "
        "(the GPU fallback's static/fused.py). `auto`: on a CUDA GPU where Triton imports and the "
        "kernels agree with the torch ops on the model's shapes at start, else the torch ops "
        "(the reason in /version's details); `on`: the engine fails to start without them; "
        "`off`: the torch ops.",
    )
    overlap_decode: bool = Field(
        True,
        description="Static PyTorch engine: while every running row is plain greedy, launch "
        "the next decode step (fed the tokens on the device) before reading the last one's "
        "tokens, so the host's bookkeeping and delivery overlap the GPU; a row that ended "
        "rides one extra step, discarded. false: each step's tokens are read before the next "
        "is launched.",
    )
    engine_process: Literal["off", "on"] = Field(
        "off",
        description="PyTorch engines: `on` runs the model and its step loop in a process of "
        "their own (token ids to the server over a socket; the two no longer share one "
        "GIL); a dead engine process fails its requests and stops the server so it is "
        "restarted. Off by default: it isolates, it does not speed up (docs/performance.md). "
        "With engine=replay (benchmarks) it runs the replay engine there.",
    )
    frontend_processes: int = Field(
        1,
        ge=1,
        le=64,
        description="HTTP server processes sharing the port, over one engine process (needs "
        "`engine_process: on`, so the PyTorch engine; as vLLM's API-server count). Each "
        "applies the admission and connection limits to its own requests; `/metrics` sums "
        "them all. 1: one process, the engine in it unless `engine_process` is on.",
    )
    replay_step_ms: float = Field(
        10.0,
        gt=0,
        le=60_000,
        description="engine=replay (benchmarks only): milliseconds per step; "
        "each step emits one token to every live request.",
    )


class GrammarSettings(_Concern):
    """Structured output (response_format, forced tool calls): bounds checked before any
    grammar compile (structured/)."""

    grammar_max_schema_bytes: int = Field(
        65536,
        ge=1024,
        le=2**24,
        description="Largest response_format schema (JSON bytes); larger: 400.",
    )
    grammar_max_schema_depth: int = Field(
        20, ge=2, le=32, description="Deepest JSON nesting of a schema; deeper: 400."
    )
    grammar_max_enum_values: int = Field(
        1000, ge=1, le=10**6, description="enum/const values in one schema, all counted; more: 400."
    )
    grammar_max_pattern_repeat: int = Field(
        1000,
        ge=1,
        le=10**9,
        description="Largest price of one schema `pattern`: its expansion (bounded "
        "repetitions multiply when nested), or 16x the overlap of variable-length runs of a "
        "broad class (`.`, negated classes, `\\w`) that meet; 10x this for all of a "
        "schema's patterns; more: 400.",
    )
    grammar_compile_timeout_seconds: float = Field(
        10.0,
        gt=0,
        le=600,
        description="A schema must compile within this (in a child process that is killed "
        "when it overruns); else 400. The verdict is cached.",
    )
    grammar_compile_workers: int = Field(
        2,
        ge=1,
        le=16,
        description="Child processes compiling new schemas at once; 4 schemas a worker "
        "may wait for one, more get 429.",
    )


class OpsSettings(_Concern):
    """Operations: metrics names, the engine watchdog, start-up checks, logging."""

    metrics_names: Literal["mtt", "vllm", "trtllm"] = Field(
        "mtt",
        description="Names of the Prometheus metrics: `mtt:` (ours), `vllm:` (so vLLM "
        "dashboards and the Inference Gateway's endpoint picker work unchanged) or "
        "`trtllm_` with trtllm-serve's names (the picker's trtllm-serve model-server type).",
    )
    otlp_traces_endpoint: str = Field(
        "",
        max_length=2048,
        pattern=r"^(https?://[^\s]+)?$",
        description="OTLP/HTTP endpoint to export request traces to (e.g. "
        "`http://otel-collector:4318/v1/traces`); empty: no tracing.",
    )
    engine_stall_unready_seconds: float = Field(
        30.0,
        gt=0,
        le=3600,
        description="Readiness answers 503 while the engine has made no progress (no step, "
        "no response) for this long with requests pending; it recovers if the engine moves.",
    )
    engine_stall_exit_seconds: float = Field(
        120.0,
        gt=0,
        le=86400,
        description="Past this long without engine progress while requests are pending, the "
        "server logs why and exits with status 1, so Kubernetes replaces the container.",
    )
    health_generate_timeout_seconds: float = Field(
        10.0,
        gt=0,
        le=600,
        description="`GET /health/generate` generates one token, straight to the engine, and "
        "answers 503 `dead` unless it comes within this; a probe for a hung engine that a "
        "plain /health cannot see (as trtllm-serve's /health_generate).",
    )
    driver_check: Literal["refuse", "warn"] = Field(
        "refuse",
        description="At start, an NVIDIA driver older than the image's CUDA needs (R580 for "
        "CUDA 13.0): `refuse` (one line, exit 2) or `warn` and start (CUDA forward "
        "compatibility set up by hand).",
    )
    log_prompts: bool = Field(False, description="Log prompt and output text (off: privacy).")
    log_format: Literal["auto", "text", "json"] = Field(
        "auto",
        description="`text`: a line of time, level and message per record; `json`: one JSON "
        "object a line (for a log collector); `auto`: text when the server's stderr is a "
        "terminal, else JSON.",
    )

    @model_validator(mode="after")
    def _check_stall_limits(self) -> OpsSettings:
        if self.engine_stall_exit_seconds < self.engine_stall_unready_seconds:
            raise ValueError(
                "engine_stall_exit_seconds must be at least engine_stall_unready_seconds"
            )
        return self

    @property
    def metrics_prefix(self) -> str:
        """What every exported metric name starts with: `mtt:`, `vllm:` or `trtllm_`."""
        return prefix_for(self.metrics_names)


class Settings(
    ArtifactSettings,
    ServerSettings,
    AdmissionSettings,
    ResponseStoreSettings,
    TorchEngineSettings,
    TrtllmSettings,
    GpuFallbackSettings,
    GrammarSettings,
    OpsSettings,
):
    """Every concern at once: what the launcher loads and hands down."""

    engine: Literal["auto", "tensorrt_llm", "trtllm_pytorch", "pytorch", "replay"] = Field(
        "auto",
        description="`auto` picks from the artifact: engine dir -> tensorrt_llm. "
        "`trtllm_pytorch` serves a Hugging Face checkpoint with TensorRT-LLM's PyTorch backend "
        "(no engine build; needs the TensorRT-LLM image and a GPU). "
        "`replay` is for benchmarks only: it emits pre-made tokens without a model.",
    )

    @model_validator(mode="after")
    def _check_text(self) -> Settings:
        """Every text setting is printable UTF-8 of a sane length (an environment value
        that is not UTF-8 arrives with lone surrogates); the served model name also has no
        whitespace: it is echoed on every OpenAI answer."""
        for name in type(self).model_fields:
            value = getattr(self, name)
            if not isinstance(value, str):
                continue
            if len(value) > MAX_TEXT_CHARS:
                raise ValueError(f"{name}: longer than {MAX_TEXT_CHARS} characters")
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                raise ValueError(f"{name}: not valid UTF-8 ({ascii(value[:60])})") from None
            if not value.isprintable():
                raise ValueError(f"{name}: holds control characters ({ascii(value[:60])})")
        model = self.served_model_name
        if not model or len(model) > MAX_MODEL_NAME_CHARS or any(c.isspace() for c in model):
            raise ValueError(
                f"served_model_name: 1 to {MAX_MODEL_NAME_CHARS} characters without "
                f"whitespace ({ascii(model[:60])})"
            )
        return self

    @model_validator(mode="after")
    def _check_frontends(self) -> Settings:
        """Several front-end processes share one engine process: it must exist."""
        if self.frontend_processes > 1 and self.engine_process != "on":
            raise ValueError(
                f"frontend_processes={self.frontend_processes} needs engine_process: on "
                "(the front-ends share the engine in its own process)"
            )
        return self

    @classmethod
    def load(
        cls, model_metadata: Mapping[str, Any] | None, env: Mapping[str, str] | None = None
    ) -> Settings:
        """Settings from `model_metadata` (keys that are no setting are ignored: Truss's
        own keys live there too), overridden by the `MTT_*` environment variables of `env`
        (default: the process's), read by pydantic-settings' own environment source; an
        empty variable clears its setting (to its unset value). An `MTT_*` variable that
        names no setting is refused: a typo would otherwise be served without a word."""
        environ = os.environ if env is None else env
        variables = (k for k in environ if k.startswith(ENV_PREFIX))
        if problem := unknown_settings(variables, variables=True):
            raise SettingsError(problem)
        given = {k: v for k, v in (model_metadata or {}).items() if k in cls.model_fields}
        source = _Environment(cls, environ)
        try:
            return cls(**(given | source()))
        except ValidationError as exc:
            raise SettingsError(f"invalid settings: {_one_line(exc)}") from None
        except PydanticSettingsError as exc:  # a mapping setting's variable is not JSON
            raise SettingsError(f"invalid settings: {exc} (expected JSON)") from None


FIELDS = sorted(Settings.model_fields)
SETTINGS_DOC = "docs/settings.md"  # the reference of every setting


def unknown_settings(names: Iterable[str], variables: bool = False) -> str | None:
    """One line naming each of `names` that is no setting, each with the nearest setting
    ("did you mean ..."), or None when all are settings. `names` are keys as `--set` and
    `serving:` spell them (`max_inflight`), or with `variables` environment variables
    (`MTT_MAX_INFLIGHT`); exactly so, and the suggestion is spelled the same way."""
    problems = []
    for name in names:
        key = name.removeprefix(ENV_PREFIX) if variables else name
        spelled = key.isascii() and (key.upper() if variables else key.lower()) == key
        if spelled and (not variables or name.startswith(ENV_PREFIX)) and key.lower() in FIELDS:
            continue
        # Compared in lower case: `MTT_max_inflight` is the setting under a wrong spelling.
        near = difflib.get_close_matches(key.lower(), FIELDS, n=1, cutoff=0.6)
        if near:
            hint = f"did you mean {ENV_PREFIX + near[0].upper() if variables else near[0]}?"
        else:
            hint = f"every setting: {SETTINGS_DOC}"
        problems.append(f"{_shown(name)} is not a setting ({hint})")
    return "; ".join(problems) or None


def _shown(name: str, limit: int = 80) -> str:
    """A name as it can be printed on one line (an environment name may hold anything)."""
    if len(name) <= limit and name.isprintable() and name.isascii():
        return name
    return ascii(name[:limit])


class _Environment(EnvSettingsSource):
    """pydantic-settings' environment source over a given mapping, matching names as
    they are documented: `MTT_` and the setting's name in upper case, exactly. An empty
    value stands for "unset" (None): how a manifest clears a setting config.yaml gives."""

    def __init__(self, settings_cls: type[BaseModel], environ: Mapping[str, str]) -> None:
        self._environ = environ
        super().__init__(
            settings_cls,  # type: ignore[arg-type]  # it reads only the fields and config
            case_sensitive=False,
            env_prefix=ENV_PREFIX,
        )

    def _load_env_vars(self) -> Mapping[str, str | None]:
        # The hook pydantic-settings' own sources override (.env files, the CLI); its keys
        # are lower case when matching is case-insensitive.
        return {
            k.lower(): v
            for k, v in self._environ.items()
            if k.startswith(ENV_PREFIX) and k == k.upper()
        }

    def __call__(self) -> dict[str, Any]:
        return {k: None if v == "" else v for k, v in super().__call__().items()}


def _one_line(exc: ValidationError) -> str:
    return "; ".join(
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
