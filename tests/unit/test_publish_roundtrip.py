"""Push then pull of the dev artifact through the REAL huggingface_hub client, against a
loopback stand-in of the Hub's HTTP routes (tests/hub_standin.py; never the real Hub):
`build.py engine --backend pytorch --dev --push` -> one commit -> snapshot_download of
that commit into a cache -> again with HF_HUB_OFFLINE=1 from the cache -> hashes match
the manifest. The token comes from HF_TOKEN and must never be printed."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hub_standin import HubStandIn
from huggingface_hub import constants

from mistral_build.publish import ArtifactError, push_artifact
from mistral_serving.artifacts.manifest import read_manifest, verify_files

REPO = Path(__file__).resolve().parents[2]
SECRET = "hf_standin_secret_0123456789"
PULL = (
    "import sys; from huggingface_hub import snapshot_download; "
    "print(snapshot_download(sys.argv[1], revision=sys.argv[2], cache_dir=sys.argv[3]))"
)


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch) -> HubStandIn:
    # The stand-in speaks the LFS upload protocol, not Xet (see hub_standin.py).
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)
    with HubStandIn(token=SECRET) as hub:
        yield hub


def client_env(hub_url: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING"))}
    return env | {"HF_ENDPOINT": hub_url, "HF_TOKEN": SECRET, "HF_HUB_DISABLE_XET": "1"} | extra


def pull(
    hub_url: str, repo: str, revision: str, cache: Path, **extra: str
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", PULL, repo, revision, str(cache)], capture_output=True, text=True,
        timeout=120, env=client_env(hub_url, **extra),
    )  # fmt: skip


def test_dev_artifact_push_then_pull_online_and_offline(hub: HubStandIn, tmp_path: Path) -> None:
    out_dir = tmp_path / "dev-artifact"
    build = subprocess.run(
        [sys.executable, "build.py", "engine", "--backend", "pytorch", "--dev",
         "--output-dir", str(out_dir), "--push", "acme/mistral-dev", "--push-revision", "dev"],
        cwd=REPO, capture_output=True, text=True, timeout=300, env=client_env(hub.url),
    )  # fmt: skip
    assert build.returncode == 0, build.stderr[-3000:]
    assert SECRET not in build.stdout and SECRET not in build.stderr
    match = re.search(r"artifact_revision: ([0-9a-f]{40})", build.stdout)
    assert match and "artifact: acme/mistral-dev" in build.stdout
    sha = match.group(1)

    # One commit, authenticated writes, the branch points at it, the repo is private.
    commits = [r for r in hub.state.requests if r.path.endswith("/commit/dev")]
    assert len(commits) == 1
    assert commits[0].headers.get("authorization") == f"Bearer {SECRET}"
    repo = hub.state.repos["acme/mistral-dev"]
    assert repo.private and repo.branches["dev"] == sha

    local = read_manifest(out_dir)
    cache = tmp_path / "cache" / "hub"
    online = pull(hub.url, "acme/mistral-dev", sha, cache)
    assert online.returncode == 0, online.stderr[-3000:]
    snapshot = Path(online.stdout.strip().splitlines()[-1])
    assert snapshot.name == sha
    pulled = read_manifest(snapshot)
    assert pulled == local
    verify_files(snapshot, pulled, hashes=True)
    assert set(pulled.files) <= {p.name for p in snapshot.iterdir()}

    hub.stop()  # nothing to talk to any more: the offline pull must use the cache only
    offline = pull(hub.url, "acme/mistral-dev", sha, cache, HF_HUB_OFFLINE="1")
    assert offline.returncode == 0, offline.stderr[-3000:]
    assert Path(offline.stdout.strip().splitlines()[-1]) == snapshot
    verify_files(snapshot, read_manifest(snapshot), hashes=True)

    missing = pull(hub.url, "acme/mistral-dev", "0" * 40, tmp_path / "empty", HF_HUB_OFFLINE="1")
    assert missing.returncode != 0  # offline and not cached: an error, not an empty dir


def copy_artifact(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_push_is_exactly_the_artifact_and_resumable(hub: HubStandIn, dev_model: Path,
                                                     tmp_path: Path) -> None:  # fmt: skip
    from mistral_serving.artifacts.manifest import write_manifest

    first = copy_artifact(dev_model, tmp_path / "a")
    (first / "rank1.engine").write_bytes(b"x" * 4096)
    write_manifest(first, read_manifest(first).model_copy())
    r1 = push_artifact(first, "acme/engine", token=SECRET, endpoint=hub.url)

    puts_before = sum(r.method == "PUT" for r in hub.state.requests)
    r2 = push_artifact(dev_model, "acme/engine", token=SECRET, endpoint=hub.url)
    puts_after = sum(r.method == "PUT" for r in hub.state.requests)

    repo = hub.state.repos["acme/engine"]
    assert r1.commit_sha != r2.commit_sha and repo.branches["main"] == r2.commit_sha
    tree = repo.commits[r2.commit_sha]
    # The stale file from the first push is gone: the commit is exactly this artifact.
    assert set(tree) == set(read_manifest(dev_model).files) | {
        "build_manifest.json",
        ".gitattributes",
    }
    assert puts_after == puts_before  # large blobs already uploaded were not sent again


def test_refuses_to_push_a_corrupt_artifact(
    hub: HubStandIn, dev_model: Path, tmp_path: Path
) -> None:
    art = copy_artifact(dev_model, tmp_path / "a")
    path = art / "tokenizer_config.json"
    data = bytearray(path.read_bytes())
    data[0] ^= 0x01  # same size, different hash: only the sha256 check can catch it
    path.write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match="corrupt"):
        push_artifact(art, "acme/x", token=SECRET, endpoint=hub.url)
    assert "acme/x" not in hub.state.repos


def test_private_repo_is_not_readable_without_the_token(hub: HubStandIn, dev_model: Path,
                                                        tmp_path: Path) -> None:  # fmt: skip
    result = push_artifact(dev_model, "acme/private", token=SECRET, endpoint=hub.url)
    denied = pull(hub.url, "acme/private", result.commit_sha, tmp_path / "c", HF_TOKEN="")
    assert denied.returncode != 0
    assert "Repository Not Found" in denied.stderr or "RepositoryNotFound" in denied.stderr


def test_resolve_artifact_pulls_the_pushed_commit(hub: HubStandIn, dev_model: Path,
                                                  tmp_path: Path) -> None:  # fmt: skip
    """What load() does: Settings(artifact=repo, artifact_revision=sha) -> local path."""
    result = push_artifact(dev_model, "acme/served", token=SECRET, endpoint=hub.url)
    code = (
        "import sys; from mistral_serving.artifacts.artifact import resolve_artifact; "
        "from mistral_serving.settings import Settings; "
        "s = Settings(artifact=sys.argv[1], artifact_revision=sys.argv[2], cache_dir=sys.argv[3]); "
        "print(resolve_artifact(s, sys.argv[4]))"
    )
    args = [sys.executable, "-c", code, "acme/served", result.commit_sha, str(tmp_path), SECRET]
    env = client_env(hub.url, PYTHONPATH=str(REPO / "mistral-trt-truss" / "packages"))
    online = subprocess.run(args, capture_output=True, text=True, timeout=120, env=env)
    assert online.returncode == 0, online.stderr[-3000:]
    path = Path(online.stdout.strip().splitlines()[-1])
    assert path.name == result.commit_sha and path.is_relative_to(tmp_path / "hub")
    verify_files(path, read_manifest(path), hashes=True)

    hub.stop()
    offline_env = env | {"HF_HUB_OFFLINE": "1"}
    offline = subprocess.run(args, capture_output=True, text=True, timeout=120, env=offline_env)
    assert offline.returncode == 0, offline.stderr[-3000:]
    assert Path(offline.stdout.strip().splitlines()[-1]) == path
