"""load_artifact: resolution (local dir, repo id at a pinned revision through the REAL
huggingface_hub client against the loopback Hub stand-in), Hub failures reported as what
they are, confinement, one read of config.json and the manifest, the hash-once marker,
artifact kinds and the engine selection refusals."""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import huggingface_hub
import huggingface_hub.utils._http as hf_http
import pytest
from huggingface_hub import constants

from mistral_build.publish import push_artifact
from mistral_serving.artifacts import manifest as mf
from mistral_serving.artifacts.artifact import (
    Artifact,
    ArtifactError,
    cached_snapshot,
    hub_failure,
    load_artifact,
    marker_path,
    open_artifact,
    resolve_artifact,
)
from mistral_serving.artifacts.manifest import (
    MANIFEST_NAME,
    BuildManifest,
    ManifestError,
    write_manifest,
)
from mistral_serving.engines.factory import engine_name_for
from mistral_serving.engines.trtllm.checks import EngineCheckError
from mistral_serving.settings import Settings, SettingsError
from tests.hub_standin import HubStandIn

TOKEN = "hf_standin_token_for_artifact_tests"
REPO = "acme/tiny"


def one_line(err: pytest.ExceptionInfo[BaseException]) -> str:
    message = str(err.value)
    assert message and "\n" not in message
    assert err.value.__cause__ is None  # nothing chained: the line is the whole story
    return message


def checkpoint_dir(path: Path, weights: str = "model.safetensors") -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({"model_type": "mistral"}))
    (path / weights).write_bytes(b"\0" * 8)
    return path


def with_manifest(path: Path) -> Path:
    checkpoint_dir(path)
    (path / "tokenizer.model").write_bytes(b"tokenizer bytes")
    write_manifest(path, BuildManifest(kind="hf_checkpoint", source_model="m/m"))
    return path


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


def local(path: Path, tmp_path: Path, verify: bool = True) -> Settings:
    return Settings(artifact=str(path), cache_dir=str(tmp_path / "cache"), verify_hashes=verify)


# ---- resolve: local ----------------------------------------------------------------------


def test_local_directory_is_returned(tmp_path: Path) -> None:
    assert resolve_artifact(Settings(artifact=str(tmp_path)), None) == tmp_path


def test_local_file_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "model.safetensors"
    f.write_bytes(b"x")
    with pytest.raises(ArtifactError, match="is a file"):
        resolve_artifact(Settings(artifact=str(f)), None)


@pytest.mark.parametrize("value", ["/no/such/dir", "not a repo", "a/b/c", "./missing"])
def test_missing_path_that_is_not_a_repo_id(value: str) -> None:
    with pytest.raises(ArtifactError, match="not a Hugging Face repo id"):
        resolve_artifact(Settings(artifact=value), None)


def test_unset_artifact_is_a_settings_error() -> None:
    with pytest.raises(SettingsError, match="artifact is not set"):
        resolve_artifact(Settings(), None)


def test_repo_id_needs_a_pinned_revision(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="artifact_revision"):
        resolve_artifact(Settings(artifact=REPO, cache_dir=str(tmp_path)), None)


# ---- the Hub, through the real client against the stand-in ------------------------------


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[HubStandIn, str]]:
    """The stand-in with one pushed artifact (a tiny checkpoint); yields (hub, commit sha).
    The client reads its endpoint from constants bound at import: point them at the
    stand-in, and skip the client's retry back-off sleeps (5xx and connection errors)."""
    art = with_manifest(tmp_path_factory.mktemp("tiny") / "art")
    with pytest.MonkeyPatch.context() as mp, HubStandIn(token=TOKEN) as hub:
        mp.setattr(constants, "HF_HUB_DISABLE_XET", True)  # the stand-in speaks LFS
        mp.setattr(constants, "ENDPOINT", hub.url)
        template = hub.url + "/{repo_id}/resolve/{revision}/{filename}"
        mp.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", template)
        # huggingface_hub 0.x (`make test-compat`) reads its own copy, bound at import.
        import huggingface_hub.file_download as file_download

        if hasattr(file_download, "HUGGINGFACE_CO_URL_TEMPLATE"):
            mp.setattr(file_download, "HUGGINGFACE_CO_URL_TEMPLATE", template)
        mp.setattr(hf_http.time, "sleep", lambda seconds: None)
        sha = push_artifact(art, REPO, token=TOKEN, endpoint=hub.url).commit_sha
        yield hub, sha


@pytest.fixture
def standin(hub: tuple[HubStandIn, str]) -> Iterator[tuple[HubStandIn, str]]:
    yield hub
    hub[0].answer_normally()


def from_hub(tmp_path: Path, revision: str, repo: str = REPO) -> Settings:
    return Settings(artifact=repo, artifact_revision=revision, cache_dir=str(tmp_path / "c"))


def test_pulls_the_pinned_commit_into_the_cache(
    standin: tuple[HubStandIn, str], tmp_path: Path
) -> None:
    hub, sha = standin
    artifact = load_artifact(from_hub(tmp_path, sha), TOKEN)
    assert artifact.path.name == sha and artifact.path.is_relative_to(tmp_path / "c" / "hub")
    assert artifact.path == cached_snapshot(REPO, sha, tmp_path / "c")  # where read-ahead looks
    assert (artifact.path / "config.json").is_symlink()  # the cache layout: links to blobs
    assert artifact.kind == "hf_checkpoint" and artifact.config == {"model_type": "mistral"}
    assert artifact.manifest is not None and "model.safetensors" in artifact.manifest.files
    tree = [r for r in hub.state.requests if "/tree/" in r.path]
    assert tree and all(r.headers["authorization"] == f"Bearer {TOKEN}" for r in tree)


def test_non_sha_revision_warns(
    standin: tuple[HubStandIn, str], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="mistral_serving.artifacts.artifact"):
        load_artifact(from_hub(tmp_path, "main"), TOKEN)
    assert "not a commit sha" in caplog.text


@pytest.mark.parametrize(
    ("status", "needles", "absent"),
    [
        (500, ["the Hub answered HTTP 500 for acme/tiny@", "not (completely) in the cache"], []),
        (503, ["the Hub answered HTTP 503", "retry later"], []),
        (501, ["the Hub answered HTTP 501"], []),
        (403, ["the Hub answered HTTP 403", "may not read this repo"], []),
        (429, ["the Hub answered HTTP 429", "(rate limited)"], []),
    ],
)
def test_hub_http_errors_are_reported_as_such(
    standin: tuple[HubStandIn, str],
    tmp_path: Path,
    status: int,
    needles: list[str],
    absent: list[str],
) -> None:
    hub, sha = standin
    hub.answer_with(status)
    with pytest.raises(ArtifactError) as err:
        load_artifact(from_hub(tmp_path, sha), TOKEN)
    message = one_line(err)
    for needle in needles:
        assert needle in message
    assert "cannot reach" not in message


def test_wrong_token_is_a_401(standin: tuple[HubStandIn, str], tmp_path: Path) -> None:
    _, sha = standin
    with pytest.raises(ArtifactError) as err:
        load_artifact(from_hub(tmp_path, sha), "hf_wrong")
    assert "HTTP 401" in one_line(err) and "invalid or expired" in str(err.value)


@pytest.mark.parametrize(
    ("repo", "token", "needle"),
    [
        ("acme/missing", TOKEN, "acme/missing not found or private (the token cannot read it)"),
        (REPO, None, "acme/tiny not found or private (no token was given)"),  # private repo
    ],
)
def test_missing_or_private_repo(
    standin: tuple[HubStandIn, str], tmp_path: Path, repo: str, token: str | None, needle: str
) -> None:
    _, sha = standin
    with pytest.raises(ArtifactError) as err:
        load_artifact(from_hub(tmp_path, sha, repo), token)
    assert needle in one_line(err)


def test_unknown_revision(standin: tuple[HubStandIn, str], tmp_path: Path) -> None:
    with pytest.raises(ArtifactError) as err:
        load_artifact(from_hub(tmp_path, "f" * 40), TOKEN)
    assert f"revision {'f' * 40} not found in {REPO}" in one_line(err)


@pytest.mark.parametrize(
    "body", [b"<html>502 Bad Gateway</html>", b"\xff\xfe\x00", b'{"truncated": ']
)
def test_an_answer_that_is_not_json_is_one_line(
    standin: tuple[HubStandIn, str], tmp_path: Path, body: bytes
) -> None:
    hub, sha = standin
    hub.answer_with(200, body, "text/html", prefix="/api/")
    with pytest.raises(ArtifactError) as err:
        load_artifact(from_hub(tmp_path, sha), TOKEN)
    message = one_line(err)
    assert f"the Hub's answer for {REPO}@{sha} is not JSON" in message
    assert hub.url in message  # says which endpoint answered


def test_unreachable_hub_and_empty_cache(
    standin: tuple[HubStandIn, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, sha = standin
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # discard port: refused
    with pytest.raises(ArtifactError) as err:
        load_artifact(from_hub(tmp_path, sha), TOKEN)
    message = one_line(err)
    # ConnectError (httpx: huggingface_hub 1.x/2.x) or ConnectionError (requests: 0.x, the
    # TensorRT-LLM image's, run by `make test-compat`).
    assert re.search(
        r"cannot reach the Hub at http://127\.0\.0\.1:9 \(Connect(ion)?Error\)", message
    )
    assert str(tmp_path / "c" / "hub") in message


@pytest.mark.parametrize("outage", ["unreachable", "HTTP 500"])
def test_a_cached_revision_is_served_when_the_hub_is_down(
    standin: tuple[HubStandIn, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, outage: str
) -> None:
    hub, sha = standin
    first = load_artifact(from_hub(tmp_path, sha), TOKEN)
    if outage == "unreachable":
        monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")
    else:
        hub.answer_with(500)
    again = load_artifact(from_hub(tmp_path, sha), TOKEN)
    assert again.path == first.path and again.manifest == first.manifest


# ---- kinds ---------------------------------------------------------------------------------


def test_kind_of_an_engine_dir(tmp_path: Path) -> None:
    art = open_artifact(engine_dir(tmp_path / "e"), local(tmp_path / "e", tmp_path))
    assert art.kind == "trtllm_engine" and art.config["build_config"]["max_batch_size"] == 4


@pytest.mark.parametrize("weights", ["model.safetensors", "pytorch_model.bin"])
def test_kind_of_a_checkpoint(tmp_path: Path, weights: str) -> None:
    path = checkpoint_dir(tmp_path / "c", weights)
    assert open_artifact(path, local(path, tmp_path)).kind == "hf_checkpoint"


def test_the_dev_model_loads(dev_model: Path, tmp_path: Path) -> None:
    art = load_artifact(local(dev_model, tmp_path), None)
    assert isinstance(art, Artifact) and art.kind == "hf_checkpoint"
    assert art.manifest is not None and art.config["model_type"]


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
            open_artifact(path, local(path, tmp_path))


@pytest.mark.parametrize("text", ["{ truncated", "[1, 2]", "[" * 50_000, "\udcff"])
def test_unreadable_config_json_is_one_line(tmp_path: Path, text: str) -> None:
    path = checkpoint_dir(tmp_path / "c")
    (path / "config.json").write_bytes(text.encode(errors="surrogateescape"))
    with pytest.raises(ArtifactError) as err:
        open_artifact(path, local(path, tmp_path))
    assert "config.json" in one_line(err)


def test_manifest_of_another_kind_is_refused(tmp_path: Path) -> None:
    path = engine_dir(tmp_path / "e")
    write_manifest(path, BuildManifest(kind="hf_checkpoint", source_model="m"))
    with pytest.raises(ManifestError, match="says hf_checkpoint but the files are a trtllm"):
        open_artifact(path, local(path, tmp_path))


# ---- confinement at load ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "entry", ["../../../../etc/passwd", "/etc/shadow", "a/../../x", "x\0y", "a\\b", "n" * 2000]
)
def test_load_refuses_a_crafted_manifest_entry(tmp_path: Path, entry: str) -> None:
    path = with_manifest(tmp_path / "a")
    doc = json.loads((path / MANIFEST_NAME).read_text())
    doc["files"][entry] = {"size": 1, "sha256": "0" * 64}
    (path / MANIFEST_NAME).write_text(json.dumps(doc))
    with pytest.raises(ArtifactError) as err:
        load_artifact(local(path, tmp_path), None)
    message = one_line(err)
    assert "refused" in message and mf.shown(entry)[:100] in message


def test_load_refuses_a_weight_file_that_links_out(tmp_path: Path) -> None:
    path = with_manifest(tmp_path / "a")
    (tmp_path / "outside.safetensors").write_bytes(b"\0" * 8)
    (path / "model.safetensors").unlink()
    (path / "model.safetensors").symlink_to(tmp_path / "outside.safetensors")
    with pytest.raises(ArtifactError) as err:
        load_artifact(local(path, tmp_path), None)
    assert "model.safetensors: symlink to" in one_line(err)


# ---- manifest checks and the hash-once marker ------------------------------------------------


@pytest.fixture
def hashes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Names of the files hashed (sha256_file calls) while the test runs."""
    calls: list[str] = []
    real = mf.sha256_file

    def counted(path: Path, *args: object) -> str:
        calls.append(Path(path).name)
        return real(path, *args)

    monkeypatch.setattr(mf, "sha256_file", counted)
    return calls


LISTED = ["config.json", "model.safetensors", "tokenizer.model"]


def test_hashes_are_checked_once_then_vouched_for_by_the_marker(
    tmp_path: Path, hashes: list[str]
) -> None:
    path = with_manifest(tmp_path / "a")
    hashes.clear()  # writing the manifest hashed the files
    settings = local(path, tmp_path)
    load_artifact(settings, None)
    assert sorted(hashes) == LISTED
    assert marker_path(settings.cache_path, path).is_file()
    hashes.clear()
    load_artifact(settings, None)
    load_artifact(settings, None)
    assert hashes == []


def test_a_touched_file_is_hashed_again(tmp_path: Path, hashes: list[str]) -> None:
    path = with_manifest(tmp_path / "a")
    hashes.clear()  # writing the manifest hashed the files
    settings = local(path, tmp_path)
    load_artifact(settings, None)
    hashes.clear()
    st = (path / "tokenizer.model").stat()
    os.utime(path / "tokenizer.model", ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    load_artifact(settings, None)
    assert sorted(hashes) == LISTED  # the marker is gone as a whole: every file again


def test_same_size_corruption_with_the_mtime_restored_is_caught(
    tmp_path: Path, hashes: list[str]
) -> None:
    path = with_manifest(tmp_path / "a")
    hashes.clear()  # writing the manifest hashed the files
    settings = local(path, tmp_path)
    load_artifact(settings, None)
    weights = path / "model.safetensors"
    st = weights.stat()
    weights.write_bytes(b"\1" * 8)  # same size, other bytes
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns))  # mtime put back
    while weights.stat().st_ctime_ns == st.st_ctime_ns:  # same clock tick: let ctime move
        time.sleep(0.01)
        os.chmod(weights, st.st_mode)
    with pytest.raises(ArtifactError, match="model.safetensors: sha256 differs"):
        load_artifact(settings, None)


def test_a_new_manifest_invalidates_the_marker(tmp_path: Path, hashes: list[str]) -> None:
    path = with_manifest(tmp_path / "a")
    hashes.clear()  # writing the manifest hashed the files
    settings = local(path, tmp_path)
    load_artifact(settings, None)
    hashes.clear()
    write_manifest(path, BuildManifest(kind="hf_checkpoint", source_model="m/other"))
    hashes.clear()  # write_manifest hashed too
    load_artifact(settings, None)
    assert sorted(hashes) == LISTED


def test_a_damaged_marker_means_hashing_again(tmp_path: Path, hashes: list[str]) -> None:
    path = with_manifest(tmp_path / "a")
    hashes.clear()  # writing the manifest hashed the files
    settings = local(path, tmp_path)
    load_artifact(settings, None)
    marker_path(settings.cache_path, path).write_text("{ not json")
    hashes.clear()
    load_artifact(settings, None)
    assert sorted(hashes) == LISTED


def test_no_marker_is_kept_for_a_failed_check(tmp_path: Path, hashes: list[str]) -> None:
    path = with_manifest(tmp_path / "a")
    hashes.clear()  # writing the manifest hashed the files
    (path / "model.safetensors").write_bytes(b"\1" * 8)
    settings = local(path, tmp_path)
    for _ in range(2):  # the second start checks again: no marker vouches for bad files
        with pytest.raises(ArtifactError, match="sha256 differs"):
            load_artifact(settings, None)
    assert not marker_path(settings.cache_path, path).exists()


def test_an_unwritable_cache_only_costs_a_rehash(
    tmp_path: Path, hashes: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    path = with_manifest(tmp_path / "a")
    hashes.clear()  # writing the manifest hashed the files
    (tmp_path / "cache").write_text("a file where the cache folder should be")
    with caplog.at_level(logging.WARNING, logger="mistral_serving.artifacts.artifact"):
        load_artifact(local(path, tmp_path), None)
    assert "cannot write the verified marker" in caplog.text


def test_without_verify_hashes_only_sizes_are_checked(tmp_path: Path, hashes: list[str]) -> None:
    path = with_manifest(tmp_path / "a")
    hashes.clear()  # writing the manifest hashed the files
    (path / "model.safetensors").write_bytes(b"\1" * 8)  # same size, other bytes
    load_artifact(local(path, tmp_path, verify=False), None)
    assert hashes == []
    (path / "tokenizer.model").write_bytes(b"short")
    with pytest.raises(ArtifactError, match="tokenizer.model: size 5 differs"):
        load_artifact(local(path, tmp_path, verify=False), None)


def test_missing_listed_file_fails(tmp_path: Path) -> None:
    path = with_manifest(tmp_path / "a")
    (path / "tokenizer.model").unlink()
    with pytest.raises(ArtifactError, match="listed in .* but missing"):
        load_artifact(local(path, tmp_path), None)


def test_missing_manifest_warns(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = checkpoint_dir(tmp_path / "a")
    with caplog.at_level(logging.WARNING, logger="mistral_serving.artifacts.artifact"):
        assert load_artifact(local(path, tmp_path), None).manifest is None
    assert "no build manifest" in caplog.text


def test_unlisted_files_are_named_in_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = with_manifest(tmp_path / "a")
    (path / "extra.safetensors").write_bytes(b"x")
    with caplog.at_level(logging.WARNING, logger="mistral_serving.artifacts.artifact"):
        load_artifact(local(path, tmp_path), None)
    assert "not in the build manifest" in caplog.text and "extra.safetensors" in caplog.text


def test_config_and_manifest_are_read_once(tmp_path: Path, monkeypatch) -> None:
    path = with_manifest(tmp_path / "a")
    read: list[str] = []
    real = mf.read_json_file
    monkeypatch.setattr(
        "mistral_serving.artifacts.artifact.read_json_file",
        lambda p, what: read.append(Path(p).name) or real(p, what),
    )
    load_artifact(local(path, tmp_path), None)
    assert sorted(read) == ["build_manifest.json", "config.json"]


def test_every_load_failure_is_an_artifact_error() -> None:
    """One type for the adapter to catch: engine checks and manifest problems included."""
    assert issubclass(EngineCheckError, ArtifactError)
    assert issubclass(ManifestError, ArtifactError)


def test_hub_module_is_the_real_client() -> None:
    """The installed huggingface_hub (2.x in the dev venv, 0.x under `make test-compat`)."""
    from importlib.metadata import version

    assert huggingface_hub.__version__ == version("huggingface_hub")
    assert not Path(huggingface_hub.__file__).is_relative_to(Path(__file__).parents[1])


# ---- engine selection ------------------------------------------------------------------------


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


def test_hub_failures_are_worded_without_httpx2_as_on_huggingface_hub_0x(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The TensorRT-LLM image runs huggingface_hub 0.x: requests, no httpx2.
    import requests

    monkeypatch.setitem(sys.modules, "httpx2", None)  # `import httpx2` -> ImportError
    refused = requests.exceptions.ConnectionError("Connection refused")
    message = hub_failure(refused, REPO, "0" * 40, None, tmp_path)
    assert message.startswith(f"cannot reach the Hub at {constants.ENDPOINT} (ConnectionError)")


def test_a_json_error_from_simplejson_is_named_as_one() -> None:
    """requests decodes with simplejson where it is installed (seen on the GPU machine under
    Python 3.12): its JSONDecodeError is not json's, and must still read "not JSON"."""
    from mistral_serving.artifacts.artifact import _is_json_error

    class JSONDecodeError(ValueError):  # simplejson.errors.JSONDecodeError's shape
        pass

    class RequestsJSONDecodeError(JSONDecodeError):
        pass

    assert _is_json_error(RequestsJSONDecodeError("Expecting value"))
    assert _is_json_error(json.JSONDecodeError("x", "doc", 0))
    assert not _is_json_error(ValueError("x"))
