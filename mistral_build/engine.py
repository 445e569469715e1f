"""`python build.py engine`: Hugging Face checkpoint -> TensorRT-LLM 1.2.x engine -> build
manifest + tokenizer next to it -> optional push to a Hugging Face repo (one commit).

Why TensorRT-LLM's own scripts as subprocesses (checkpoint conversion, then `trtllm-build`)
rather than the LLM API's build-and-save (`tensorrt_llm._tensorrt_engine.LLM(...).save()`):
- they are the documented, stable 1.2.x path and every flag we pass is visible in the
  command, the logs and the manifest, so a build can be reproduced by hand;
- each step is a separate process: a crash or OOM (the build peaks at several times the
  weights in host memory) cannot take this script down, and each step keeps its full log;
- the LLM API picks plugins and limits itself and hides the intermediate checkpoint, which
  we want to keep for quantized builds (calibration takes a while).

The checks run first and refuse a request that would fail after 30 minutes; they are pure
functions over the facts (GPUs, free disk, installed versions), so tests exercise them here.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from mistral_build.gpu import (
    TARGETS,
    BuildGpu,
    capability_tuple,
    detect_gpus,
    matches_target,
    supports_fp8,
)
from mistral_build.paths import REPO_ROOT
from mistral_build.publish import (
    ArtifactError,
    finish_artifact,
    hf_token_from_env,
    hub_errors,
    hub_failure,
    push_artifact,
)
from mistral_build.release import BASE_IMAGE
from mistral_serving.artifacts.manifest import BuildManifest, GpuRecord
from mistral_serving.engines.trtllm.checks import LAST_ENGINE_LINE, release_line
from mistral_serving.ops import driver

DEFAULT_MODEL = "mistralai/Mistral-7B-Instruct-v0.2"
# The TensorRT-LLM line this pipeline was checked against. Since 1.0 the PyTorch backend is
# TensorRT-LLM's default and the TensorRT-engine path (`trtllm-build`, `_tensorrt_engine.LLM`)
# is the legacy one; flags and engine layout can change between lines, so others are refused.
TRTLLM_SERIES = "1.2."
# NVIDIA's release image for that line: the one the serving image is built FROM.
TRTLLM_IMAGE = BASE_IMAGE
# Where the release image keeps the example scripts (the conversion scripts are examples,
# not part of the wheel).
DEFAULT_EXAMPLES_DIR = "/app/tensorrt_llm/examples"
HEARTBEAT_S = 15.0

Quantization = Literal["none", "int8_sq", "int8_wo", "int4_wo", "int4_awq", "fp8"]
KvCacheDtype = Literal["auto", "int8"]
Backend = Literal["tensorrt_llm", "pytorch"]
GpuTargetName = Literal["a100", "h100", "h200", "l4"]

# Source checkpoint files to fetch: weights as Hugging Face safetensors only. The Mistral repos
# also carry the same weights as .bin files and in Mistral's own format
# (`consolidated.safetensors`, ~14.5 GB for the 7B), which `*.safetensors` would match too:
# the ignore pattern keeps the download (and the disk estimate) to one copy of the weights.
SOURCE_PATTERNS = ["*.json", "*.safetensors", "tokenizer.model", "*.jinja"]
SOURCE_IGNORE = ["consolidated*"]


# ---------------------------------------------------------------------------------------
# Options and facts


class EngineOptions(BaseModel):
    """Every option of `build.py engine`; what the manifest records as build options."""

    model_config = ConfigDict(extra="forbid")

    model: str = DEFAULT_MODEL
    revision: str | None = None
    checkpoint_dir: Path | None = None
    backend: Backend = "tensorrt_llm"
    dev: bool = False
    # None: chosen from the target GPU (`default_dtype`, `default_max_batch_size`) and,
    # for the batch size, from the build GPU's memory once it is seen (`run_engine`).
    dtype: Literal["float16", "bfloat16"] | None = None
    quantization: Quantization = "none"
    smoothquant_alpha: float = Field(0.5, ge=0, le=1)
    kv_cache_dtype: KvCacheDtype = "auto"
    calib_size: int = Field(512, ge=1)
    calib_dataset: str | None = None
    tp_size: int = Field(1, ge=1)
    max_batch_size: int | None = Field(None, ge=1)
    max_input_len: int = Field(32256, ge=1)
    max_seq_len: int = Field(32768, ge=2)
    max_num_tokens: int = Field(8192, ge=1)
    gpu: GpuTargetName = "a100"
    output_dir: Path | None = None
    workdir: Path | None = None
    examples_dir: str = DEFAULT_EXAMPLES_DIR
    push: str | None = None
    push_revision: str = "main"
    private: bool = True
    dry_run: bool = False

    @model_validator(mode="after")
    def _target_defaults(self) -> EngineOptions:
        # Filled here so that every use (slug, commands, manifest) sees one value; an
        # explicit value stays in model_fields_set, a default does not.
        if self.dtype is None:
            self.dtype = default_dtype(self.gpu)
            self.__pydantic_fields_set__.discard("dtype")
        if self.max_batch_size is None:
            self.max_batch_size = default_max_batch_size(self.gpu, None)
            self.__pydantic_fields_set__.discard("max_batch_size")
        return self

    @property
    def source_label(self) -> str:
        return str(self.checkpoint_dir) if self.checkpoint_dir else self.model

    def slug(self) -> str:
        name = Path(self.source_label).name.lower()
        if self.dev:
            return "dev-model"
        if self.backend == "pytorch":
            return f"{name}-pytorch"
        precision = self.dtype if self.quantization == "none" else self.quantization
        return f"{name}-{precision}-tp{self.tp_size}-{self.gpu}"

    def resolved_output_dir(self) -> Path:
        if self.output_dir is not None:
            return self.output_dir
        if self.dev:
            from mistral_build.paths import DEV_MODEL_DIR

            return DEV_MODEL_DIR
        return REPO_ROOT / "build" / "artifacts" / self.slug()

    def resolved_workdir(self) -> Path:
        if self.workdir is not None:
            return self.workdir
        out = self.resolved_output_dir()
        return out.with_name(out.name + ".work")


# Memory of the GPU each target names when the build machine's GPU is not seen (a dry run):
# GKE's `nvidia-tesla-a100` is the 40 GB A100, `nvidia-h100-80gb` the 80 GB H100.
TARGET_MEMORY_GIB: dict[str, int] = {"a100": 40, "h100": 80, "h200": 141, "l4": 24}


def default_dtype(target: str) -> Literal["float16", "bfloat16"]:
    """bf16 on sm80+ (every target we build for): Mistral's weights are bf16, and fp16's
    narrower range can overflow in activations where bf16 does not; fp16 only before
    Ampere, which has no bf16 tensor cores."""
    return (
        "bfloat16" if capability_tuple(TARGETS[target].compute_capability) >= (8, 0) else "float16"
    )


def default_max_batch_size(target: str, memory_mib: int | None) -> int:
    """Requests decoded together. A Mistral-7B bf16 engine leaves ~60 GB of KV cache on an
    80 GB GPU, about 185 requests of the default size (docs/deploy.md), so a cap of 64
    idles most of it: 256 on 80 GB and up, 128 on 40 GB, 64 below."""
    gib = memory_mib / 1024 if memory_mib else TARGET_MEMORY_GIB[target]
    if gib >= 70:
        return 256
    if gib >= 35:
        return 128
    return 64


class ModelFacts(BaseModel):
    """What the checks need to know about the source model."""

    max_position_embeddings: int
    num_attention_heads: int
    num_key_value_heads: int
    num_parameters: int


class BuildFacts(BaseModel):
    """What the checks need to know about this machine."""

    gpus: list[BuildGpu] = Field(default_factory=list)
    free_disk_bytes: int
    trtllm_version: str | None = None  # None: tensorrt_llm is not importable
    tensorrt_version: str | None = None
    driver_version: str | None = None  # None: no NVIDIA driver found
    image_cuda: str | None = None  # the CUDA toolkit here (the release image's), major.minor

    def driver_report(self) -> driver.DriverReport:
        major = int(self.image_cuda.split(".")[0]) if self.image_cuda else None
        minimum = driver.MIN_DRIVER.get(major) if major is not None else None
        return driver.DriverReport(self.driver_version, self.image_cuda, minimum)


def model_facts_from_config(config: dict) -> ModelFacts:
    """Facts from a Hugging Face config.json; the parameter count is computed from the shapes
    of a Llama/Mistral decoder (embeddings, attention, gated MLP, norms, LM head)."""
    h = config["hidden_size"]
    heads = config["num_attention_heads"]
    kv = config.get("num_key_value_heads") or heads
    head_dim = config.get("head_dim") or h // heads
    inter = config["intermediate_size"]
    layers = config["num_hidden_layers"]
    vocab = config["vocab_size"]
    per_layer = h * heads * head_dim * 2 + 2 * h * kv * head_dim + 3 * h * inter + 2 * h
    lm_head = 0 if config.get("tie_word_embeddings") else vocab * h
    return ModelFacts(
        max_position_embeddings=config["max_position_embeddings"],
        num_attention_heads=heads,
        num_key_value_heads=kv,
        num_parameters=vocab * h + layers * per_layer + h + lm_head,
    )


# Used when the source config.json cannot be read before the download (no network yet).
KNOWN_MODELS: dict[str, ModelFacts] = {
    DEFAULT_MODEL: ModelFacts(
        max_position_embeddings=32768,
        num_attention_heads=32,
        num_key_value_heads=8,
        num_parameters=7_241_732_096,
    ),
}


# ---------------------------------------------------------------------------------------
# Checks (pure)

BYTES_PER_PARAM: dict[str, float] = {
    "none": 2.0,  # float16 / bfloat16
    "int8_sq": 1.0,
    "int8_wo": 1.0,
    "fp8": 1.0,
    "int4_wo": 0.5,
    "int4_awq": 0.5,
}
DISK_MARGIN = 1.15  # logs, timing cache, scales, filesystem slack


def estimate_disk_bytes(opts: EngineOptions, model: ModelFacts, download: bool) -> int:
    """Source checkpoint (when downloaded: one copy of the weights, `SOURCE_IGNORE` keeps
    Mistral's duplicate `consolidated.safetensors` out) + TensorRT-LLM checkpoint + engine.
    Embeddings and LM head stay in 16 bits when the rest is quantized, hence the floor.
    Mistral-7B fp16: 3 x 14.5 GB x 1.15 = about 50 GB."""
    params = model.num_parameters
    quantized = params * max(BYTES_PER_PARAM[opts.quantization], 0.6)
    source = params * 2.0 if download else 0
    if opts.backend == "pytorch":
        return int((source + params * 2.0) * DISK_MARGIN)
    return int((source + 2 * quantized) * DISK_MARGIN)


def check_options(opts: EngineOptions, model: ModelFacts | None) -> list[str]:
    """Refusals that depend on the request only (also applied with --dry-run)."""
    problems: list[str] = []
    if opts.checkpoint_dir is not None and opts.revision is not None:
        problems.append("--revision applies to --model (a Hub repo), not to --checkpoint-dir")
    if opts.checkpoint_dir is not None and not (opts.checkpoint_dir / "config.json").is_file():
        problems.append(f"--checkpoint-dir {opts.checkpoint_dir}: no config.json there")
    if opts.dev and opts.backend != "pytorch":
        problems.append("--dev builds the tiny PyTorch dev model: use it with --backend pytorch")
    if opts.backend == "pytorch" and opts.quantization != "none":
        problems.append("--quantization applies to TensorRT-LLM engines, not --backend pytorch")
    if opts.kv_cache_dtype == "int8" and opts.quantization == "fp8":
        problems.append(
            "--kv-cache-dtype int8 with --quantization fp8: FP8 builds keep an FP8 KV cache"
        )
    if opts.backend == "pytorch" and opts.kv_cache_dtype != "auto":
        problems.append("--kv-cache-dtype applies to TensorRT-LLM engines, not --backend pytorch")
    if opts.max_input_len >= opts.max_seq_len:
        problems.append(
            f"--max-input-len {opts.max_input_len} must be below --max-seq-len "
            f"{opts.max_seq_len} (the sequence holds the prompt and at least one new token)"
        )
    if model is not None and not opts.dev:
        if opts.max_seq_len > model.max_position_embeddings:
            problems.append(
                f"--max-seq-len {opts.max_seq_len} exceeds the model's "
                f"max_position_embeddings {model.max_position_embeddings}"
            )
        if opts.backend == "tensorrt_llm" and model.num_key_value_heads % opts.tp_size:
            problems.append(
                f"--tp-size {opts.tp_size} must divide the model's "
                f"{model.num_key_value_heads} KV heads"
            )
    target = TARGETS[opts.gpu]
    if (
        opts.backend == "tensorrt_llm"
        and opts.quantization == "fp8"
        and not supports_fp8(target.compute_capability)
    ):
        problems.append(
            f"--quantization fp8 needs compute capability 8.9+ (L4, H100, H200); "
            f"{opts.gpu} is {target.compute_capability}: use int8_wo, int4_wo or int4_awq"
        )
    return problems


def check_environment(
    opts: EngineOptions, facts: BuildFacts, model: ModelFacts | None, download: bool
) -> list[str]:
    """Refusals that depend on this machine: what is installed, the GPUs, the disk."""
    problems: list[str] = []
    if opts.backend == "tensorrt_llm":
        if facts.trtllm_version is None:
            problems.append(
                "tensorrt_llm is not importable here: run inside NVIDIA's TensorRT-LLM 1.2.x "
                f"release container: docker run --rm -it --gpus all --ipc=host -v $PWD:/workspace "
                f"-w /workspace -e HF_TOKEN {TRTLLM_IMAGE} python3 build.py engine ..."
            )
        elif not facts.trtllm_version.startswith(TRTLLM_SERIES):
            # 1.3 and later have no TensorRT-engine backend at all (no trtllm-build).
            line = release_line(facts.trtllm_version)
            newer = line is not None and line > LAST_ENGINE_LINE
            problems.append(
                f"tensorrt_llm {facts.trtllm_version} is installed; this pipeline targets "
                f"{TRTLLM_SERIES}x (engine flags and layout differ between lines): use {TRTLLM_IMAGE}"
                + (
                    ", or build no engine: --backend pytorch and serve it with "
                    "engine=trtllm_pytorch"
                    if newer
                    else ""
                )
            )
        if facts.driver_report().too_old:
            problems.append(facts.driver_report().refusal())
        if not facts.gpus:
            problems.append(
                f"no NVIDIA GPU found (nvidia-smi lists none): an engine must be built on a GPU "
                f"of the kind it will serve on ({opts.gpu})"
            )
        else:
            if opts.tp_size > len(facts.gpus):
                problems.append(
                    f"--tp-size {opts.tp_size} needs {opts.tp_size} GPUs; "
                    f"this machine has {len(facts.gpus)}"
                )
            gpu = facts.gpus[0]
            target = TARGETS[opts.gpu]
            if not matches_target(gpu, opts.gpu):
                problems.append(
                    f"this machine has {gpu.name} (sm {gpu.compute_capability}) but --gpu "
                    f"{opts.gpu} is {target.name} (sm {target.compute_capability}): an engine "
                    "runs only on the GPU kind it was built on; build there or change --gpu"
                )
            if opts.quantization == "fp8" and not supports_fp8(gpu.compute_capability):
                problems.append(
                    f"--quantization fp8 needs compute capability 8.9+; {gpu.name} is "
                    f"{gpu.compute_capability}"
                )
    if model is not None and not opts.dev:
        need = estimate_disk_bytes(opts, model, download)
        if facts.free_disk_bytes < need:
            problems.append(
                f"not enough disk: about {need / 1e9:.0f} GB needed (source, converted checkpoint, "
                f"engine), {facts.free_disk_bytes / 1e9:.0f} GB free under the output directory"
            )
    return problems


# ---------------------------------------------------------------------------------------
# The plan: exact commands


class BuildPaths(BaseModel):
    source_dir: Path  # Hugging Face checkpoint (downloaded or given)
    trtllm_checkpoint_dir: Path
    output_dir: Path  # the artifact: engine + tokenizer + manifest
    logs_dir: Path
    # TensorRT's timing cache, read if there and written after the build. Absolute: by
    # default trtllm-build writes `model.cache` into its working directory and asserts the
    # write worked (BuildConfig.output_timing_cache, builder.py `build`), which fails where
    # that directory is read-only (the verify Job's, root-owned, as uid 60000).
    timing_cache: Path


def build_paths(opts: EngineOptions) -> BuildPaths:
    work = opts.resolved_workdir()
    return BuildPaths(
        source_dir=opts.checkpoint_dir or work / "hf-checkpoint",
        trtllm_checkpoint_dir=work / "trtllm-checkpoint",
        output_dir=opts.resolved_output_dir(),
        logs_dir=work / "logs",
        timing_cache=Path(os.path.abspath(work / "timing.cache")),
    )


class Step(BaseModel):
    name: str
    argv: list[str]


def convert_command(opts: EngineOptions, paths: BuildPaths, python: str) -> list[str]:
    """Hugging Face checkpoint -> TensorRT-LLM checkpoint (weights split per TP rank)."""
    common = [
        "--model_dir", str(paths.source_dir),
        "--output_dir", str(paths.trtllm_checkpoint_dir),
        "--dtype", str(opts.dtype),
        "--tp_size", str(opts.tp_size),
    ]  # fmt: skip
    if opts.quantization in ("int4_awq", "fp8"):
        # AWQ and FP8 need calibration, which only ModelOpt's path does:
        # examples/quantization/quantize.py (--qformat, --calib_size, --kv_cache_dtype,
        # --awq_block_size, --calib_dataset).
        argv = [python, f"{opts.examples_dir}/quantization/quantize.py", *common]
        argv += ["--qformat", opts.quantization, "--calib_size", str(opts.calib_size)]
        if opts.quantization == "int4_awq":
            argv += ["--awq_block_size", "128"]
            if opts.kv_cache_dtype == "int8":
                argv += ["--kv_cache_dtype", "int8"]
        else:
            argv += ["--kv_cache_dtype", "fp8"]  # FP8 KV cache halves its memory on Hopper/Ada
        if opts.calib_dataset:
            argv += ["--calib_dataset", opts.calib_dataset]
        return argv
    # examples/models/core/llama/convert_checkpoint.py (Mistral is a Llama-family model):
    # --model_dir --output_dir --dtype --tp_size --use_weight_only --weight_only_precision.
    argv = [python, f"{opts.examples_dir}/models/core/llama/convert_checkpoint.py", *common]
    if opts.quantization in ("int8_wo", "int4_wo"):
        argv += ["--use_weight_only", "--weight_only_precision", opts.quantization[:4]]
    if opts.quantization == "int8_sq":
        # SmoothQuant W8A8 (args_to_quant_config: --smoothquant with --per_channel and
        # --per_token is W8A8_SQ_PER_CHANNEL_PER_TOKEN_PLUGIN): INT8 tensor-core GEMMs on
        # A100 for weights and activations, per-token/per-channel scales for accuracy.
        argv += ["--smoothquant", str(opts.smoothquant_alpha), "--per_channel", "--per_token"]
    if opts.kv_cache_dtype == "int8":
        # INT8 KV cache (QuantAlgo.INT8 for kv_cache_quant_algo): half the KV bytes, so
        # twice the tokens in flight on an A100, which has no FP8.
        argv += ["--int8_kv_cache"]
    if opts.quantization == "int8_sq" or opts.kv_cache_dtype == "int8":
        # Both calibrate on sample text (activation and KV scales).
        argv += ["--calib_size", str(opts.calib_size)]
        if opts.calib_dataset:
            argv += ["--calib_dataset", opts.calib_dataset]
    return argv


def build_command(opts: EngineOptions, paths: BuildPaths) -> list[str]:
    """`trtllm-build` (tensorrt_llm/commands/build.py; plugin flags from add_plugin_argument in
    tensorrt_llm/plugin/plugin.py). Production flags are passed explicitly even where they
    are 1.2.x defaults, so the manifest and logs say what the engine was built with."""
    return [
        "trtllm-build",
        "--checkpoint_dir", str(paths.trtllm_checkpoint_dir),
        "--output_dir", str(paths.output_dir),
        # cuBLASLt GEMMs in the checkpoint's dtype (the article's flag).
        "--gemm_plugin", "auto",
        "--gpt_attention_plugin", "auto",
        # Paged KV cache: in-flight batching without reserving max_seq_len per request.
        "--kv_cache_type", "paged",
        # Packed (ragged) batches: no compute wasted on padding.
        "--remove_input_padding", "enable",
        # Fused attention in the prefill; paged context FMHA allows chunked prefill and KV
        # cache reuse, so prompts longer than max_num_tokens still fit in one step budget.
        "--context_fmha", "enable",
        "--use_paged_context_fmha", "enable",
        "--max_batch_size", str(opts.max_batch_size),
        "--max_input_len", str(opts.max_input_len),
        "--max_seq_len", str(opts.max_seq_len),
        "--max_num_tokens", str(opts.max_num_tokens),
        "--max_beam_width", "1",
        # Several TensorRT optimisation profiles (by token count): small decode batches
        # and large prefills each get kernels tuned for their shape; a longer build.
        "--multiple_profiles", "enable",
        "--workers", str(opts.tp_size),
        # A rebuild in the same workdir reuses the tactics timed last time.
        "--input_timing_cache", str(paths.timing_cache),
        "--output_timing_cache", str(paths.timing_cache),
        "--log_level", "info",
    ]  # fmt: skip


def plan_steps(opts: EngineOptions, paths: BuildPaths, python: str = "python3") -> list[Step]:
    return [
        Step(name="convert", argv=convert_command(opts, paths, python)),
        Step(name="build", argv=build_command(opts, paths)),
    ]


def render_plan(opts: EngineOptions, paths: BuildPaths, steps: list[Step]) -> str:
    """The build as a shell script: what --dry-run prints and the golden files hold."""
    lines = [
        "#!/usr/bin/env bash",
        "# python build.py engine: the exact commands",
        "set -euo pipefail",
    ]
    if opts.checkpoint_dir is None:
        lines.append(
            f"# download: {opts.model}@{opts.revision or 'main'} -> {paths.source_dir} "
            f"(huggingface_hub.snapshot_download, allow_patterns={SOURCE_PATTERNS}, "
            f"ignore_patterns={SOURCE_IGNORE})"
        )
    for i, step in enumerate(steps, 1):
        lines.append(
            f"# [{i}/{len(steps)}] {step.name}; log: {paths.logs_dir / (step.name + '.log')}"
        )
        lines.append(format_command(step.argv))
    lines.append(f"# finish: tokenizer files + build_manifest.json -> {paths.output_dir}")
    if opts.push:
        lines.append(f"# push: {paths.output_dir} -> {opts.push}@{opts.push_revision} (one commit)")
    return "\n".join(lines) + "\n"


def format_command(argv: list[str]) -> str:
    """One `--flag value` per line, shell-quoted, so diffs of golden files read well."""
    groups: list[list[str]] = []
    for token in argv:
        last = groups[-1] if groups else None
        # The program group takes its positional args; a flag group takes one value.
        takes = last is not None and (not last[0].startswith("--") or len(last) == 1)
        if last is None or token.startswith("--") or not takes:
            groups.append([token])
        else:
            last.append(token)
    return " \\\n    ".join(shlex.join(g) for g in groups)


# ---------------------------------------------------------------------------------------
# Facts about this machine and the model (impure)


def package_version(*names: str) -> str | None:
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def free_disk_bytes(path: Path) -> int:
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return shutil.disk_usage(probe).free


def gather_facts(opts: EngineOptions) -> BuildFacts:
    trtllm = None
    if importlib.util.find_spec("tensorrt_llm") is not None:
        trtllm = package_version("tensorrt_llm", "tensorrt-llm") or "unknown"
    return BuildFacts(
        gpus=detect_gpus(),
        free_disk_bytes=free_disk_bytes(opts.resolved_output_dir()),
        trtllm_version=trtllm,
        tensorrt_version=package_version("tensorrt", "tensorrt_cu13", "tensorrt_cu12"),
        driver_version=driver.driver_version(),
        image_cuda=driver.image_cuda_version(),
    )


def read_model_facts(opts: EngineOptions, token: str | None) -> ModelFacts | None:
    """From the checkpoint's config.json: the local one, else the Hub's (small, fetched
    before the big download; a dry run only looks in the local Hub cache: it never needs the
    network), else what we know of the default model."""
    if opts.dev:
        return None
    config_path: Path | None = None
    if opts.checkpoint_dir is not None:
        config_path = opts.checkpoint_dir / "config.json"
    else:
        try:
            from huggingface_hub import hf_hub_download, try_to_load_from_cache

            if opts.dry_run:  # the local cache only (hf_hub_download may call out even then)
                cached = try_to_load_from_cache(opts.model, "config.json", revision=opts.revision)
                config_path = Path(cached) if isinstance(cached, str) else None
            else:
                config_path = Path(
                    hf_hub_download(
                        opts.model,
                        "config.json",
                        revision=opts.revision,
                        token=token,
                        etag_timeout=10,
                    )
                )
        except Exception:  # no network or no access yet: fall back to what we know
            config_path = None
    if config_path is not None and config_path.is_file():
        try:
            return model_facts_from_config(json.loads(config_path.read_text()))
        except (KeyError, TypeError, ValueError):
            return None
    return KNOWN_MODELS.get(opts.model)


# ---------------------------------------------------------------------------------------
# Running


def format_elapsed(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s"


def last_line(path: Path, limit: int = 120) -> str:
    try:
        with path.open("rb") as f:
            f.seek(max(0, path.stat().st_size - 4096))
            lines = [ln for ln in f.read().decode(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1][:limit] if lines else ""


def run_step(index: int, total: int, step: Step, log_path: Path) -> None:
    """Run one command, its full output in `log_path`; show elapsed time and the latest log
    line every HEARTBEAT_S seconds. Raises RuntimeError naming the log on failure."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    print(f"[{index}/{total}] {step.name}: {shlex.join(step.argv[:2])} ... (log: {log_path})")
    started = time.monotonic()
    with log_path.open("w") as log:
        log.write(shlex.join(step.argv) + "\n")
        log.flush()
        proc = subprocess.Popen(step.argv, stdout=log, stderr=subprocess.STDOUT)
        while True:
            try:
                code = proc.wait(timeout=HEARTBEAT_S)
                break
            except subprocess.TimeoutExpired:
                elapsed = format_elapsed(time.monotonic() - started)
                print(f"    {elapsed}  {last_line(log_path)}", flush=True)
    elapsed = format_elapsed(time.monotonic() - started)
    if code != 0:
        tail = log_path.read_text(errors="replace").splitlines()[-20:]
        print("\n".join("    | " + ln for ln in tail), file=sys.stderr)
        raise RuntimeError(
            f"step {step.name} failed (exit {code}) after {elapsed}; log: {log_path}"
        )
    print(f"[{index}/{total}] {step.name}: done in {elapsed}")


def download_source(opts: EngineOptions, dest: Path, token: str | None) -> str:
    """Fetch the source checkpoint at a pinned commit; returns that commit sha."""
    from huggingface_hub import HfApi, snapshot_download

    sha = HfApi(token=token).model_info(opts.model, revision=opts.revision).sha
    if sha is None:  # the Hub answers every model with its commit; None only in its types
        raise RuntimeError(f"{opts.model}@{opts.revision}: the Hub gave no commit sha")
    print(f"[download] {opts.model}@{sha} -> {dest}")
    started = time.monotonic()
    snapshot_download(
        opts.model,
        revision=sha,
        local_dir=dest,
        allow_patterns=SOURCE_PATTERNS,
        ignore_patterns=SOURCE_IGNORE,
        token=token,
    )
    print(f"[download] done in {format_elapsed(time.monotonic() - started)}")
    return sha


def build_record(opts: EngineOptions, steps: list[Step] | None) -> dict:
    """Every build option, as the manifest records it."""
    record = opts.model_dump(
        mode="json",
        exclude={"output_dir", "workdir", "push", "push_revision", "private", "dry_run"},
    )
    if steps:
        record["commands"] = [shlex.join(s.argv) for s in steps]
        record["kv_cache_type"] = "paged"
        record["max_beam_width"] = 1
    return record


def build_trtllm_engine(opts: EngineOptions, facts: BuildFacts, token: str | None) -> Path:
    paths = build_paths(opts)
    steps = plan_steps(opts, paths, python=sys.executable)
    if paths.output_dir.exists() and any(paths.output_dir.iterdir()):
        raise ArtifactError(f"{paths.output_dir} is not empty: remove it or pick --output-dir")
    paths.output_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    revision = None
    if opts.checkpoint_dir is None:
        revision = download_source(opts, paths.source_dir, token)
        # The lengths could only be checked against a guess if config.json was unreachable.
        model = model_facts_from_config(json.loads((paths.source_dir / "config.json").read_text()))
        if problems := check_options(opts, model):
            raise ArtifactError("; ".join(problems))
    for i, step in enumerate(steps, 1):
        run_step(i, len(steps), step, paths.logs_dir / f"{step.name}.log")
    gpu = facts.gpus[0]
    manifest = BuildManifest(
        kind="trtllm_engine",
        source_model=opts.source_label,
        source_revision=revision,
        versions={
            "tensorrt_llm": facts.trtllm_version or "unknown",
            "tensorrt": facts.tensorrt_version or "unknown",
        },
        gpu=GpuRecord(name=gpu.name, compute_capability=gpu.compute_capability),
        build_options=build_record(opts, steps),
    )
    finish_artifact(paths.output_dir, paths.source_dir, manifest)
    print(f"engine: {paths.output_dir} in {format_elapsed(time.monotonic() - started)}")
    return paths.output_dir


# Files of a Hugging Face checkpoint that the PyTorch engine loads (tokenizer files are
# added by finish_artifact).
CHECKPOINT_FILES = ("config.json", "*.safetensors", "model.safetensors.index.json")


def build_pytorch_artifact(opts: EngineOptions, token: str | None) -> Path:
    """A Hugging Face checkpoint artifact for the PyTorch engine, with the same manifest and
    publish path as an engine. --dev: the tiny random-weight dev model `make serve` uses."""
    if opts.dev:
        from mistral_build.dev_model import build_dev_model

        return build_dev_model(opts.resolved_output_dir(), force=True)
    paths = build_paths(opts)
    if paths.output_dir.exists() and any(paths.output_dir.iterdir()):
        raise ArtifactError(f"{paths.output_dir} is not empty: remove it or pick --output-dir")
    paths.output_dir.mkdir(parents=True, exist_ok=True)
    revision = None
    if opts.checkpoint_dir is None:
        revision = download_source(opts, paths.source_dir, token)
    for pattern in CHECKPOINT_FILES:
        for src in sorted(paths.source_dir.glob(pattern)):
            shutil.copyfile(src, paths.output_dir / src.name)
    versions = {k: v for k in ("transformers", "torch") if (v := package_version(k)) is not None}
    manifest = BuildManifest(
        kind="hf_checkpoint",
        source_model=opts.source_label,
        source_revision=revision,
        versions=versions,
        build_options=build_record(opts, None),
    )
    finish_artifact(paths.output_dir, paths.source_dir, manifest)
    return paths.output_dir


def refuse(problems: list[str]) -> int:
    for line in problems:
        print(f"refused: {line}", file=sys.stderr)
    return 2


def run_engine(opts: EngineOptions) -> int:
    token = hf_token_from_env()
    download = opts.checkpoint_dir is None and not opts.dev
    facts = None
    if download and not opts.dry_run:
        # What needs no network (the options, what this machine lacks) is refused before
        # the Hub is asked for the checkpoint's config: without a network that waits on
        # retries.
        if problems := check_options(opts, None):
            return refuse(problems)
        if opts.backend == "tensorrt_llm":
            facts = gather_facts(opts)
            print(facts.driver_report().line())
            if problems := check_environment(opts, facts, None, download):
                return refuse(problems)
    said_driver = facts is not None
    model = read_model_facts(opts, token)
    problems = check_options(opts, model)
    if problems:
        return refuse(problems)
    if model is None and not opts.dev:
        print(
            f"note: {opts.source_label}: config.json not readable yet; lengths are checked "
            "after the download"
        )

    facts = facts or gather_facts(opts)
    if opts.backend == "tensorrt_llm":
        if not said_driver:
            print(("# note: " if opts.dry_run else "") + facts.driver_report().line())
        if "max_batch_size" not in opts.model_fields_set and facts.gpus:
            memory = facts.gpus[0].memory_mib
            opts.max_batch_size = default_max_batch_size(opts.gpu, memory)
            print(
                ("# note: " if opts.dry_run else "")
                + f"max_batch_size {opts.max_batch_size}: from the GPU's {memory / 1024:.0f} GiB "
                "(--max-batch-size overrides)"
            )
    env_problems = check_environment(opts, facts, model, download)
    if opts.dry_run:
        print_plan(opts, env_problems)
        return 0
    if env_problems:
        return refuse(env_problems)
    return build_and_push(opts, facts, token)


def print_plan(opts: EngineOptions, env_problems: list[str]) -> None:
    """--dry-run: the exact commands (or the artifact a pytorch build writes), and why
    this machine would refuse the build."""
    if opts.backend == "tensorrt_llm":
        paths = build_paths(opts)
        print(render_plan(opts, paths, plan_steps(opts, paths)), end="")
    else:
        print(f"# pytorch artifact ({opts.slug()}) -> {opts.resolved_output_dir()}")
    for line in env_problems:
        print(f"# note: on this machine the build would be refused: {line}")


def build_and_push(opts: EngineOptions, facts: BuildFacts, token: str | None) -> int:
    """The checked build, then the push if asked: 0, or 1 with one line on stderr."""
    try:
        if opts.backend == "tensorrt_llm":
            artifact = build_trtllm_engine(opts, facts, token)
        else:
            artifact = build_pytorch_artifact(opts, token)
        if opts.push:
            push_artifact(
                artifact, opts.push, branch=opts.push_revision, private=opts.private, token=token
            )
    except (ArtifactError, RuntimeError) as exc:
        print(f"failed: {exc}", file=sys.stderr)
        return 1
    except hub_errors() as exc:  # no network, a refused token, no such repo: one line
        print(f"failed: {hub_failure(exc)}", file=sys.stderr)
        return 1
    return 0


# ---------------------------------------------------------------------------------------
# CLI


def options_from_args(args: argparse.Namespace) -> EngineOptions:
    fields = EngineOptions.model_fields
    return EngineOptions(**{k: v for k, v in vars(args).items() if k in fields and v is not None})


def main(args: argparse.Namespace) -> int:
    try:
        opts = options_from_args(args)
    except ValidationError as exc:
        return refuse(
            [
                f"--{'.'.join(map(str, e['loc'])).replace('_', '-')}: {e['msg']}"
                for e in exc.errors()
            ]
        )
    return run_engine(opts)


def register(subparsers: argparse._SubParsersAction) -> None:
    # Kept whole: one flat list of option registrations, in the order --help shows them.
    d = EngineOptions()
    p = subparsers.add_parser(
        "engine",
        help="Compile a TensorRT-LLM 1.2.x engine, write its manifest, optionally push it.",
        description=(
            "Build a served artifact: Hugging Face checkpoint -> TensorRT-LLM engine "
            "(checkpoint conversion, then trtllm-build), tokenizer files and "
            "build_manifest.json next to it, then optionally push it to a Hugging Face repo "
            f"in one commit. Run it inside {TRTLLM_IMAGE} on a GPU of the kind the engine "
            "will serve on. HF_TOKEN (environment) is used to download and push."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    src = p.add_argument_group("source").add_mutually_exclusive_group()
    src.add_argument("--model", default=d.model, help="Hugging Face repo id of the checkpoint.")
    src.add_argument(
        "--checkpoint-dir", type=Path, help="Local Hugging Face checkpoint instead of --model."
    )
    p.add_argument("--revision", help="Branch, tag or commit of --model (pinned in the manifest).")
    p.add_argument(
        "--backend",
        choices=["tensorrt_llm", "pytorch"],
        default=d.backend,
        help="tensorrt_llm: compile an engine; pytorch: package the checkpoint as is.",
    )
    p.add_argument(
        "--dev",
        action="store_true",
        help="With --backend pytorch: the tiny random-weight dev model (what the tests and `make serve MODEL=dev-mistral` serve).",
    )
    b = p.add_argument_group("engine")
    b.add_argument(
        "--dtype",
        choices=["float16", "bfloat16"],
        help="Weights/activations (default: bfloat16 on sm80+, every --gpu we build for).",
    )
    b.add_argument(
        "--quantization",
        choices=["none", "int8_sq", "int8_wo", "int4_wo", "int4_awq", "fp8"],
        default=d.quantization,
        help="INT8 SmoothQuant (W8A8), weight-only INT8/INT4, INT4-AWQ, or FP8 (Ada/Hopper only).",
    )
    b.add_argument(
        "--smoothquant-alpha",
        type=float,
        default=d.smoothquant_alpha,
        help="With --quantization int8_sq: how much activation range moves into the weights.",
    )
    b.add_argument(
        "--kv-cache-dtype",
        choices=["auto", "int8"],
        default=d.kv_cache_dtype,
        help="auto: the model's dtype (fp8 with --quantization fp8); int8: half the KV memory.",
    )
    b.add_argument(
        "--calib-size", type=int, default=d.calib_size, help="Calibration samples (SQ/AWQ/FP8/KV)."
    )
    b.add_argument("--calib-dataset", help="Calibration dataset (name or local dir).")
    b.add_argument("--tp-size", type=int, default=d.tp_size, help="Tensor-parallel GPUs.")
    b.add_argument(
        "--max-batch-size",
        type=int,
        help="Requests per step (default: 256 on an 80 GB GPU, 128 on 40 GB, 64 below).",
    )
    b.add_argument(
        "--max-input-len", type=int, default=d.max_input_len, help="Longest prompt (tokens)."
    )
    b.add_argument(
        "--max-seq-len", type=int, default=d.max_seq_len, help="Prompt + output (tokens)."
    )
    b.add_argument(
        "--max-num-tokens",
        type=int,
        default=d.max_num_tokens,
        help="Tokens per engine step across the batch (bounds step latency and activations).",
    )
    b.add_argument(
        "--gpu", choices=sorted(TARGETS), default=d.gpu, help="GPU kind the engine will serve on."
    )
    o = p.add_argument_group("output")
    o.add_argument(
        "--output-dir", type=Path, help="Artifact directory (default: build/artifacts/<name>)."
    )
    o.add_argument(
        "--workdir",
        type=Path,
        help="Downloads, converted checkpoint, logs (default: <output>.work).",
    )
    o.add_argument(
        "--examples-dir",
        default=d.examples_dir,
        help="TensorRT-LLM examples (conversion scripts) in the release image.",
    )
    o.add_argument("--dry-run", action="store_true", help="Print the exact commands and exit.")
    h = p.add_argument_group("publish")
    h.add_argument("--push", metavar="REPO", help="Hugging Face repo id to push the artifact to.")
    h.add_argument(
        "--push-revision", default=d.push_revision, metavar="BRANCH", help="Branch to commit to."
    )
    h.add_argument(
        "--private",
        action=argparse.BooleanOptionalAction,
        default=d.private,
        help="Create the repo private (if it does not exist).",
    )
    p.set_defaults(func=main)
