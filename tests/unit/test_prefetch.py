"""prefetch.py: every chunk of the artifact's weight files is read once per process, from
background threads; only files inside the artifact (a local directory or a pinned Hub
snapshot) are read; any setting value gives a list or nothing, never an exception."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mistral_serving import prefetch
from mistral_serving.prefetch import artifact_weight_files, prefetch_artifact, prefetch_files
from mistral_serving.settings import Settings

SHA = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(autouse=True)
def fresh_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(prefetch, "_started", set())


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """Every (file, offset) the prefetch threads read, recorded through os.preadv."""
    seen: list[tuple[str, int]] = []
    names: dict[int, str] = {}
    real_open, real_preadv = os.open, os.preadv
    lock = threading.Lock()

    def opened(path, flags, *args):
        fd = real_open(path, flags, *args)
        names[fd] = str(path)
        return fd

    def preadv(fd, buffers, offset):
        with lock:
            seen.append((names[fd], offset))
        return real_preadv(fd, buffers, offset)

    monkeypatch.setattr(prefetch.os, "open", opened)
    monkeypatch.setattr(prefetch.os, "preadv", preadv)
    return seen


def join_prefetch_threads() -> None:
    for thread in threading.enumerate():
        if thread.name.startswith("prefetch-"):
            thread.join()


def artifact(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text("{}")
    (root / "model-00001-of-00002.safetensors").write_bytes(b"a" * 2500)
    (root / "model-00002-of-00002.safetensors").write_bytes(b"b" * 1000)
    (root / "rank0.engine").write_bytes(b"e" * 10)
    return root


def test_every_chunk_is_read_once_and_a_second_start_reads_nothing(
    tmp_path: Path, reads: list[tuple[str, int]]
) -> None:
    files = artifact_weight_files(Settings(artifact=str(artifact(tmp_path / "a"))))
    assert sorted(p.name for p in files) == [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        "rank0.engine",
    ]
    assert prefetch_files(files, threads=3, chunk=1000) == 3
    join_prefetch_threads()
    expected = {(str(p), off) for p in files for off in range(0, p.stat().st_size, 1000)}
    assert sorted(reads) == sorted(expected)  # each chunk once: 3 + 1 + 1
    assert prefetch_files(files, threads=3, chunk=1000) == 0
    join_prefetch_threads()
    assert len(reads) == len(expected)


def test_no_threads_reads_nothing(tmp_path: Path, reads: list[tuple[str, int]]) -> None:
    root = artifact(tmp_path / "a")
    prefetch_artifact(Settings(artifact=str(root), load_prefetch_threads=0))
    assert prefetch_files(sorted(root.glob("*.safetensors")), threads=0) == 0
    join_prefetch_threads()
    assert reads == []


def test_a_file_that_vanishes_stops_the_reads_quietly(
    tmp_path: Path, reads: list[tuple[str, int]]
) -> None:
    root = artifact(tmp_path / "a")
    files = artifact_weight_files(Settings(artifact=str(root)))
    files[0].unlink()
    prefetch_files(files, threads=1, chunk=1000)
    join_prefetch_threads()
    assert all(name != str(files[0]) for name, _ in reads)


def test_a_symlink_out_of_the_artifact_means_no_prefetch(tmp_path: Path) -> None:
    root = artifact(tmp_path / "a")
    secret = tmp_path / "secret.safetensors"
    secret.write_bytes(b"s")
    (root / "extra.safetensors").symlink_to(secret)
    assert artifact_weight_files(Settings(artifact=str(root))) == []


def test_a_pinned_hub_snapshot_in_the_cache_is_found(tmp_path: Path) -> None:
    repo = tmp_path / "cache" / "hub" / "models--owner--name"
    blob = repo / "blobs" / "abc"
    blob.parent.mkdir(parents=True)
    blob.write_bytes(b"w" * 10)
    snapshot = repo / "snapshots" / SHA
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (snapshot / "model.safetensors").symlink_to(blob)
    pinned = Settings(
        artifact="owner/name", artifact_revision=SHA, cache_dir=str(tmp_path / "cache")
    )
    assert artifact_weight_files(pinned) == [snapshot / "model.safetensors"]
    branch = pinned.model_copy(update={"artifact_revision": "main"})
    assert artifact_weight_files(branch) == []  # a moving name is not looked up
    other = pinned.model_copy(update={"artifact": "owner/other"})
    assert artifact_weight_files(other) == []  # not downloaded yet: nothing to read


@settings(max_examples=200, deadline=None)
@given(
    artifact=st.text(max_size=60),
    revision=st.one_of(st.none(), st.text(max_size=45), st.just(SHA)),
)
def test_any_artifact_setting_gives_a_list(artifact: str, revision: str | None) -> None:
    try:
        values = Settings(artifact=artifact, artifact_revision=revision, cache_dir="/nonexistent")
    except ValueError:
        return
    assert isinstance(artifact_weight_files(values), list)


def test_the_launcher_starts_the_reads_before_importing_truss(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # truss_server is not importable here: had main imported it first, this would be an
    # ImportError, not the stop below.
    from mistral_serving import server

    seen: list[Settings] = []

    def stop(settings: Settings) -> int:
        seen.append(settings)
        raise SystemExit(7)

    monkeypatch.setattr(server, "prefetch_artifact", stop)
    config = tmp_path / "config.yaml"
    config.write_text(
        json.dumps({"model_metadata": {"artifact": str(tmp_path), "load_prefetch_threads": 2}})
    )
    with pytest.raises(SystemExit) as exit_:
        server.main(str(config))
    assert exit_.value.code == 7
    assert seen[0].load_prefetch_threads == 2 and seen[0].artifact == str(tmp_path)
