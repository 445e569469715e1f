"""What a local or mounted artifact directory must satisfy before it is verified and served.

On a fleet the artifact often does not come from the Hub per pod: it is a Cloud Storage
bucket mounted by the GCS FUSE CSI driver, or a pre-populated ReadOnlyMany volume (e.g.
Hyperdisk ML), both read-only. Such a directory is verified exactly as a download is
(`artifacts.open_artifact`: confined, sizes, sha256 once); this module adds what only a
directory that is not fetched by revision needs:

- a pin: `artifact_manifest_sha256` names the sha256 of the build manifest the pod must
  serve (what `build.py copy-to-bucket` and the fill Job print). A bucket object or a
  volume can be rewritten under a running deployment; with the pin a new pod serves the
  same engine or refuses in one line. The manifest's own hashes then cover every file.
- the "verified" marker: it must live where the pod can write, never inside the read-only
  artifact; a cache directory inside the artifact is refused.
"""

from __future__ import annotations

import hashlib
import logging
import os
import stat
from collections.abc import Mapping
from pathlib import Path

from mistral_serving.artifacts.manifest import (
    MANIFEST_NAME,
    ArtifactError,
    FileStat,
    read_json_file,
)
from mistral_serving.settings import ArtifactSettings

log = logging.getLogger(__name__)

MOUNTINFO = Path("/proc/self/mountinfo")


def check_source(path: Path, files: Mapping[str, FileStat], settings: ArtifactSettings) -> None:
    """Refuse, in one line, an artifact that is not the pinned one or whose verified marker
    would have to be written into it; say when it is a read-only mount."""
    check_pin(path, files, settings.artifact_manifest_sha256)
    if is_read_only(path):
        cache = settings.cache_path
        if _inside(cache, path):
            raise ArtifactError(
                f"cache_dir {cache} is inside the read-only artifact {path}: the verified "
                "marker must be written elsewhere; set cache_dir to a writable volume"
            )
        log.info(
            "artifact %s is read-only (%s): verified as a download is, marker under %s",
            path,
            filesystem_type(path),
            cache,
        )


def check_pin(path: Path, files: Mapping[str, FileStat], pinned: str | None) -> None:
    if pinned is None:
        return
    if MANIFEST_NAME not in files:
        raise ArtifactError(
            f"{path} has no {MANIFEST_NAME} but artifact_manifest_sha256 pins one: the "
            "directory is not the artifact this deployment serves"
        )
    actual = manifest_sha256(path)
    if actual != pinned:
        raise ArtifactError(
            f"{path / MANIFEST_NAME} has sha256 {actual}, not the pinned "
            f"artifact_manifest_sha256 {pinned}: the mounted artifact is another build; "
            "mount the pinned one or pin this one"
        )


def manifest_sha256(path: Path) -> str:
    """The sha256 of an artifact's build manifest: what a mounted artifact is pinned by."""
    return hashlib.sha256(read_json_file(path / MANIFEST_NAME, "build manifest")).hexdigest()


def is_read_only(path: Path) -> bool:
    """A read-only mount (GCS FUSE with `readOnly`, a ReadOnlyMany claim), or a directory
    whose write bits are all off (`chmod -w`: read-only by intent, even for root)."""
    try:
        if os.statvfs(path).f_flag & os.ST_RDONLY:
            return True
        return not stat.S_IMODE(path.stat().st_mode) & 0o222
    except OSError:
        return False


def filesystem_type(path: Path) -> str:
    """The filesystem the directory is on (`fuse.gcsfuse`, `ext4`, ...) from
    /proc/self/mountinfo: the longest mount point above it. 'unknown' when unreadable."""
    try:
        lines = MOUNTINFO.read_text(errors="replace").splitlines()
    except OSError:
        return "unknown"
    real = os.path.realpath(path)
    best, best_type = "", "unknown"
    for line in lines:
        # ID PARENT MAJ:MIN ROOT MOUNT_POINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER
        left, sep, right = line.partition(" - ")
        fields = left.split()
        if not sep or len(fields) < 5 or not right.split():
            continue
        point = fields[4].replace("\\040", " ")
        if _inside(Path(real), Path(point)) and len(point) > len(best):
            best, best_type = point, right.split()[0]
    return best_type


def _inside(child: Path, parent: Path) -> bool:
    try:
        Path(os.path.realpath(child)).relative_to(os.path.realpath(parent))
    except ValueError:
        return False
    return True
