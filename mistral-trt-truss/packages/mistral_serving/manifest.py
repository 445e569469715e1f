"""The build manifest: a record, written next to every artifact, of what was built,
from what, with which versions and for which GPU; `load()` checks it before serving."""

from __future__ import annotations

import hashlib
import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

MANIFEST_NAME = "build_manifest.json"
FORMAT_VERSION = 1

ArtifactKind = Literal["trtllm_engine", "hf_checkpoint"]


class FileRecord(BaseModel):
    size: int
    sha256: str


class GpuRecord(BaseModel):
    name: str
    compute_capability: str  # "8.0" for A100, "9.0" for H100/H200


class BuildManifest(BaseModel):
    model_config = ConfigDict(extra="allow")

    format_version: int = FORMAT_VERSION
    kind: ArtifactKind
    source_model: str
    source_revision: str | None = None
    created_at: str = Field(default_factory=lambda: datetime.now(timezone.utc).isoformat())
    versions: dict[str, str] = Field(default_factory=dict)  # package -> version
    gpu: GpuRecord | None = None  # None: not tied to a GPU (PyTorch checkpoint)
    build_options: dict[str, Any] = Field(default_factory=dict)
    files: dict[str, FileRecord] = Field(default_factory=dict)  # relative path -> record


class ManifestError(ValueError):
    """The manifest is missing, unreadable, or disagrees with the files."""


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def record_files(artifact_dir: Path) -> dict[str, FileRecord]:
    """Size and hash of every file under the artifact, the manifest itself excluded."""
    records = {}
    for path in sorted(artifact_dir.rglob("*")):
        rel = path.relative_to(artifact_dir).as_posix()
        if path.is_file() and rel != MANIFEST_NAME and not rel.startswith("."):
            records[rel] = FileRecord(size=path.stat().st_size, sha256=sha256_file(path))
    return records


def write_manifest(artifact_dir: Path, manifest: BuildManifest) -> Path:
    manifest = manifest.model_copy(update={"files": record_files(artifact_dir)})
    path = artifact_dir / MANIFEST_NAME
    path.write_text(json.dumps(manifest.model_dump(mode="json"), indent=2) + "\n")
    return path


def read_manifest(artifact_dir: Path) -> BuildManifest | None:
    path = artifact_dir / MANIFEST_NAME
    if not path.exists():
        return None
    try:
        return BuildManifest.model_validate_json(path.read_text())
    except ValidationError as exc:  # one line: the first problem is enough to act on
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "file"
        raise ManifestError(
            f"{path}: unreadable build manifest ({where}: {first['msg']})"
        ) from None


def verify_files(artifact_dir: Path, manifest: BuildManifest, hashes: bool = True) -> None:
    """Raise ManifestError naming the first file that is missing or differs."""
    for rel, record in manifest.files.items():
        path = artifact_dir / rel
        if not path.is_file():
            raise ManifestError(f"{path}: listed in {MANIFEST_NAME} but missing")
        if path.stat().st_size != record.size:
            raise ManifestError(
                f"{path}: size {path.stat().st_size} differs from the manifest's {record.size}"
            )
        if hashes and sha256_file(path) != record.sha256:
            raise ManifestError(f"{path}: sha256 differs from {MANIFEST_NAME} (corrupt download?)")


def describe(manifest: BuildManifest) -> str:
    """One line for logs and model metadata: what was built, from what, for which GPU."""
    source = manifest.source_model
    if manifest.source_revision:
        source += f"@{manifest.source_revision[:12]}"
    opts = manifest.build_options
    parts = [manifest.kind, source]
    precision = opts.get("quantization") or "none"
    parts.append(opts.get("dtype", "?") + ("" if precision == "none" else f"+{precision}"))
    if "tp_size" in opts:
        parts.append(f"tp{opts['tp_size']}")
    limits = [
        f"{k}={opts[k]}" for k in ("max_batch_size", "max_input_len", "max_seq_len") if k in opts
    ]
    parts.extend(limits)
    if manifest.gpu is not None:
        parts.append(f"gpu={manifest.gpu.name} (sm {manifest.gpu.compute_capability})")
    versions = ", ".join(f"{k} {v}" for k, v in sorted(manifest.versions.items()))
    if versions:
        parts.append(versions)
    parts.append(f"{len(manifest.files)} files, {total_size(manifest) / 1e9:.2f} GB")
    parts.append(f"built {manifest.created_at[:19]}Z")
    return "; ".join(parts)


def total_size(manifest: BuildManifest) -> int:
    return sum(record.size for record in manifest.files.values())
