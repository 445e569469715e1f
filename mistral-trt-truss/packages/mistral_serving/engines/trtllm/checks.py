"""Checks on a TensorRT-LLM engine directory, run BEFORE the engine starts.

An engine that does not fit the machine fails late and obscurely (a C++ deserialization
error minutes into a cold start, or a hang waiting for MPI ranks). Each check here reads
value (config.json as `load_artifact` parsed it, the build manifest) and compares plain
values, so it is fast, testable without a GPU, and raises `EngineCheckError` (an
`ArtifactError`) with one line: what was found, what was expected, what to do.

Engine directory layout (TensorRT-LLM `tensorrt_llm/builder.py`, `Engine.save` and
`EngineConfig.to_dict`): `config.json` = {"version", "pretrained_config", "build_config"}
and one `rank{N}.engine` per rank; `pretrained_config.mapping` holds world_size/tp_size/
pp_size (`tensorrt_llm/models/modeling_utils.py`, `PretrainedConfig.to_dict`). The LLM API
calls a directory an engine when its config.json has both `pretrained_config` and
`build_config` (`tensorrt_llm/llmapi/llm_args.py`, `get_model_format`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mistral_serving.artifacts.manifest import (
    CONFIG_NAME,
    ArtifactError,
    parse_json_object,
    read_json_file,
    shown,
)
from mistral_serving.engines.base import EngineLimits

REBUILD_HINT = "rebuild it with `python build.py engine` on this GPU kind and image"


class EngineCheckError(ArtifactError):
    """The engine directory cannot serve here; the message is one actionable line."""


@dataclass(frozen=True)
class GpuInfo:
    name: str  # of device 0, e.g. "NVIDIA A100-SXM4-40GB"
    capability: str  # "8.0" (A100), "9.0" (H100/H200)
    count: int  # visible devices


def detect_gpu() -> GpuInfo | None:
    """The GPUs this process may use; None on a CPU-only machine.

    Read through NVML (`pynvml`, from nvidia-ml-py, which TensorRT-LLM requires), which
    creates no CUDA context: a context in this process (~0.5 GiB on an H200, see
    docs/tensorrt-llm.md) is memory the executor cannot size its KV cache from.
    torch.cuda only where NVML is absent.
    """
    try:
        import pynvml
    except ImportError:
        return _detect_gpu_torch()
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None  # no driver: no GPU
    try:
        handles = _visible_handles(pynvml)
        if not handles:
            return None
        name = pynvml.nvmlDeviceGetName(handles[0])
        major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handles[0])
    except pynvml.NVMLError:  # e.g. a MIG instance NVML cannot describe: ask CUDA
        return _detect_gpu_torch()
    finally:
        pynvml.nvmlShutdown()
    if isinstance(name, bytes):  # older nvidia-ml-py returned bytes
        name = name.decode()
    return GpuInfo(name=name, capability=f"{major}.{minor}", count=len(handles))


def _visible_handles(pynvml: Any) -> list[Any]:
    """NVML handles of the devices CUDA_VISIBLE_DEVICES leaves visible, in its order (NVML
    itself ignores the variable). As CUDA does, the list ends at the first entry that names
    no device."""
    count = pynvml.nvmlDeviceGetCount()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
    handles = []
    for entry in (e.strip() for e in visible.split(",")):
        if entry.isascii() and entry.isdigit() and int(entry) < count:  # not '¹' or '٣'
            handles.append(pynvml.nvmlDeviceGetHandleByIndex(int(entry)))
        elif entry.startswith(("GPU-", "MIG-")):
            try:
                handles.append(pynvml.nvmlDeviceGetHandleByUUID(entry))
            except pynvml.NVMLError:
                break
        else:
            break
    return handles


def _detect_gpu_torch() -> GpuInfo | None:
    """detect_gpu without NVML, via torch.cuda (creates a CUDA context in this process)."""
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


def check_engine_config(config: dict[str, Any], where: str) -> dict[str, Any]:
    for section in ("pretrained_config", "build_config"):
        if not isinstance(config.get(section), dict):
            raise EngineCheckError(
                f"{where}: no `{section}` section, so this is not an engine config (a "
                f"checkpoint's config.json?); build an engine with `python build.py engine`"
            )
    return config


def read_engine_config(engine_dir: Path) -> dict[str, Any]:
    """config.json of an engine, with the sections the runtime needs. Prefer the config
    `load_artifact` already parsed (`Artifact.config`) where the caller has it."""
    path = Path(engine_dir) / CONFIG_NAME
    if not path.is_file():
        raise EngineCheckError(
            f"{path}: missing; expected a TensorRT-LLM engine directory (config.json + "
            f"rank*.engine): point `artifact` at the `trtllm-build --output_dir` folder"
        )
    config = parse_json_object(read_json_file(path, "config.json"), str(path))
    return check_engine_config(config, str(path))


def world_size(config: dict[str, Any]) -> int:
    """Ranks the engine was built for (one GPU and one rank{N}.engine each)."""
    mapping = config["pretrained_config"].get("mapping") or {}
    try:
        if "world_size" in mapping:
            size = int(mapping["world_size"])
        else:
            size = int(mapping.get("tp_size", 1)) * int(mapping.get("pp_size", 1))
    except (AttributeError, TypeError, ValueError, OverflowError):
        size = 0
    if not 1 <= size <= 4096:
        raise EngineCheckError(
            f"{CONFIG_NAME}: pretrained_config.mapping '{shown(mapping, 80)}' gives no valid "
            f"world size; {REBUILD_HINT}"
        )
    return size


def _positive_int(build: dict[str, Any], key: str, default: int | None = None) -> int:
    value = build.get(key) or default
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise EngineCheckError(
            f"{CONFIG_NAME}: build_config lacks a valid {key} (found '{shown(value, 40)}'); "
            f"{REBUILD_HINT}"
        )
    return value


def limits_from_config(config: dict[str, Any]) -> EngineLimits:
    build = config["build_config"]
    max_seq_len = _positive_int(build, "max_seq_len")
    # Builds with remove_input_padding + context FMHA may leave max_input_len unset;
    # the builder clips it to max_seq_len (`builder.py`, `_init_max_seq_len`).
    max_input_len = _positive_int(build, "max_input_len", max_seq_len)
    return EngineLimits(
        max_input_len=min(max_input_len, max_seq_len),
        max_seq_len=max_seq_len,
        max_batch_size=_positive_int(build, "max_batch_size"),
    )


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
    built = shown(config.get("version") or "", 60).strip()
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
    if built != str(installed).strip():
        raise EngineCheckError(
            f"engine built with TensorRT-LLM {built}, but {installed} is installed; serve it "
            f"from the {built} image, or {REBUILD_HINT}"
        )


# The last TensorRT-LLM line that builds or runs TensorRT engines: upstream removed the
# TensorRT-engine backend (trtllm-build, BuildConfig, `_tensorrt_engine.LLM`) in June-July
# 2026; the 1.3 (rc) lines and later are PyTorch-backend only.
LAST_ENGINE_LINE = (1, 2)


def release_line(version: str) -> tuple[int, int] | None:
    """(major, minor) of a version string ("1.3.0rc14" -> (1, 3)); None if unreadable."""
    parts = version.strip().lstrip("v").split(".")
    try:
        return int(parts[0]), int("".join(c for c in parts[1] if c.isdigit()) or "x")
    except (IndexError, ValueError):
        return None


def check_engine_runtime(installed: str) -> None:
    """An engine directory cannot be served by a TensorRT-LLM without the TensorRT backend."""
    line = release_line(installed)
    if line is not None and line > LAST_ENGINE_LINE:
        raise EngineCheckError(
            f"TensorRT-LLM {shown(installed, 40)} serves no TensorRT engines (the engine backend "
            "ends with 1.2.x): serve the Hugging Face checkpoint with engine=trtllm_pytorch, "
            "or this engine from the TensorRT-LLM 1.2.1 release image"
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
            f"engine built for compute capability {shown(built_capability, 20)}, but this GPU "
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
    if vocab is not None and (not isinstance(vocab, int) or tokenizer_vocab_size > vocab):
        raise EngineCheckError(
            f"tokenizer has {tokenizer_vocab_size} tokens but the engine's vocab_size is "
            f"{shown(vocab, 40)}; ship the tokenizer of the checkpoint the engine was built from"
        )


def check_engine(
    engine_dir: Path,
    config: dict[str, Any],
    built_capability: str | None,
    *,
    installed_version: str | None,
    gpu: GpuInfo | None,
    max_input_len: int | None = None,
    max_seq_len: int | None = None,
    tokenizer_vocab_size: int | None = None,
) -> EngineLimits:
    """Run every check on an engine whose config.json is `config` and whose build manifest
    records `built_capability` (None: no manifest), cheapest first; return its built limits."""
    check_engine_config(config, str(Path(engine_dir) / CONFIG_NAME))
    check_rank_files(engine_dir, config)
    check_version(config, installed_version)
    check_gpu_arch(built_capability, gpu)
    assert gpu is not None  # check_gpu_arch raised otherwise
    check_world_size(config, gpu.count)
    limits = limits_from_config(config)
    check_limits(limits, max_input_len, max_seq_len)
    if tokenizer_vocab_size is not None:
        check_vocab(config, tokenizer_vocab_size)
    return limits
