"""The serving core without the GPU fallback package, as an image for the TensorRT-LLM
kinds ships it: the core imports and picks its engines; each setting that needs the
package is refused in one line that names the setting; `auto` keeps the dynamic KV cache
and says why. Run in a fresh interpreter over a copy of the core alone, so nothing of the
package can be imported."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGES = Path(__file__).resolve().parents[2] / "mistral-trt-truss" / "packages"

PROBE = """
import json, sys
from mistral_serving.engines import fallback, factory
from mistral_serving.settings import Settings, SettingsError
out = {"installed": fallback.installed() is not None}
out["auto_on_cuda"] = factory.kv_cache_choice(
    "auto", True, {"architectures": ["MistralForCausalLM"]})
refusals = {}
for setting in ("engine_process: on", "engine: replay", "pytorch_kv_cache: static"):
    try:
        fallback.required(setting)
    except SettingsError as exc:
        refusals[setting] = str(exc)
out["refusals"] = refusals
try:
    import mistral_gpu_fallback  # noqa: F401
    out["importable"] = True
except ModuleNotFoundError:
    out["importable"] = False
print(json.dumps(out))
"""


def probe(path: Path) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE],
        env={"PYTHONPATH": str(path), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=300,
        cwd=path,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def core_only(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("core-only")
    shutil.copytree(
        PACKAGES / "mistral_serving",
        root / "mistral_serving",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    return root


def test_without_the_package_each_setting_that_needs_it_is_refused(core_only: Path) -> None:
    out = probe(core_only)
    assert out["installed"] is False and out["importable"] is False
    assert out["auto_on_cuda"] == [
        "dynamic",
        "the GPU fallback package (mistral_gpu_fallback) is not installed",
    ]
    assert sorted(out["refusals"]) == sorted(
        ["engine_process: on", "engine: replay", "pytorch_kv_cache: static"]
    )
    for setting, message in out["refusals"].items():
        assert message.startswith(f"{setting} needs the GPU fallback package")
        assert "\n" not in message


def test_with_the_package_the_same_probe_finds_it() -> None:
    out = probe(PACKAGES)
    assert out["installed"] is True and out["importable"] is True
    assert out["auto_on_cuda"] == ["static", None]
    assert out["refusals"] == {}


def test_a_broken_package_is_not_reported_as_missing(tmp_path: Path) -> None:
    """A plugin that fails on its own import error says so, not "not installed"."""
    shutil.copytree(PACKAGES / "mistral_serving", tmp_path / "mistral_serving")
    broken = tmp_path / "mistral_gpu_fallback"
    broken.mkdir()
    (broken / "__init__.py").write_text("")
    (broken / "plugin.py").write_text("import a_module_that_does_not_exist\n")
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "from mistral_serving.engines import fallback; fallback.installed()",
        ],
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 1
    assert "No module named 'a_module_that_does_not_exist'" in proc.stderr
