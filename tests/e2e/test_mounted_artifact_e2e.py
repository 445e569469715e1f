"""A mounted artifact through the real Truss server: a read-only copy of the dev model
(`chmod -w`, as a GCS FUSE or ReadOnlyMany mount presents it), pinned by its manifest's
sha256, with every Hub call made to fail, loads and answers; nothing in the copy changes;
/version reports the start's phases. Another pin makes the server exit 1 with the one-line
reason last."""

from __future__ import annotations

import hashlib
import shutil
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import requests

from mistral_build.local_server import LocalServer

pytestmark = pytest.mark.e2e

# A Hub that cannot answer: port 9 (discard) on loopback refuses connections.
NO_HUB = {"HF_HUB_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9"}


def tree_state(path: Path) -> dict[str, tuple[int, int, int, int]]:
    return {
        p.relative_to(path).as_posix(): (s.st_size, s.st_mtime_ns, s.st_ctime_ns, s.st_mode)
        for p in [path, *path.rglob("*")]
        for s in [p.stat()]
    }


@pytest.fixture
def mounted(dev_model: Path, tmp_path: Path) -> Iterator[Path]:
    art = shutil.copytree(dev_model, tmp_path / "mnt" / "artifact")
    for p in [*art.rglob("*"), art]:
        p.chmod(stat.S_IMODE(p.stat().st_mode) & ~0o222)
    yield art
    for p in [art, *art.rglob("*")]:
        p.chmod(stat.S_IMODE(p.stat().st_mode) | 0o200)


def pin_of(path: Path) -> str:
    return hashlib.sha256((path / "build_manifest.json").read_bytes()).hexdigest()


def test_a_read_only_pinned_artifact_serves_with_no_hub(
    start_server: Callable[..., LocalServer], mounted: Path, tmp_path: Path
) -> None:
    before = tree_state(mounted)
    server = start_server(
        extra_env=NO_HUB,
        artifact=str(mounted),
        artifact_manifest_sha256=pin_of(mounted),
        cache_dir=str(tmp_path / "cache"),
    )
    try:
        answer = requests.post(
            server.url + "/v1/models/model:predict",
            json={"prompt": "The capital of France is", "max_new_tokens": 4},
            timeout=60,
        )
        assert answer.status_code == 200, answer.text
        assert answer.json()["usage"]["completion_tokens"] >= 1
        phases = requests.get(server.url + "/version", timeout=10).json()["startup_seconds"]
        assert {"process", "artifact_fetch", "artifact_verify", "engine"} <= set(phases)
    finally:
        server.stop()
    assert tree_state(mounted) == before  # nothing written, created or touched in it
    assert list((tmp_path / "cache" / "verified").glob("*.json"))  # the marker, outside
    log = server.log()
    assert f"artifact {mounted} is read-only" in log


def test_another_pin_exits_1_with_the_reason_last(
    start_server: Callable[..., LocalServer], mounted: Path, tmp_path: Path
) -> None:
    server = start_server(
        wait=False,
        extra_env=NO_HUB,
        artifact=str(mounted),
        artifact_manifest_sha256="0" * 64,
        cache_dir=str(tmp_path / "cache"),
    )
    assert server.process.wait(180) == 1
    last = [line for line in server.log().splitlines() if line.strip()][-1]
    assert "load failed" in last and "not the pinned artifact_manifest_sha256" in last, last
    assert pin_of(mounted) in last
