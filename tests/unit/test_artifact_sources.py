"""Mounted artifacts (a GCS FUSE bucket, a ReadOnlyMany volume): a read-only copy of the dev
model loads and serves with no Hub and no write into it, hashed once with the marker kept
in the writable cache; a pinned manifest (artifact_manifest_sha256) that differs, files
that differ from the manifest, and a cache inside the read-only tree each refuse in one
line; the fill Job's module fills a directory from the Hub (the real huggingface_hub client
against the loopback stand-in), verifies it and prints the pin."""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import huggingface_hub
import huggingface_hub.utils._http as hf_http
import pytest
from huggingface_hub import constants
from hypothesis import given, settings
from hypothesis import strategies as st

from mistral_build.publish import push_artifact
from mistral_serving.artifacts import fill as artifact_fill
from mistral_serving.artifacts import sources as artifact_sources
from mistral_serving.artifacts.artifact import ArtifactError, load_artifact, marker_path
from mistral_serving.artifacts.manifest import MANIFEST_NAME, BuildManifest, write_manifest
from mistral_serving.generation.service import GenerationService
from mistral_serving.settings import Settings, SettingsError
from tests.hub_standin import HubStandIn

TOKEN = "hf_standin_token_for_fill_tests"
REPO = "acme/fill"

# Every write the process makes under a watched directory (an audit hook cannot be
# removed, so it stays installed and only records while `_WATCHED` names a directory).
_WATCHED: list[str] = []
_WRITES: list[str] = []
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if not _WATCHED:
        return
    root = _WATCHED[0]
    target = args[0] if args else None
    if isinstance(target, bytes):
        target = os.fsdecode(target)
    if not isinstance(target, str) or "\0" in target:
        return  # a descriptor or not a path
    try:
        inside = os.path.realpath(target).startswith(root)
    except (OSError, ValueError):
        return
    if event == "open" and inside:
        mode, flags = args[1], args[2]
        if (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
            isinstance(flags, int) and flags & _WRITE_FLAGS
        ):
            _WRITES.append(f"open {target} {mode} {flags}")
    elif inside and event in ("os.mkdir", "os.remove", "os.rename", "os.rmdir", "os.chmod",
                              "os.utime", "os.truncate", "os.symlink", "os.link"):  # fmt: skip
        _WRITES.append(f"{event} {target}")


sys.addaudithook(_audit)


def read_only_copy(source: Path, dest: Path) -> Path:
    """`cp -r` then `chmod -R a-w`: what a read-only mount looks like to the loader."""
    shutil.copytree(source, dest)
    for p in [*dest.rglob("*"), dest]:
        p.chmod(stat.S_IMODE(p.stat().st_mode) & ~0o222)
    return dest


def writable_again(path: Path) -> None:
    for p in [path, *path.rglob("*")]:
        p.chmod(stat.S_IMODE(p.stat().st_mode) | 0o200)


def tree_state(path: Path) -> dict[str, tuple[int, int, int, int]]:
    return {
        p.relative_to(path).as_posix(): (s.st_size, s.st_mtime_ns, s.st_ctime_ns, s.st_mode)
        for p in [path, *path.rglob("*")]
        for s in [p.stat()]
    }


@pytest.fixture
def mounted(dev_model: Path, tmp_path: Path) -> Iterator[Path]:
    path = read_only_copy(dev_model, tmp_path / "mnt" / "artifact")
    yield path
    writable_again(path)  # so pytest can clean tmp_path


@pytest.fixture
def no_hub(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any Hub call fails the test: a mounted artifact never touches the Hub."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the Hub was called for a mounted artifact")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", refuse)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def one_line(err: pytest.ExceptionInfo[BaseException]) -> str:
    message = str(err.value)
    assert message and "\n" not in message
    assert err.value.__cause__ is None
    return message


def pin_of(path: Path) -> str:
    return hashlib.sha256((path / MANIFEST_NAME).read_bytes()).hexdigest()


def test_a_read_only_artifact_serves_with_no_hub_and_no_write_into_it(
    mounted: Path, tmp_path: Path, no_hub: None, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO")
    cache = tmp_path / "cache"
    settings = Settings(
        artifact=str(mounted),
        artifact_manifest_sha256=pin_of(mounted),
        cache_dir=str(cache),
        engine="pytorch",
    )
    before = tree_state(mounted)
    _WATCHED[:] = [os.path.realpath(mounted)]
    try:
        service = GenerationService.start(settings, None)
        try:
            assert service.engine.info.name
        finally:
            service.shutdown()
        load_artifact(settings, None)  # a second start: the marker vouches, no re-hash
    finally:
        _WATCHED.clear()
    assert _WRITES == [], _WRITES
    assert tree_state(mounted) == before
    assert marker_path(cache, mounted).is_file()  # the marker lives in the writable cache
    assert f"artifact {mounted} is read-only" in caplog.text
    assert "hashes verified earlier" in caplog.text


def test_the_audit_hook_does_see_a_write(tmp_path: Path) -> None:
    """The check above can fail: a write under the watched directory is recorded."""
    _WATCHED[:] = [os.path.realpath(tmp_path)]
    try:
        (tmp_path / "x").write_text("x")
    finally:
        _WATCHED.clear()
    assert _WRITES and "x" in _WRITES.pop()
    _WRITES.clear()


def test_a_pinned_manifest_that_differs_refuses_in_one_line(
    mounted: Path, tmp_path: Path, no_hub: None
) -> None:
    wrong = "0" * 64
    settings = Settings(
        artifact=str(mounted), artifact_manifest_sha256=wrong, cache_dir=str(tmp_path / "c")
    )
    with pytest.raises(ArtifactError) as err:
        load_artifact(settings, None)
    line = one_line(err)
    assert pin_of(mounted) in line and wrong in line and "another build" in line
    assert not (tmp_path / "c").exists()  # refused before anything was hashed or marked


def test_a_pin_without_a_manifest_refuses(dev_model: Path, tmp_path: Path) -> None:
    art = shutil.copytree(dev_model, tmp_path / "art")
    (art / MANIFEST_NAME).unlink()
    with pytest.raises(ArtifactError) as err:
        load_artifact(Settings(artifact=str(art), artifact_manifest_sha256="a" * 64), None)
    assert "no build_manifest.json" in one_line(err)


def test_files_that_differ_from_the_mounted_manifest_refuse_in_one_line(
    dev_model: Path, tmp_path: Path, no_hub: None
) -> None:
    art = shutil.copytree(dev_model, tmp_path / "art")
    weights = art / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF  # same size, one weight byte changed
    weights.write_bytes(bytes(data))
    read_only_copy(art, tmp_path / "mnt")
    try:
        with pytest.raises(ArtifactError) as err:
            load_artifact(
                Settings(artifact=str(tmp_path / "mnt"), cache_dir=str(tmp_path / "c")), None
            )
        assert "model.safetensors" in one_line(err)
    finally:
        writable_again(tmp_path / "mnt")


def test_a_cache_inside_the_read_only_artifact_is_refused(dev_model: Path, tmp_path: Path) -> None:
    art = read_only_copy(dev_model, tmp_path / "mnt")
    try:
        settings = Settings(artifact=str(art), cache_dir=str(art / "cache"))
        with pytest.raises(ArtifactError) as err:
            load_artifact(settings, None)
        assert "inside the read-only artifact" in one_line(err)
    finally:
        writable_again(art)


def test_a_writable_directory_is_not_read_only(tmp_path: Path) -> None:
    assert not artifact_sources.is_read_only(tmp_path)
    tmp_path.chmod(0o555)
    try:
        assert artifact_sources.is_read_only(tmp_path)
    finally:
        tmp_path.chmod(0o755)


@pytest.mark.parametrize("value", ["A" * 64, "0" * 63, "g" * 64, "main"])
def test_the_pin_must_be_a_lower_case_sha256(value: str) -> None:
    with pytest.raises(SettingsError, match="artifact_manifest_sha256"):
        Settings.load({}, env={"MTT_ARTIFACT_MANIFEST_SHA256": value})


MOUNTINFO = """\
22 1 8:1 / / rw,relatime - ext4 /dev/sda1 rw
90 22 0:50 / /models rw - tmpfs tmpfs rw
91 90 0:51 / /models/artifact ro,nosuid,nodev - fuse.gcsfuse bucket ro,user_id=0
92 22 0:52 / /models/artifact\\040two ro - ext4 /dev/sdb ro
junk line without a separator
"""


def test_the_filesystem_type_is_the_nearest_mount(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    info = tmp_path / "mountinfo"
    info.write_text(MOUNTINFO)
    monkeypatch.setattr(artifact_sources, "MOUNTINFO", info)
    monkeypatch.setattr(os.path, "realpath", lambda p: str(p))
    assert artifact_sources.filesystem_type(Path("/models/artifact/rank0.engine")) == "fuse.gcsfuse"
    assert artifact_sources.filesystem_type(Path("/models/artifact two")) == "ext4"
    assert artifact_sources.filesystem_type(Path("/models/other")) == "tmpfs"
    assert artifact_sources.filesystem_type(Path("/srv")) == "ext4"
    monkeypatch.setattr(artifact_sources, "MOUNTINFO", tmp_path / "absent")
    assert artifact_sources.filesystem_type(Path("/srv")) == "unknown"


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=300))
def test_any_mountinfo_text_gives_a_type_never_an_error(text: str) -> None:
    info = Path(os.environ.get("TMPDIR", "/tmp")) / f"mountinfo-fuzz-{os.getpid()}"
    info.write_text(text, errors="surrogateescape")
    old = artifact_sources.MOUNTINFO
    artifact_sources.MOUNTINFO = info
    try:
        assert isinstance(artifact_sources.filesystem_type(Path("/a/b")), str)
    finally:
        artifact_sources.MOUNTINFO = old
        info.unlink()


# ---- the fill Job's module, against the loopback Hub stand-in ---------------------------


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[HubStandIn, str, str]]:
    """A pushed tiny artifact; yields (hub, commit sha, its manifest's sha256)."""
    art = tmp_path_factory.mktemp("tiny") / "art"
    art.mkdir()
    (art / "config.json").write_text('{"model_type": "mistral"}')
    (art / "model.safetensors").write_bytes(b"\0" * 64)
    write_manifest(art, BuildManifest(kind="hf_checkpoint", source_model="m/m"))
    with pytest.MonkeyPatch.context() as mp, HubStandIn(token=TOKEN) as hub:
        mp.setattr(constants, "HF_HUB_DISABLE_XET", True)
        mp.setattr(constants, "ENDPOINT", hub.url)
        template = hub.url + "/{repo_id}/resolve/{revision}/{filename}"
        mp.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", template)
        import huggingface_hub.file_download as file_download

        if hasattr(file_download, "HUGGINGFACE_CO_URL_TEMPLATE"):
            mp.setattr(file_download, "HUGGINGFACE_CO_URL_TEMPLATE", template)
        mp.setattr(hf_http.time, "sleep", lambda seconds: None)
        sha = push_artifact(art, REPO, token=TOKEN, endpoint=hub.url).commit_sha
        yield hub, sha, pin_of(art)


def fill_env(monkeypatch: pytest.MonkeyPatch, revision: str) -> None:
    monkeypatch.setenv("MTT_ARTIFACT", REPO)
    monkeypatch.setenv("MTT_ARTIFACT_REVISION", revision)
    monkeypatch.setenv(artifact_fill.TOKEN_ENV, TOKEN)


def test_the_fill_downloads_verifies_and_prints_the_pin(
    hub: tuple[HubStandIn, str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    standin, sha, pin = hub
    fill_env(monkeypatch, sha)
    into = tmp_path / "weights" / sha
    assert artifact_fill.main(["--into", str(into)]) == 0
    out = capsys.readouterr().out
    assert f"artifact_manifest_sha256: {pin}" in out
    assert (into / "model.safetensors").read_bytes() == b"\0" * 64
    # What it filled loads as the pods will load it: read-only, pinned, no Hub.
    read_only_copy(into, tmp_path / "ro")
    try:
        settings = Settings(
            artifact=str(tmp_path / "ro"), artifact_manifest_sha256=pin, cache_dir=str(tmp_path)
        )
        assert load_artifact(settings, None).manifest is not None
    finally:
        writable_again(tmp_path / "ro")
    # A second run (the Job retried) downloads no file again.
    standin.state.requests.clear()
    assert artifact_fill.main(["--into", str(into)]) == 0
    gets = [r for r in standin.state.requests if r.method == "GET" and "/resolve/" in r.path]
    assert gets == []


def test_the_fill_refuses_a_branch_and_a_bad_token_in_one_line(
    hub: tuple[HubStandIn, str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, sha, _ = hub
    fill_env(monkeypatch, "main")
    assert artifact_fill.main(["--into", str(tmp_path / "a")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "40-hex commit sha" in err
    fill_env(monkeypatch, sha)
    monkeypatch.setenv(artifact_fill.TOKEN_ENV, "hf_wrong")
    assert artifact_fill.main(["--into", str(tmp_path / "b")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "fill failed" in err and "Traceback" not in err
