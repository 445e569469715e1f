"""Checks on a TensorRT-LLM engine directory, run BEFORE the engine starts.

An engine that does not fit the machine fails late and obscurely (a C++ deserialization
error minutes into a cold start, or a hang waiting for MPI ranks). Each check here reads
files and compares plain values, so it is fast, testable without a GPU, and raises
`EngineCheckError` with one line: what was found, what was expected, what to do.

Engine directory layout (TensorRT-LLM `tensorrt_llm/builder.py`, `Engine.save` and
`EngineConfig.to_dict`): `config.json` = {"version", "pretrained_config", "build_config"}
and one `rank{N}.engine` per rank; `pretrained_config.mapping` holds world_size/tp_size/
pp_size (`tensorrt_llm/models/modeling_utils.py`, `PretrainedConfig.to_dict`). The LLM API
calls a directory an engine when its config.json has both `pretrained_config` and
`build_config` (`tensorrt_llm/llmapi/llm_args.py`, `get_model_format`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mistral_serving.engines.base import EngineLimits
from mistral_serving.manifest import read_manifest

CONFIG_NAME = "config.json"
REBUILD_HINT = "rebuild it with `python build.py engine` on this GPU kind and image"


class EngineCheckError(ValueError):
    """The engine directory cannot serve here; the message is one actionable line."""


@dataclass(frozen=True)
class GpuInfo:
    name: str  # of device 0, e.g. "NVIDIA A100-SXM4-40GB"
    capability: str  # "8.0" (A100), "9.0" (H100/H200)
    count: int  # visible devices


def detect_gpu() -> GpuInfo | None:
    """The GPUs this process sees, via torch.cuda; None on a CPU-only machine."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        return None
    major, minor = torch.cuda.get_device_capability(0)
    return GpuInfo(
        name=torch.cuda.get_device_name(0),
        capability=f"{major}.{minor}",
        count=torch.cuda.device_count(),
    )


def read_engine_config(engine_dir: Path) -> dict[str, Any]:
    """config.json of an engine, with the sections the runtime needs."""
    path = Path(engine_dir) / CONFIG_NAME
    if not path.is_file():
        raise EngineCheckError(
            f"{path}: missing; expected a TensorRT-LLM engine directory (config.json + "
            f"rank*.engine): point `artifact` at the `trtllm-build --output_dir` folder"
        )
    try:
        config = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise EngineCheckError(
            f"{path}: not valid JSON ({exc}); re-download the artifact or {REBUILD_HINT}"
        ) from None
    if not isinstance(config, dict):
        raise EngineCheckError(f"{path}: expected a JSON object; {REBUILD_HINT}")
    for section in ("pretrained_config", "build_config"):
        if not isinstance(config.get(section), dict):
            raise EngineCheckError(
                f"{path}: no `{section}` section, so this is not an engine config (a "
                f"checkpoint's config.json?); build an engine with `python build.py engine`"
            )
    return config


def world_size(config: dict[str, Any]) -> int:
    """Ranks the engine was built for (one GPU and one rank{N}.engine each)."""
    mapping = config["pretrained_config"].get("mapping") or {}
    if "world_size" in mapping:
        return int(mapping["world_size"])
    return int(mapping.get("tp_size", 1)) * int(mapping.get("pp_size", 1))


def limits_from_config(config: dict[str, Any]) -> EngineLimits:
    build = config["build_config"]
    try:
        max_seq_len = int(build["max_seq_len"])
        # Builds with remove_input_padding + context FMHA may leave max_input_len unset;
        # the builder clips it to max_seq_len (`builder.py`, `_init_max_seq_len`).
        max_input_len = int(build.get("max_input_len") or max_seq_len)
        max_batch_size = int(build["max_batch_size"])
    except (KeyError, TypeError, ValueError) as exc:
        raise EngineCheckError(
            f"{CONFIG_NAME}: build_config lacks a valid {exc}; {REBUILD_HINT}"
        ) from None
    return EngineLimits(
        max_input_len=min(max_input_len, max_seq_len),
        max_seq_len=max_seq_len,
        max_batch_size=max_batch_size,
    )


def read_engine_limits(engine_dir: Path) -> EngineLimits:
    return limits_from_config(read_engine_config(engine_dir))


def is_engine_dir(path: Path) -> bool:
    """True for a directory with an engine config.json and at least one rank*.engine."""
    path = Path(path)
    if not path.is_dir() or not any(path.glob("rank*.engine")):
        return False
    try:
        read_engine_config(path)
    except EngineCheckError:
        return False
    return True


def check_rank_files(engine_dir: Path, config: dict[str, Any]) -> None:
    size = world_size(config)
    for rank in range(size):
        path = Path(engine_dir) / f"rank{rank}.engine"
        if not path.is_file():
            raise EngineCheckError(
                f"{path}: missing; the engine was built for {size} rank(s) and needs "
                f"rank0..rank{size - 1}.engine: re-download the artifact completely"
            )
        if path.stat().st_size == 0:
            raise EngineCheckError(f"{path}: empty file (interrupted download?); re-download it")


def check_version(config: dict[str, Any], installed: str | None) -> None:
    """An engine runs only with the TensorRT-LLM (and TensorRT) it was built with."""
    built = config.get("version")
    if installed is None:
        raise EngineCheckError(
            "tensorrt_llm is not installed in this image; expected the TensorRT-LLM "
            f"{built or '(unknown)'} release image the engine was built with"
        )
    if not built:
        raise EngineCheckError(
            f"{CONFIG_NAME} has no `version`, so the builder's TensorRT-LLM is unknown "
            f"(installed: {installed}); {REBUILD_HINT}"
        )
    if str(built).strip() != str(installed).strip():
        raise EngineCheckError(
            f"engine built with TensorRT-LLM {built}, but {installed} is installed; serve it "
            f"from the {built} image, or {REBUILD_HINT}"
        )


def check_gpu_arch(built_capability: str | None, gpu: GpuInfo | None) -> None:
    """An engine runs only on the GPU architecture (compute capability) it was built on.
    `built_capability` comes from the build manifest; None (no manifest) skips the check."""
    if gpu is None:
        raise EngineCheckError(
            "no CUDA GPU is visible; a TensorRT-LLM engine needs one: schedule the pod on a "
            "GPU node (nvidia.com/gpu limit) or serve a Hugging Face checkpoint with "
            "engine=pytorch"
        )
    if built_capability is None:
        return
    if built_capability.strip() != gpu.capability:
        raise EngineCheckError(
            f"engine built for compute capability {built_capability}, but this GPU "
            f"({gpu.name}) is {gpu.capability}; serve it on the GPU kind it was built on, "
            f"or {REBUILD_HINT}"
        )


def check_world_size(config: dict[str, Any], gpu_count: int) -> None:
    size = world_size(config)
    if size > gpu_count:
        raise EngineCheckError(
            f"engine built for {size} GPUs (tensor/pipeline parallel), but {gpu_count} "
            f"visible; request {size} GPUs (nvidia.com/gpu: {size}) or rebuild with "
            f"--tp_size {max(gpu_count, 1)}"
        )


def check_limits(
    limits: EngineLimits, max_input_len: int | None = None, max_seq_len: int | None = None
) -> None:
    """Settings may lower the engine's limits, never raise them (they are compiled in)."""
    if max_input_len is not None and max_input_len > limits.max_input_len:
        raise EngineCheckError(
            f"setting max_input_len={max_input_len} is above the engine's built "
            f"max_input_len {limits.max_input_len}; lower the setting or rebuild with "
            f"--max_input_len {max_input_len}"
        )
    if max_seq_len is not None and max_seq_len > limits.max_seq_len:
        raise EngineCheckError(
            f"setting max_seq_len={max_seq_len} is above the engine's built max_seq_len "
            f"{limits.max_seq_len}; lower the setting or rebuild with --max_seq_len {max_seq_len}"
        )


def check_vocab(config: dict[str, Any], tokenizer_vocab_size: int) -> None:
    """A tokenizer larger than the engine's vocabulary yields ids the engine cannot embed."""
    vocab = config["pretrained_config"].get("vocab_size")
    if vocab is not None and tokenizer_vocab_size > int(vocab):
        raise EngineCheckError(
            f"tokenizer has {tokenizer_vocab_size} tokens but the engine's vocab_size is "
            f"{vocab}; ship the tokenizer of the checkpoint the engine was built from"
        )


def check_engine_dir(
    engine_dir: Path,
    *,
    installed_version: str | None,
    gpu: GpuInfo | None,
    max_input_len: int | None = None,
    max_seq_len: int | None = None,
    tokenizer_vocab_size: int | None = None,
) -> EngineLimits:
    """Run every check, cheapest first; return the engine's built limits."""
    engine_dir = Path(engine_dir)
    config = read_engine_config(engine_dir)
    check_rank_files(engine_dir, config)
    check_version(config, installed_version)
    manifest = read_manifest(engine_dir)
    built_capability = manifest.gpu.compute_capability if manifest and manifest.gpu else None
    check_gpu_arch(built_capability, gpu)
    assert gpu is not None  # check_gpu_arch raised otherwise
    check_world_size(config, gpu.count)
    limits = limits_from_config(config)
    check_limits(limits, max_input_len, max_seq_len)
    if tokenizer_vocab_size is not None:
        check_vocab(config, tokenizer_vocab_size)
    return limits
