"""The NVIDIA driver against the image's CUDA, checked before anything touches the GPU.

The TensorRT-LLM 1.2 release image is CUDA 13.0. A CUDA 13.x runtime runs on a driver of
its own branch or newer (NVIDIA's CUDA compatibility guide, minor version compatibility:
CUDA 13.x needs >= 580.65.06, the 13.0 GA driver; CUDA 12.x needs >= 525.60.13); on an
older driver the first CUDA call fails deep inside torch or TensorRT with an error that
does not name the driver. So the launcher (`server.py`) and `build.py engine` log the
driver against the image's CUDA at start and refuse, with one line, when it is too old.

Nothing here creates a CUDA context or imports torch: the driver version is read from
`/proc/driver/nvidia/version` (the kernel module's, what `nvidia-smi` reports), else from
NVML (`nvmlSystemGetDriverVersion` through libnvidia-ml, no context either); the image's
CUDA from the toolkit's `version.json`, else the `CUDA_VERSION` variable NGC images set.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

PROC_VERSION = Path("/proc/driver/nvidia/version")
CUDA_VERSION_JSON = Path("/usr/local/cuda/version.json")

# The oldest driver each CUDA major runs on (minor version compatibility; the GA driver
# of the major's first release). A newer minor may want a newer driver for features
# that JIT-compile PTX; the floor is what any of its releases needs.
MIN_DRIVER: dict[int, str] = {12: "525.60.13", 13: "580.65.06"}

_PROC_RE = re.compile(r"Kernel Module(?: for [^ ]+)?\s+(\d+\.\d+(?:\.\d+)?)")
_VERSION_RE = re.compile(r"^\d+(\.\d+)*$")


def _numbers(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("."))


def parse_proc_version(text: str) -> str | None:
    """`NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.65.06  Sun Jul 27 ...` -> 580.65.06."""
    match = _PROC_RE.search(text)
    return match.group(1) if match else None


def _nvml_driver_version() -> str | None:
    """NVML's driver version, or None where libnvidia-ml is missing or fails."""
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return None
    try:
        if nvml.nvmlInit_v2() != 0:
            return None
        try:
            buf = ctypes.create_string_buffer(96)
            if nvml.nvmlSystemGetDriverVersion(buf, ctypes.c_uint(len(buf))) != 0:
                return None
            return buf.value.decode(errors="replace") or None
        finally:
            nvml.nvmlShutdown()
    except (AttributeError, OSError):
        return None


def driver_version(
    proc_path: Path | None = None, nvml: Callable[[], str | None] | None = None
) -> str | None:
    """The loaded NVIDIA driver's version; None on a machine without one."""
    try:
        found = parse_proc_version((proc_path or PROC_VERSION).read_text(errors="replace"))
    except OSError:
        found = None
    if found is None:
        found = (nvml or _nvml_driver_version)()
    return found if found and _VERSION_RE.match(found) else None


def image_cuda_version(
    version_json: Path | None = None, env: Mapping[str, str] | None = None
) -> str | None:
    """The CUDA toolkit this image ships, as `major.minor`; None where there is none."""
    env = os.environ if env is None else env
    raw: str | None = None
    try:
        raw = str(json.loads((version_json or CUDA_VERSION_JSON).read_text())["cuda"]["version"])
    except (OSError, ValueError, KeyError, TypeError):
        raw = env.get("CUDA_VERSION")
    if not raw:
        return None
    parts = raw.strip().split(".")
    if len(parts) < 2 or not all(p.isdigit() for p in parts[:2]):
        return None
    return f"{int(parts[0])}.{int(parts[1])}"


@dataclass(frozen=True)
class DriverReport:
    driver: str | None
    cuda: str | None
    minimum: str | None

    @property
    def too_old(self) -> bool:
        if self.driver is None or self.minimum is None:
            return False
        return _numbers(self.driver) < _numbers(self.minimum)

    def line(self) -> str:
        if self.driver is None:
            return f"NVIDIA driver: none found (image CUDA {self.cuda or 'none'})"
        if self.cuda is None:
            return f"NVIDIA driver {self.driver} (this image has no CUDA toolkit)"
        need = f", needs >= {self.minimum}" if self.minimum else ""
        verdict = "too old" if self.too_old else "ok"
        return f"NVIDIA driver {self.driver}, image CUDA {self.cuda}{need}: {verdict}"

    def refusal(self) -> str:
        major = (self.cuda or "").split(".")[0]
        return (
            f"NVIDIA driver {self.driver} is too old for this image's CUDA {self.cuda} "
            f"(needs >= {self.minimum}, the R{self.minimum[:3] if self.minimum else '?'} "
            f"branch or newer): run on nodes with a CUDA {major}-capable driver "
            "(GKE: a node pool with gpu-driver-version=latest; docs/deploy.md)"
        )


def check(
    proc_path: Path | None = None,
    version_json: Path | None = None,
    env: Mapping[str, str] | None = None,
    nvml: Callable[[], str | None] | None = None,
) -> DriverReport:
    """What is installed, and the minimum the image's CUDA needs (no refusal here)."""
    cuda = image_cuda_version(version_json, env)
    minimum = MIN_DRIVER.get(int(cuda.split(".")[0])) if cuda else None
    return DriverReport(driver_version(proc_path, nvml), cuda, minimum)


def startup_refusal(
    mode: str = "refuse", stream: TextIO | None = None, **kwargs: object
) -> str | None:
    """At start: write the driver against the image's CUDA (one line, stderr: logging is
    not set up yet), and return the refusal when the driver is too old and `mode` is
    `refuse` (`warn`: say so and go on, e.g. with CUDA forward compatibility set up by
    hand). None: start."""
    stream = sys.stderr if stream is None else stream
    report = check(**kwargs)  # type: ignore[arg-type]
    print(report.line(), file=stream, flush=True)
    if not report.too_old:
        return None
    if mode == "refuse":
        return report.refusal()
    print(f"{report.refusal()} (driver_check=warn: starting anyway)", file=stream, flush=True)
    return None
