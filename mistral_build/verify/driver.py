"""The GPU environment, before any server: the NVIDIA driver against the image's CUDA (a
driver too old for it breaks everything after), then `import tensorrt_llm` on this GPU
(the image build cannot import it: no driver there, so it only reads its metadata)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from mistral_build.release import TRTLLM_VERSION
from mistral_build.verify import report
from mistral_build.verify.results import CheckFailed, CheckWarned
from mistral_serving.ops import driver

# CUDA toolkit (major, minor) -> the Linux x86_64 driver its release needs (CUDA Toolkit
# release notes, "CUDA Toolkit and Corresponding Driver Versions", the GA releases).
CUDA_TOOLKIT_DRIVER: dict[tuple[int, int], str] = {
    (12, 0): "525.60.13",
    (12, 1): "530.30.02",
    (12, 2): "535.54.03",
    (12, 3): "545.23.06",
    (12, 4): "550.54.14",
    (12, 5): "555.42.02",
    (12, 6): "560.28.03",
    (12, 8): "570.26",
    (12, 9): "575.51.03",
    (13, 0): "580.65.06",
}
# The oldest driver of each CUDA major (minor version compatibility: a toolkit of that major
# runs, with a limited feature set, e.g. no JIT of newer PTX): the server's own table, so
# the launcher's refusal and this check cannot disagree.
CUDA_MAJOR_DRIVER: dict[int, str] = driver.MIN_DRIVER
COMPAT_LIBS = Path("/usr/local/cuda/compat")


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split(".") if p.isdigit())


def driver_from_proc(text: str) -> str | None:
    """The kernel module's version from /proc/driver/nvidia/version ("NVRM version: NVIDIA
    UNIX x86_64 Kernel Module  580.65.06  Sun Jul 27 ..."); None if absent. The server's
    parser (mistral_serving.ops.driver), so both read the same version."""
    return driver.parse_proc_version(text)


def judge_driver(driver: str | None, cuda: str | None, forward_compat: bool) -> str:
    """PASS: the driver is at least what the image's CUDA release needs. WARN: minor
    version compatibility (same major, older driver), the forward-compatibility package,
    or a version unknown. FAIL: a driver too old for the image's CUDA major."""
    if not driver or not cuda:
        raise CheckWarned(f"not checked: driver {driver or 'unknown'}, CUDA {cuda or 'unknown'}")
    have = _version_tuple(driver)
    cuda_t = _version_tuple(cuda)
    if len(cuda_t) < 2 or not have:
        raise CheckWarned(f"not checked: cannot read driver {driver!r} or CUDA {cuda!r}")
    major, minor = cuda_t[0], cuda_t[1]
    known = [mm for mm in CUDA_TOOLKIT_DRIVER if mm[0] == major and mm <= (major, minor)]
    if major not in CUDA_MAJOR_DRIVER or not known:
        raise CheckWarned(f"not checked: CUDA {cuda} is not in the driver table (driver {driver})")
    wants = CUDA_TOOLKIT_DRIVER[max(known)]
    floor = CUDA_MAJOR_DRIVER[major]
    what = f"driver {driver}, image CUDA {cuda} (its release needs >= {wants})"
    if have >= _version_tuple(wants):
        return what
    if have >= _version_tuple(floor):
        raise CheckWarned(
            f"{what}: runs by CUDA minor version compatibility (>= {floor}), with a limited "
            "feature set (no JIT of newer PTX); upgrade the driver for the full toolkit"
        )
    if forward_compat:
        raise CheckWarned(
            f"{what}: below CUDA {major}'s minimum {floor}; the image's forward-compatibility "
            f"libraries ({COMPAT_LIBS}) may bridge it on a datacenter GPU with a supported "
            "driver branch: watch for CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE"
        )
    raise CheckFailed(
        f"{what}: below CUDA {major}'s minimum driver {floor} and no forward-compatibility "
        f"libraries in {COMPAT_LIBS}: CUDA will not initialise (upgrade the node's driver, "
        "e.g. a newer GKE node image / driver version)"
    )


def image_cuda_version() -> str | None:
    """The image's CUDA: NVIDIA images set CUDA_VERSION; else torch's build."""
    if os.environ.get("CUDA_VERSION"):
        return os.environ["CUDA_VERSION"]
    try:
        import torch

        version: str | None = torch.version.cuda
        return version
    except Exception:  # no torch: unknown
        return None


def node_driver_version() -> str | None:
    """/proc/driver/nvidia/version (the kernel module), else nvidia-smi's driver_version."""
    try:
        found = driver_from_proc(Path("/proc/driver/nvidia/version").read_text())
    except OSError:
        found = None
    if found:
        return found
    gpus = report.gpu_facts()
    return gpus[0]["driver_version"] if isinstance(gpus, list) and gpus else None


def check_driver_vs_cuda() -> str:
    forward = COMPAT_LIBS.is_dir() and any(COMPAT_LIBS.glob("libcuda.so*"))
    return judge_driver(node_driver_version(), image_cuda_version(), forward)


def check_trtllm_import() -> str:
    """`import tensorrt_llm` in a fresh interpreter: it loads the CUDA bindings, which only a
    machine with the driver can; WARN where the version is not the image's pinned release."""
    probe = subprocess.run(
        [sys.executable, "-c", "import tensorrt_llm; print(tensorrt_llm.__version__)"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if probe.returncode != 0:
        lines = (probe.stderr or probe.stdout).strip().splitlines()
        raise CheckFailed(
            f"import tensorrt_llm failed here: {lines[-1] if lines else probe.returncode}"
        )
    lines = probe.stdout.strip().splitlines()
    version = lines[-1].strip() if lines else "unknown"
    if version != TRTLLM_VERSION:
        raise CheckWarned(
            f"tensorrt_llm {version} imports; the image and the engines are built for "
            f"{TRTLLM_VERSION}"
        )
    return f"tensorrt_llm {version} imports on this GPU (the image build only read its metadata)"
