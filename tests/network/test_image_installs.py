"""The image's installs against the real package index (`make check-image-installs`, which
CI runs; skipped elsewhere: the network is needed). Each `uv pip install` of the rendered
Dockerfiles resolves on top of the release image's packages (the committed freeze), and
a moved TensorRT-LLM pin fails it (mistral_build/image_installs.py)."""

from __future__ import annotations

import os

import pytest

from mistral_build.image_installs import check

pytestmark = pytest.mark.skipif(
    os.environ.get("MTT_IMAGE_INSTALLS") != "1",
    reason="resolves against the package index: make check-image-installs",
)


def test_every_install_step_resolves_on_the_release_images_packages(capsys):
    assert check([]) == 0, capsys.readouterr().out
    out = capsys.readouterr().out
    assert [ln.split(":")[0] for ln in out.splitlines()] == ["ok   Dockerfile"] * 2


def test_a_moved_tensorrt_llm_pin_fails(capsys):
    assert check(["transformers>=4.58"]) == 1
    out = capsys.readouterr().out
    assert "FAIL Dockerfile:" in out and "transformers==4.57.3" in out


def test_holding_every_base_package_at_its_version_fails_on_certifi(capsys):
    # The rule the build had: every base package `==`. Truss's server wants a newer certifi
    # than NGC PyTorch 25.12 holds.
    assert check([], hold_all=True) == 1
    out = capsys.readouterr().out
    assert "FAIL Dockerfile:" in out and "certifi" in out
