"""prefetch.py: the artifact's large files read on background threads at process start,
never failing a start; and the launcher starting it before the engine's imports."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mistral_serving import prefetch
from mistral_serving.artifacts import cached_snapshot, local_directory
from mistral_serving.settings import ArtifactSettings

ROOT = Path(__file__).resolve().parents[2]
MiB = 2**20


def artifact(tmp_path: Path) -> Path:
    d = tmp_path / "art"
    d.mkdir()
    (d / "config.json").write_text("{}")  # small: left to the loader
    (d / "model-00002-of-00002.safetensors").write_bytes(os.urandom(3 * MiB + 5))
    (d / "model-00001-of-00002.safetensors").write_bytes(os.urandom(prefetch.MIN_FILE_BYTES))
    (d / "engines").mkdir()
    (d / "engines" / "rank0.engine").write_bytes(os.urandom(2 * MiB))
    return d


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(prefetch, "CHUNK_BYTES", MiB // 2)  # many chunks over few readers


@pytest.fixture
def thread_errors() -> list[BaseException | None]:
    seen: list[BaseException | None] = []
    old = threading.excepthook
    threading.excepthook = lambda args: seen.append(args.exc_value)
    yield seen
    threading.excepthook = old


def test_reads_every_byte_of_the_large_files_in_name_order(
    tmp_path: Path, small_chunks: None, thread_errors: list
) -> None:
    d = artifact(tmp_path)
    job = prefetch.start(d)
    assert job is not None
    assert job.wait(60)
    names = [p.relative_to(d).as_posix() for p, _ in job.files]
    assert names == [
        "engines/rank0.engine",
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    ]
    assert job.bytes_read == job.total_bytes == (2 + 1 + 3) * MiB + 5
    assert thread_errors == []


def test_a_symlink_out_of_the_artifact_is_not_followed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    d = artifact(tmp_path)
    secret = tmp_path / "elsewhere.bin"
    secret.write_bytes(b"x" * (2 * MiB))
    (d / "evil.safetensors").symlink_to(secret)
    with caplog.at_level(logging.INFO, logger="mistral_serving.prefetch"):
        assert prefetch.start(d) is None
    assert "prefetch skipped" in caplog.text and "evil.safetensors" in caplog.text


def test_skipped_when_the_files_would_not_stay_in_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    d = artifact(tmp_path)
    monkeypatch.setattr(prefetch, "page_cache_room", lambda: 6 * MiB)  # 6 MiB > 0.8 x room
    with caplog.at_level(logging.INFO, logger="mistral_serving.prefetch"):
        assert prefetch.start(d) is None
    assert "would not stay in the page cache" in caplog.text
    monkeypatch.setattr(prefetch, "page_cache_room", lambda: 100 * MiB)
    job = prefetch.start(d)
    assert job is not None and job.wait(60)


def test_a_read_error_ends_the_prefetch_quietly(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    small_chunks: None,
    thread_errors: list,
) -> None:
    d = artifact(tmp_path)
    real_open = os.open

    def failing_open(path: object, *args: object) -> int:
        if str(path).endswith("00002.safetensors"):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(prefetch.os, "open", failing_open)
    with caplog.at_level(logging.INFO, logger="mistral_serving.prefetch"):
        job = prefetch.start(d)
        assert job is not None and job.wait(60)
    assert "prefetch stopped" in caplog.text
    assert job.bytes_read < job.total_bytes
    assert thread_errors == []  # nothing escaped a reader thread


def test_nothing_to_read(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    assert prefetch.start(tmp_path) is None
    assert prefetch.start(tmp_path / "missing") is None


# ---- the memory the page cache may use ----


def test_memory_texts() -> None:
    assert prefetch.mem_available("MemTotal: 9 kB\nMemAvailable:   123 kB\n") == 123 * 1024
    assert prefetch.mem_available("MemAvailable: 12 MB\n") is None
    assert prefetch.mem_available("MemAvailable: ²3 kB\n") is None
    assert prefetch.mem_available(None) is None
    assert prefetch.cgroup_room("1000\n", "400\n") == 600
    assert prefetch.cgroup_room("max\n", "400\n") is None
    assert prefetch.cgroup_room(str(2**63 - 4096), "1") is None  # cgroup v1's "no limit"
    assert prefetch.cgroup_room("100", "400") == 0
    assert prefetch.cgroup_room("+100", "4") is None
    room = prefetch.page_cache_room()  # this machine's own files
    assert room is None or room >= 0


@given(st.text(max_size=300), st.text(max_size=40), st.text(max_size=40))
def test_memory_texts_never_raise(meminfo: str, limit: str, usage: str) -> None:
    got = prefetch.mem_available(meminfo)
    assert got is None or got >= 0
    room = prefetch.cgroup_room(limit, usage)
    assert room is None or room >= 0


# ---- where the launcher finds a local artifact ----


def test_local_directory(tmp_path: Path) -> None:
    d = artifact(tmp_path)
    assert local_directory(ArtifactSettings(artifact=str(d))) == d
    assert local_directory(ArtifactSettings(artifact=str(tmp_path / "nope"))) is None
    assert local_directory(ArtifactSettings(artifact="")) is None
    sha = "a" * 40
    repo = ArtifactSettings(artifact="org/model", artifact_revision=sha, cache_dir=str(tmp_path))
    assert local_directory(repo) is None  # not downloaded yet: nothing to read
    cached_snapshot("org/model", sha, tmp_path).mkdir(parents=True)
    assert local_directory(repo) == cached_snapshot("org/model", sha, tmp_path)
    tag = ArtifactSettings(artifact="org/model", artifact_revision="v1", cache_dir=str(tmp_path))
    assert local_directory(tag) is None  # a tag's snapshot is named by its commit


@given(st.text(max_size=80), st.one_of(st.none(), st.text(max_size=45)))
def test_local_directory_never_raises(name: str, revision: str | None) -> None:
    try:
        settings = ArtifactSettings(artifact=name, artifact_revision=revision)
    except ValueError:
        return  # refused by the settings themselves
    got = local_directory(settings)
    assert got is None or got.is_dir()


LAUNCH = r"""
import json, sys
from mistral_serving import server as ours

starts = []
ours.prefetch.start = lambda d: starts.append({"dir": str(d), "torch": "torch" in sys.modules})
ours.serve = lambda server, settings: None  # only what main does before serving matters
code = ours.main()
print(json.dumps({"starts": starts, "code": code}))
"""


@pytest.mark.parametrize("enabled", ["true", "false"])
def test_the_launcher_prefetches_before_the_engine_imports(
    app_context: Path, tmp_path: Path, enabled: str
) -> None:
    d = artifact(tmp_path)
    app = app_context / "app"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "mistral-trt-truss/packages"), str(app)])
    env.update(MTT_ARTIFACT=str(d), MTT_PREFETCH_ARTIFACT=enabled)
    out = subprocess.run(
        [sys.executable, "-c", LAUNCH],
        cwd=app,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    want = [{"dir": str(d), "torch": False}] if enabled == "true" else []
    assert seen == {"starts": want, "code": 0}
