"""Artifact resolution (local dir, repo id at a pinned revision, Hub errors mapped to one
actionable line, offline fallback to the cache), artifact kinds, manifest checks, and the
engine selection refusals. `snapshot_download` is monkeypatched: the Hub is never called."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import httpx2
import huggingface_hub
import pytest
from huggingface_hub.errors import (
    GatedRepoError,
    LocalEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from mistral_serving.artifacts import (
    ArtifactError,
    artifact_kind,
    check_manifest,
    resolve_artifact,
)
from mistral_serving.engines.factory import engine_name_for
from mistral_serving.manifest import MANIFEST_NAME, BuildManifest, write_manifest
from mistral_serving.settings import Settings, SettingsError

REPO = "someone/mistral-engine"
SHA = "0123456789abcdef0123456789abcdef01234567"


def hub_error(cls: type[Exception]) -> Exception:
    url = f"https://huggingface.co/api/models/{REPO}/revision/{SHA}"
    response = httpx2.Response(404, request=httpx2.Request("GET", url))
    return cls("404 from the Hub", response=response)


class FakeSnapshot:
    """Stands in for `huggingface_hub.snapshot_download`: raises the queued outcomes in
    order (an exception instance is raised, a path is returned) and records the calls."""

    def __init__(self, *outcomes: object) -> None:
        self.outcomes = list(outcomes)
        self.calls: list[dict] = []

    def __call__(self, **kwargs: object) -> str:
        self.calls.append(kwargs)
        outcome = self.outcomes.pop(0)
        if isinstance(outcome, BaseException):
            raise outcome
        return str(outcome)


def install(monkeypatch: pytest.MonkeyPatch, fake: FakeSnapshot) -> FakeSnapshot:
    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake)
    return fake


def repo_settings(tmp_path: Path, revision: str | None = SHA) -> Settings:
    return Settings(artifact=REPO, artifact_revision=revision, cache_dir=str(tmp_path / "c"))


# ---- resolve_artifact: local ----


def test_local_directory_is_returned(tmp_path: Path) -> None:
    assert resolve_artifact(Settings(artifact=str(tmp_path)), None) == tmp_path


def test_local_file_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "model.safetensors"
    f.write_bytes(b"x")
    with pytest.raises(ArtifactError, match="is a file"):
        resolve_artifact(Settings(artifact=str(f)), None)


@pytest.mark.parametrize("value", ["/no/such/dir", "not a repo", "a/b/c", "./missing"])
def test_missing_path_that_is_not_a_repo_id(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = install(monkeypatch, FakeSnapshot())
    with pytest.raises(ArtifactError, match="not a Hugging Face repo id"):
        resolve_artifact(Settings(artifact=value), None)
    assert fake.calls == []


def test_unset_artifact_is_a_settings_error() -> None:
    with pytest.raises(SettingsError, match="artifact is not set"):
        resolve_artifact(Settings(), None)


def test_repo_id_needs_a_pinned_revision(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = install(monkeypatch, FakeSnapshot())
    with pytest.raises(SettingsError, match="artifact_revision"):
        resolve_artifact(repo_settings(tmp_path, revision=None), None)
    assert fake.calls == []


# ---- resolve_artifact: download ----


def test_download_uses_the_pinned_revision_and_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = install(monkeypatch, FakeSnapshot(tmp_path / "snap"))
    assert resolve_artifact(repo_settings(tmp_path), "hf_tok") == tmp_path / "snap"
    (call,) = fake.calls
    assert call["repo_id"] == REPO and call["revision"] == SHA
    assert call["cache_dir"] == str(tmp_path / "c" / "hub")
    assert call["token"] == "hf_tok"


def test_download_without_token_never_uses_a_stored_login(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = install(monkeypatch, FakeSnapshot(tmp_path))
    resolve_artifact(repo_settings(tmp_path), None)
    assert fake.calls[0]["token"] is False


def test_non_sha_revision_warns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    install(monkeypatch, FakeSnapshot(tmp_path))
    with caplog.at_level(logging.WARNING, logger="mistral_serving.artifacts"):
        resolve_artifact(repo_settings(tmp_path, revision="main"), None)
    assert "not a commit sha" in caplog.text


@pytest.mark.parametrize(
    ("error", "token", "needles"),
    [
        (RevisionNotFoundError, None, [f"revision {SHA} not found in {REPO}"]),
        (GatedRepoError, "tok", [f"{REPO} is gated", "hf_access_token"]),
        (RepositoryNotFoundError, None, ["not found or private", "no token was given"]),
        (RepositoryNotFoundError, "tok", ["not found or private", "the token cannot read it"]),
    ],
)
def test_hub_errors_become_one_line_artifact_errors(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    error: type[Exception],
    token: str | None,
    needles: list[str],
) -> None:
    fake = install(monkeypatch, FakeSnapshot(hub_error(error)))
    with pytest.raises(ArtifactError) as err:
        resolve_artifact(repo_settings(tmp_path), token)
    message = str(err.value)
    assert "\n" not in message
    for needle in needles:
        assert needle in message
    assert err.value.__cause__ is None and err.value.__suppress_context__
    assert len(fake.calls) == 1  # a definite answer from the Hub: no cache retry


@pytest.mark.parametrize(
    "offline_error",
    [
        ConnectionError("connection refused"),
        LocalEntryNotFoundError("cannot reach the Hub and not in the cache"),
    ],
)
def test_unreachable_hub_falls_back_to_the_cache(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    offline_error: Exception,
) -> None:
    cached = tmp_path / "cached-snapshot"
    fake = install(monkeypatch, FakeSnapshot(offline_error, cached))
    with caplog.at_level(logging.WARNING, logger="mistral_serving.artifacts"):
        assert resolve_artifact(repo_settings(tmp_path), "tok") == cached
    first, second = fake.calls
    assert "local_files_only" not in first
    assert second["local_files_only"] is True
    assert (second["repo_id"], second["revision"]) == (REPO, SHA)
    assert second["cache_dir"] == first["cache_dir"]
    assert "Hub unreachable" in caplog.text


def test_unreachable_hub_and_empty_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    install(monkeypatch, FakeSnapshot(ConnectionError("down"), LocalEntryNotFoundError("no")))
    with pytest.raises(ArtifactError) as err:
        resolve_artifact(repo_settings(tmp_path), None)
    assert "cannot reach the Hub" in str(err.value)
    assert str(tmp_path / "c" / "hub") in str(err.value)


# ---- artifact_kind ----


def engine_dir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    config = {
        "version": "1.2.1",
        "pretrained_config": {"architecture": "MistralForCausalLM"},
        "build_config": {"max_seq_len": 128, "max_batch_size": 4},
    }
    (path / "config.json").write_text(json.dumps(config))
    (path / "rank0.engine").write_bytes(b"\0" * 8)
    return path


def checkpoint_dir(path: Path, weights: str = "model.safetensors") -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({"model_type": "mistral"}))
    (path / weights).write_bytes(b"\0" * 8)
    return path


def test_kind_of_an_engine_dir(tmp_path: Path) -> None:
    assert artifact_kind(engine_dir(tmp_path / "e")) == "trtllm_engine"


@pytest.mark.parametrize("weights", ["model.safetensors", "pytorch_model.bin"])
def test_kind_of_a_checkpoint(tmp_path: Path, weights: str) -> None:
    assert artifact_kind(checkpoint_dir(tmp_path / "c", weights)) == "hf_checkpoint"


def test_kind_of_the_dev_model(dev_model: Path) -> None:
    assert artifact_kind(dev_model) == "hf_checkpoint"


def test_kind_refuses_other_dirs(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    config_only = tmp_path / "config_only"
    config_only.mkdir()
    (config_only / "config.json").write_text("{}")
    weights_only = tmp_path / "weights_only"
    weights_only.mkdir()
    (weights_only / "model.safetensors").write_bytes(b"x")
    # rank files next to a checkpoint config (no build_config) and no weights.
    half_engine = checkpoint_dir(tmp_path / "half", "rank0.engine")
    for path in (empty, config_only, weights_only, half_engine):
        with pytest.raises(ArtifactError, match="neither a TensorRT-LLM engine"):
            artifact_kind(path)


# ---- check_manifest ----


def with_manifest(path: Path) -> Path:
    checkpoint_dir(path)
    (path / "tokenizer.model").write_bytes(b"tokenizer bytes")
    write_manifest(path, BuildManifest(kind="hf_checkpoint", source_model="m/m"))
    return path


def test_manifest_checks_pass_on_untouched_files(tmp_path: Path) -> None:
    artifact = with_manifest(tmp_path / "a")
    manifest = check_manifest(artifact, verify_hashes=True)
    assert manifest is not None
    assert set(manifest.files) == {"config.json", "model.safetensors", "tokenizer.model"}


def test_tampered_file_same_size_fails_the_hash_check(tmp_path: Path) -> None:
    artifact = with_manifest(tmp_path / "a")
    (artifact / "model.safetensors").write_bytes(b"\1" * 8)  # same size, other bytes
    with pytest.raises(ArtifactError, match="model.safetensors: sha256 differs"):
        check_manifest(artifact, verify_hashes=True)
    assert check_manifest(artifact, verify_hashes=False) is not None  # sizes still agree


def test_resized_file_fails_even_without_hashes(tmp_path: Path) -> None:
    artifact = with_manifest(tmp_path / "a")
    (artifact / "tokenizer.model").write_bytes(b"short")
    with pytest.raises(ArtifactError, match="tokenizer.model: size 5 differs"):
        check_manifest(artifact, verify_hashes=False)


def test_missing_listed_file_fails(tmp_path: Path) -> None:
    artifact = with_manifest(tmp_path / "a")
    (artifact / "tokenizer.model").unlink()
    with pytest.raises(ArtifactError, match="listed in .* but missing"):
        check_manifest(artifact, verify_hashes=True)


def test_missing_manifest_warns_and_returns_none(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    artifact = checkpoint_dir(tmp_path / "a")
    with caplog.at_level(logging.WARNING, logger="mistral_serving.artifacts"):
        assert check_manifest(artifact, verify_hashes=True) is None
    assert "no build manifest" in caplog.text


def test_unreadable_manifest_is_an_artifact_error(tmp_path: Path) -> None:
    """A corrupt build_manifest.json means the artifact cannot be trusted: it should be
    reported like every other artifact problem (one-line ArtifactError)."""
    artifact = checkpoint_dir(tmp_path / "a")
    (artifact / MANIFEST_NAME).write_text("{ truncated")
    with pytest.raises(ArtifactError, match="unreadable build manifest"):
        check_manifest(artifact, verify_hashes=True)


# ---- engine selection ----


@pytest.mark.parametrize(
    ("kind", "setting", "expected"),
    [
        ("trtllm_engine", "auto", "tensorrt_llm"),
        ("trtllm_engine", "tensorrt_llm", "tensorrt_llm"),
        ("hf_checkpoint", "auto", "pytorch"),
        ("hf_checkpoint", "pytorch", "pytorch"),
    ],
)
def test_engine_name_for_accepts(kind: str, setting: str, expected: str) -> None:
    assert engine_name_for(kind, setting) == expected


@pytest.mark.parametrize(
    ("kind", "setting", "needles"),
    [
        (
            "hf_checkpoint",
            "tensorrt_llm",
            ["engine=tensorrt_llm", "Hugging Face checkpoint", "python build.py engine"],
        ),
        ("trtllm_engine", "pytorch", ["engine=pytorch", "TensorRT-LLM engine", "set engine=auto"]),
    ],
)
def test_engine_name_for_refuses_a_mismatch(kind: str, setting: str, needles: list[str]) -> None:
    with pytest.raises(ArtifactError) as err:
        engine_name_for(kind, setting)
    for needle in needles:
        assert needle in str(err.value)
