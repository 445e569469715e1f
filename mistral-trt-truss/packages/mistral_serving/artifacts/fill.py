"""`python3 -m mistral_serving.artifacts.fill --into DIR`: fill a volume with the artifact once.

The fill Job (`k8s/weights/fill-job.yaml`) runs this in the serving image on a writable
volume that later serves every pod read-only (ReadOnlyMany, e.g. Hyperdisk ML): the Hub is
read once per volume, not once per pod. It downloads `artifact`@`artifact_revision` (the
pod's own settings, `MTT_*`) into DIR with huggingface_hub, which shows progress and
resumes: a re-run skips the files already complete. It then verifies DIR exactly as a
pod will (`artifacts.open_artifact`: confined, sizes, every sha256) and prints the build
manifest's sha256, the `artifact_manifest_sha256` that pins the volume for the pods.
Exit 0 when verified, 1 with one line when anything fails.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from mistral_serving.artifacts.artifact import COMMIT_SHA, download, open_artifact
from mistral_serving.artifacts.manifest import MANIFEST_NAME, ArtifactError
from mistral_serving.artifacts.sources import manifest_sha256
from mistral_serving.settings import Settings, SettingsError

TOKEN_ENV = "TRUSS_SECRET_hf_access_token"  # the pod's own secret variable


def fill(settings: Settings, into: Path, token: str | None) -> str:
    """Download repo@revision into `into`, verify it, return the manifest's sha256."""
    repo, revision = settings.artifact, settings.artifact_revision
    if not repo or not revision or not COMMIT_SHA.match(revision):
        raise SettingsError(
            "the fill needs artifact (a repo id) and artifact_revision (its 40-hex commit sha)"
        )
    into.mkdir(parents=True, exist_ok=True)
    download(repo, revision, settings.cache_path, token, into=into)
    if not (into / MANIFEST_NAME).is_file():
        raise ArtifactError(f"{repo}@{revision} has no {MANIFEST_NAME}: nothing to pin it by")
    # Verified as a pod verifies it; the marker goes to a scratch dir, not the volume.
    with tempfile.TemporaryDirectory() as scratch:
        checked = settings.model_copy(update={"cache_dir": scratch, "verify_hashes": True})
        open_artifact(into, checked)
    return manifest_sha256(into)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m mistral_serving.artifacts.fill")
    parser.add_argument("--into", type=Path, required=True, help="Directory on the volume.")
    args = parser.parse_args(argv)
    try:
        settings = Settings.load({})
        sha = fill(settings, args.into, os.environ.get(TOKEN_ENV) or None)
    except (ArtifactError, SettingsError) as exc:
        print(f"fill failed: {exc}", file=sys.stderr)
        return 1
    print(f"filled and verified {args.into}: {settings.artifact}@{settings.artifact_revision}")
    print(f"artifact_manifest_sha256: {sha}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
