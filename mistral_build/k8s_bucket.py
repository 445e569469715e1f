"""`python build.py copy-to-bucket`: put a built artifact in Cloud Storage for the pods'
GCS FUSE mount (`artifact_source: gcsfuse`), and print the pin they load it by.

1. Verify the local artifact exactly as a pod will (`open_artifact`: confined, sizes, every
   sha256 against its build manifest): a broken build never reaches the bucket.
2. `gcloud storage rsync --recursive` every file but the build manifest: gcloud shows
   progress, uploads large files in parallel resumable pieces, and a re-run copies only
   what is missing or different, so an interrupted copy resumes.
3. `gcloud storage cp` the build manifest last. Until it is there, a pinned pod refuses the
   folder in one line (no manifest) instead of serving half an engine.
4. Print `artifact_manifest_sha256` for the values file.

`--dry-run` (and a machine without gcloud) prints the commands instead of running them.
"""

from __future__ import annotations

import argparse
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from mistral_serving.artifacts.artifact import open_artifact
from mistral_serving.artifacts.manifest import MANIFEST_NAME, ArtifactError
from mistral_serving.artifacts.sources import manifest_sha256
from mistral_serving.settings import Settings

_DESTINATION = re.compile(
    r"^gs://(?P<bucket>[a-z0-9][a-z0-9._-]{1,220}[a-z0-9])/(?P<path>([A-Za-z0-9._-]+/)*[A-Za-z0-9._-]+)/?$"
)


class CopyError(ValueError):
    """The copy cannot start; the message is one line."""


def parse_destination(value: str) -> tuple[str, str]:
    """gs://BUCKET/PATH -> (bucket, path): the values file's gcsfuse.bucket and .path."""
    match = _DESTINATION.fullmatch(value)
    if not match or any(p in (".", "..") for p in match["path"].split("/")):
        raise CopyError(
            f"--to {value!r}: expected gs://BUCKET/FOLDER (a folder, not the bucket's root: "
            "the pods mount only that folder)"
        )
    return match["bucket"], match["path"]


def verified_pin(artifact_dir: Path) -> str:
    """Verify the artifact as a pod would; return its build manifest's sha256."""
    if not (artifact_dir / MANIFEST_NAME).is_file():
        raise CopyError(f"{artifact_dir} has no {MANIFEST_NAME}: the pods could not pin it")
    with tempfile.TemporaryDirectory() as scratch:  # the marker is not wanted here
        open_artifact(artifact_dir, Settings(artifact=str(artifact_dir), cache_dir=scratch))
    return manifest_sha256(artifact_dir)


def copy_commands(artifact_dir: Path, destination: str) -> list[list[str]]:
    """Everything but the manifest (resumable, with progress), then the manifest."""
    dest = destination.rstrip("/")
    return [
        [
            "gcloud",
            "storage",
            "rsync",
            "--recursive",
            f"--exclude=^{re.escape(MANIFEST_NAME)}$",
            str(artifact_dir),
            dest,
        ],
        ["gcloud", "storage", "cp", str(artifact_dir / MANIFEST_NAME), f"{dest}/{MANIFEST_NAME}"],
    ]


def copy_command(args: argparse.Namespace) -> int:
    artifact_dir = Path(args.artifact_dir)
    try:
        bucket, path = parse_destination(args.to)
        if not artifact_dir.is_dir():
            raise CopyError(f"--artifact-dir {artifact_dir} is not a directory")
        pin = verified_pin(artifact_dir)
    except (CopyError, ArtifactError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    commands = copy_commands(artifact_dir, args.to)
    print(f"verified {artifact_dir}: every file matches its build manifest")
    run = not args.dry_run and shutil.which("gcloud") is not None
    for command in commands:
        print(("+ " if run else "") + shlex.join(command), flush=True)
        if run and subprocess.run(command, check=False).returncode != 0:
            print(
                "error: the copy stopped; run the same command again to resume (the build "
                "manifest is copied last, so pinned pods refuse the folder until then)",
                file=sys.stderr,
            )
            return 1
    if not run and not args.dry_run:
        print("error: gcloud is not on PATH: run the commands above where it is", file=sys.stderr)
        return 2
    print("values file:")
    print(f"  artifact_source: gcsfuse\n  gcsfuse: {{bucket: {bucket}, path: {path}}}")
    print(f"  artifact_manifest_sha256: {pin}")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "copy-to-bucket",
        help="Copy a built artifact to gs://BUCKET/FOLDER for the pods' GCS FUSE mount.",
    )
    p.add_argument("--artifact-dir", required=True, help="The built artifact (engine dir).")
    p.add_argument("--to", required=True, metavar="gs://BUCKET/FOLDER", help="Destination.")
    p.add_argument("--dry-run", action="store_true", help="Print the commands; run nothing.")
    p.set_defaults(func=copy_command)
