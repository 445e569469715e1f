"""GPUs: what the build targets and what this machine has.

A TensorRT engine runs only on the GPU architecture (compute capability) it was built on,
so the build is told its target and checks that the GPU it runs on is of that kind.
"""

from __future__ import annotations

import shutil
import subprocess

from pydantic import BaseModel


class GpuTarget(BaseModel):
    name: str  # what nvidia-smi reports contains this, e.g. "A100"
    compute_capability: str  # "8.0"


# Targets we build for; compute capabilities from NVIDIA's CUDA GPU table.
TARGETS: dict[str, GpuTarget] = {
    "a100": GpuTarget(name="A100", compute_capability="8.0"),
    "l4": GpuTarget(name="L4", compute_capability="8.9"),
    "h100": GpuTarget(name="H100", compute_capability="9.0"),
    "h200": GpuTarget(name="H200", compute_capability="9.0"),
}

# FP8 tensor cores arrived with Ada (8.9) and Hopper (9.0); Ampere (A100, 8.0) has none.
FP8_MIN_CAPABILITY = (8, 9)


class BuildGpu(BaseModel):
    name: str  # "NVIDIA A100-SXM4-80GB"
    compute_capability: str  # "8.0"
    memory_mib: int = 0


def capability_tuple(cc: str) -> tuple[int, int]:
    major, _, minor = cc.partition(".")
    return int(major), int(minor or 0)


def supports_fp8(cc: str) -> bool:
    return capability_tuple(cc) >= FP8_MIN_CAPABILITY


def matches_target(gpu: BuildGpu, target: str) -> bool:
    """True when the GPU is of the target's kind: same name family and architecture."""
    t = TARGETS[target]
    return t.name.lower() in gpu.name.lower() and gpu.compute_capability == t.compute_capability


def parse_nvidia_smi(text: str) -> list[BuildGpu]:
    """Parse `nvidia-smi --query-gpu=name,compute_cap,memory.total --format=csv,noheader,nounits`."""
    gpus = []
    for line in text.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 2 and parts[0]:
            memory = int(parts[2]) if len(parts) > 2 and parts[2].isdigit() else 0
            gpus.append(BuildGpu(name=parts[0], compute_capability=parts[1], memory_mib=memory))
    return gpus


def detect_gpus() -> list[BuildGpu]:
    """GPUs on this machine, from nvidia-smi (no CUDA library needed); [] when there are none."""
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(
            [
                "nvidia-smi",
                "--query-gpu=name,compute_cap,memory.total",
                "--format=csv,noheader,nounits",
            ],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return parse_nvidia_smi(out)
