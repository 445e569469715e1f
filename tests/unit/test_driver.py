"""mistral_serving.ops.driver: the NVIDIA driver against the image's CUDA, from fake /proc and
CUDA toolkit files (what the kernel module and NGC's images write), and the launcher's
refusal of a driver that is too old."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mistral_build.paths import TRUSS_DIR
from mistral_serving.ops import driver

PACKAGES = TRUSS_DIR / "packages"

# /proc/driver/nvidia/version as the R580 and R550 kernel modules write it.
PROC_580 = (
    "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build  "
    "(dvs-builder@U22-I3-AF03-09-1)  Tue Sep 23 09:33:18 UTC 2025\n"
    "GCC version:  gcc version 12.2.0 (Ubuntu 12.2.0-14ubuntu2)\n"
)
PROC_550 = (
    "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.90.07  Fri May 31 09:35:42 UTC 2024\n"
    "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n"
)
# What the lent H200 machine has (read there: /proc/driver/nvidia/version, no
# /usr/local/cuda/version.json, CUDA_VERSION=13.0.2; NVML said 580.159.04 too).
PROC_H200 = (
    "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  "
    "(nixbld@)  \nGCC version:  gcc version 15.3.0 (GCC) \n"
)
# /usr/local/cuda/version.json of a CUDA 13.0 toolkit (abridged).
CUDA_13 = {"cuda": {"name": "CUDA SDK", "version": "13.0.2"}, "cuda_cudart": {"version": "13.0.96"}}


def no_nvml() -> None:
    return None


@pytest.fixture
def fake(tmp_path: Path):
    calls = iter(range(1000))

    def make(proc: str | None, cuda: dict | None) -> dict:
        folder = tmp_path / str(next(calls))
        folder.mkdir()
        proc_path, json_path = folder / "version", folder / "version.json"
        if proc is not None:
            proc_path.write_text(proc)
        if cuda is not None:
            json_path.write_text(json.dumps(cuda))
        return {"proc_path": proc_path, "version_json": json_path, "env": {}, "nvml": no_nvml}

    return make


def test_both_kernel_module_spellings_are_read() -> None:
    assert driver.parse_proc_version(PROC_580) == "580.95.05"
    assert driver.parse_proc_version(PROC_550) == "550.90.07"
    assert driver.parse_proc_version("garbage") is None


def test_the_h200_machines_driver_and_cuda_variable_pass(fake) -> None:
    args = fake(PROC_H200, None) | {"env": {"CUDA_VERSION": "13.0.2"}}
    report = driver.check(**args)
    assert report.line() == "NVIDIA driver 580.159.04, image CUDA 13.0, needs >= 580.65.06: ok"


def test_an_r550_driver_is_refused_for_cuda_13_in_one_line(fake) -> None:
    report = driver.check(**fake(PROC_550, CUDA_13))
    assert (report.driver, report.cuda, report.minimum) == ("550.90.07", "13.0", "580.65.06")
    assert report.too_old
    out = io.StringIO()
    refusal = driver.startup_refusal("refuse", stream=out, **fake(PROC_550, CUDA_13))
    assert refusal is not None and "\n" not in refusal
    assert refusal.startswith("NVIDIA driver 550.90.07 is too old for this image's CUDA 13.0")
    assert "needs >= 580.65.06" in refusal and "gpu-driver-version=latest" in refusal
    assert (
        out.getvalue() == "NVIDIA driver 550.90.07, image CUDA 13.0, needs >= 580.65.06: too old\n"
    )


def test_an_r580_driver_starts_and_the_line_says_so(fake) -> None:
    out = io.StringIO()
    assert driver.startup_refusal("refuse", stream=out, **fake(PROC_580, CUDA_13)) is None
    assert out.getvalue() == "NVIDIA driver 580.95.05, image CUDA 13.0, needs >= 580.65.06: ok\n"


def test_the_minimum_itself_is_enough_and_versions_compare_as_numbers(fake) -> None:
    proc = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.65.06  Sun Jul 27 2025\n"
    assert not driver.check(**fake(proc, CUDA_13)).too_old
    proc = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.9.1  Sun Jul 27 2025\n"
    assert driver.check(**fake(proc, CUDA_13)).too_old  # 9 < 65, not "9" > "6"


def test_warn_mode_starts_on_an_old_driver_and_says_why(fake) -> None:
    out = io.StringIO()
    assert driver.startup_refusal("warn", stream=out, **fake(PROC_550, CUDA_13)) is None
    assert "too old" in out.getvalue() and "driver_check=warn: starting anyway" in out.getvalue()


def test_no_driver_or_no_cuda_is_not_refused(fake) -> None:
    out = io.StringIO()
    assert driver.startup_refusal("refuse", stream=out, **fake(None, CUDA_13)) is None
    assert out.getvalue() == "NVIDIA driver: none found (image CUDA 13.0)\n"
    report = driver.check(**fake(PROC_550, None))  # the CPU dev venv: no toolkit
    assert report.cuda is None and not report.too_old


def test_nvml_is_asked_when_proc_has_nothing(fake) -> None:
    args = fake(None, CUDA_13) | {"nvml": lambda: "570.172.08"}
    assert driver.check(**args).driver == "570.172.08" and driver.check(**args).too_old


def test_the_cuda_version_variable_is_the_fallback(fake) -> None:
    args = fake(PROC_580, None) | {"env": {"CUDA_VERSION": "12.8.1.012"}}
    report = driver.check(**args)
    assert (report.cuda, report.minimum, report.too_old) == ("12.8", "525.60.13", False)


@given(st.text(max_size=200))
def test_any_proc_text_gives_a_version_or_none(text: str) -> None:
    found = driver.parse_proc_version(text)
    assert found is None or all(p.isdigit() for p in found.split("."))


@given(st.text(max_size=40))
def test_any_cuda_version_variable_gives_major_minor_or_none(raw: str) -> None:
    found = driver.image_cuda_version(Path("/nonexistent/version.json"), {"CUDA_VERSION": raw})
    assert found is None or (found.count(".") == 1 and found.replace(".", "").isdigit())


def test_the_launcher_refuses_before_loading_anything(tmp_path: Path) -> None:
    """server.main with an old driver: exit 2, one `cannot start:` line, Truss never imported."""
    code = f"""
import sys
from pathlib import Path
from mistral_serving.ops import driver
from mistral_serving.http import server
driver.PROC_VERSION = Path({str(tmp_path / "version")!r})
driver.CUDA_VERSION_JSON = Path({str(tmp_path / "version.json")!r})
rc = server.main({str(tmp_path / "config.yaml")!r})
assert "truss_server" not in sys.modules
sys.exit(rc)
"""
    (tmp_path / "version").write_text(PROC_550)
    (tmp_path / "version.json").write_text(json.dumps(CUDA_13))
    (tmp_path / "config.yaml").write_text("model_metadata: {}\n")
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env=os.environ | {"PYTHONPATH": str(PACKAGES)},
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines[-1].startswith("cannot start: NVIDIA driver 550.90.07 is too old")
    assert lines[-2].endswith("needs >= 580.65.06: too old")
