"""The build manifest and the files it names.

The manifest is a record, written next to every artifact, of what was built, from what,
with which versions and for which GPU, and the size and sha256 of every file. `load()`
checks the artifact against it before serving.

Everything here treats the artifact as untrusted input: a manifest entry must be a plain
relative path (no absolute path, no `..`, no control characters, no backslash), and the
files on disk are listed without following any symlink out of the artifact (a symlink's
target is computed and checked BEFORE anything at it is touched), so a crafted manifest or
directory cannot make load() open, hash or even stat a file elsewhere. Every failure is an
`ArtifactError` whose message is one line that names the entry.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError

MANIFEST_NAME = "build_manifest.json"
CONFIG_NAME = "config.json"  # of an engine directory and of a checkpoint alike
FORMAT_VERSION = 1

# Bounds on untrusted input: a real manifest is a few kB, a real artifact a few hundred files.
MAX_JSON_BYTES = 16 << 20
MAX_NAME_CHARS = 1024
MAX_COMPONENT_BYTES = 255  # NAME_MAX of every Linux filesystem we serve from
MAX_FILES = 100_000
MAX_DEPTH = 32
MAX_LINK_HOPS = 40  # the kernel's own limit (MAXSYMLINKS)

ArtifactKind = Literal["trtllm_engine", "hf_checkpoint"]


def is_engine_config(config: dict[str, Any]) -> bool:
    """The LLM API's test: an engine config has both sections (`get_model_format`)."""
    return all(isinstance(config.get(s), dict) for s in ("pretrained_config", "build_config"))


class ArtifactError(RuntimeError):
    """The artifact cannot be found, fetched, trusted or served here. The message is one
    line that names what is wrong and what to do: a failed load logs it last."""


class ManifestError(ArtifactError):
    """The manifest is unreadable, names a file it may not, or disagrees with the files."""


def shown(value: object, limit: int = 160) -> str:
    """`value` as it may appear inside a one-line message: non-printable characters escaped
    (a newline or NUL in a crafted name cannot break the line) and the length bounded."""
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(value))
    if len(text) > limit:
        text = f"{text[:limit]}...({len(text) - limit} more chars)"
    return text


class FileRecord(BaseModel):
    size: StrictInt = Field(ge=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class GpuRecord(BaseModel):
    name: str
    compute_capability: str  # "8.0" for A100, "9.0" for H100/H200


class BuildManifest(BaseModel):
    model_config = ConfigDict(extra="allow")

    format_version: int = FORMAT_VERSION
    kind: ArtifactKind
    source_model: str
    source_revision: str | None = None
    created_at: str = Field(default_factory=lambda: datetime.now(UTC).isoformat())
    versions: dict[str, str] = Field(default_factory=dict)  # package -> version
    gpu: GpuRecord | None = None  # None: not tied to a GPU (PyTorch checkpoint)
    build_options: dict[str, Any] = Field(default_factory=dict)
    files: dict[str, FileRecord] = Field(default_factory=dict)  # relative path -> record


# ---- names ---------------------------------------------------------------------------


def name_problem(name: str) -> str | None:
    """Why `name` is not a plain relative POSIX path inside a directory; None if it is."""
    if not name:
        return "empty name"
    if len(name) > MAX_NAME_CHARS:
        return f"longer than {MAX_NAME_CHARS} characters"
    try:
        name.encode()
    except UnicodeEncodeError:  # a lone surrogate: os.fsdecode's stand-in for a bad byte
        return "not valid UTF-8"
    if any(not c.isprintable() for c in name):
        return "control or non-printable character in the name"
    if "\\" in name:
        return "backslash in the name (entries use /)"
    if name.startswith("/") or (len(name) > 1 and name[1] == ":" and name[0].isalpha()):
        return "absolute path"
    for part in name.split("/"):
        if part in ("", ".", ".."):
            return f"{part or 'empty'!r} path component"
        if len(part.encode()) > MAX_COMPONENT_BYTES:
            return f"a path component longer than {MAX_COMPONENT_BYTES} bytes"
    return None


def check_name(name: str, where: str) -> str:
    problem = name_problem(name)
    if problem is not None:
        raise ManifestError(
            f"{where}: entry '{shown(name)}' refused ({problem}): an artifact may only name "
            "files inside itself"
        )
    return name


# ---- the files of an artifact, confined --------------------------------------------------


@dataclass(frozen=True)
class FileStat:
    """What a later start compares to decide that a file has not changed since it was hashed."""

    size: int
    mtime_ns: int
    ctime_ns: int  # cannot be set back by `touch`: catches a rewrite that restores mtime
    inode: int
    device: int

    @classmethod
    def of(cls, st: os.stat_result) -> FileStat:
        return cls(st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev)


def allowed_roots(artifact_dir: Path) -> tuple[Path, ...]:
    """Where the files of `artifact_dir` may live: the directory itself and, for a Hugging
    Face cache snapshot (`models--o--n/snapshots/<sha>`, whose files are symlinks to
    `../../blobs/<hash>`), that repo's `blobs` folder; nothing else of the cache."""
    root = Path(os.path.realpath(artifact_dir))
    repo = root.parent.parent
    if root.parent.name == "snapshots" and repo.name.startswith("models--"):
        blobs = repo / "blobs"
        if blobs.is_dir() and not blobs.is_symlink():
            return root, blobs
    return (root,)


def _inside(path: Path, roots: Sequence[Path]) -> bool:
    return any(path == r or path.is_relative_to(r) for r in roots)


def _follow(link: Path, rel: str, roots: Sequence[Path]) -> os.stat_result:
    """Stat of the file a symlink finally names, refusing any hop that leaves `roots`.

    `link`'s parent is a real directory inside a root (roots are real paths and the scan
    descends only into real directories), so the target can be normalised lexically; it is
    checked against the roots before it is looked at, and every directory on the way to it
    must be a real directory, so the next hop starts from a known place again."""
    current = link
    for _ in range(MAX_LINK_HOPS):
        target = os.readlink(current)
        candidate = Path(os.path.normpath(os.path.join(current.parent, target)))
        if not _inside(candidate, roots):
            raise ManifestError(
                f"{shown(rel)}: symlink to '{shown(target)}', outside the artifact; refused "
                "(copy the file into the artifact instead)"
            )
        root = next(r for r in roots if candidate == r or candidate.is_relative_to(r))
        walked = root
        for part in candidate.relative_to(root).parts[:-1]:
            walked = walked / part
            st = _lstat(walked, rel)
            if not stat.S_ISDIR(st.st_mode):  # a link or a file halfway: do not go on
                raise ManifestError(
                    f"{shown(rel)}: symlink through '{shown(walked.name)}', which is not a "
                    "plain directory; refused"
                )
        st = _lstat(candidate, rel)
        if stat.S_ISLNK(st.st_mode):
            current = candidate
            continue
        if stat.S_ISDIR(st.st_mode):
            raise ManifestError(
                f"{shown(rel)}: symlink to a directory; refused (artifacts hold files: copy "
                "the directory in)"
            )
        return st
    raise ManifestError(f"{shown(rel)}: more than {MAX_LINK_HOPS} symlink hops (a loop?)")


def _lstat(path: Path, rel: str) -> os.stat_result:
    try:
        return os.lstat(path)
    except FileNotFoundError:
        raise ManifestError(f"{shown(rel)}: missing (a dangling symlink?)") from None
    except OSError as exc:
        raise ManifestError(f"{shown(rel)}: cannot be read ({shown(exc.strerror)})") from None


def scan_files(artifact_dir: Path) -> dict[str, FileStat]:
    """Every regular file of the artifact by relative POSIX name, with its stat.

    Refuses (one line naming the entry) an odd name, a symlink whose target leaves
    `allowed_roots`, a symlink to a directory, and anything that is not a regular file or a
    directory (FIFO, socket, device: opening one could block or read a device)."""
    roots = allowed_roots(artifact_dir)
    files: dict[str, FileStat] = {}

    def walk(directory: Path, prefix: str, depth: int) -> None:
        if depth > MAX_DEPTH:
            raise ManifestError(f"{shown(prefix)}: nested deeper than {MAX_DEPTH} folders")
        try:
            with os.scandir(directory) as it:
                names = sorted(entry.name for entry in it)
        except OSError as exc:
            where = shown(prefix or str(directory))
            raise ManifestError(f"{where}: cannot list ({shown(exc.strerror)})") from None
        for name in names:
            rel = prefix + name
            check_name(rel, str(artifact_dir))
            path = directory / name
            st = _lstat(path, rel)
            if stat.S_ISLNK(st.st_mode):
                st = _follow(path, rel, roots)
            if stat.S_ISDIR(st.st_mode):
                walk(path, rel + "/", depth + 1)
            elif stat.S_ISREG(st.st_mode):
                if len(files) >= MAX_FILES:
                    raise ManifestError(f"{artifact_dir}: more than {MAX_FILES} files")
                files[rel] = FileStat.of(st)
            else:
                raise ManifestError(
                    f"{shown(rel)}: not a regular file (FIFO, socket or device); refused"
                )

    walk(roots[0], "", 0)
    return files


def read_json_file(path: Path, what: str) -> bytes:
    """The bytes of a small JSON file that `scan_files` listed (so it is confined)."""
    size = path.stat().st_size
    if size > MAX_JSON_BYTES:
        raise ManifestError(f"{path}: {size} bytes; a {what} is at most {MAX_JSON_BYTES} bytes")
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ManifestError(f"{path}: cannot be read ({shown(exc.strerror)})") from None


def parse_json_object(data: bytes, where: str) -> dict[str, Any]:
    """A JSON object from untrusted bytes (config.json), or ManifestError with one line."""
    try:
        value = json.loads(data)
    except (ValueError, RecursionError) as exc:  # bad UTF-8, bad JSON, absurd nesting
        raise ManifestError(f"{where}: not valid JSON ({shown(exc, 100)})") from None
    if not isinstance(value, dict):
        raise ManifestError(f"{where}: expected a JSON object, found {type(value).__name__}")
    return value


# ---- hashing ---------------------------------------------------------------------------------


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


# ---- reading and writing -----------------------------------------------------------------


def parse_manifest(data: bytes | str, where: str) -> BuildManifest:
    """A manifest from untrusted bytes, or ManifestError with one line; never another error."""
    try:
        manifest = BuildManifest.model_validate_json(data)
    except ValidationError as exc:  # one line: the first problem is enough to act on
        first = exc.errors()[0]
        loc = ".".join(shown(p, 60) for p in first["loc"]) or "file"
        raise ManifestError(
            f"{where}: unreadable build manifest ({loc}: {shown(first['msg'])})"
        ) from None
    except (ValueError, RecursionError) as exc:  # pydantic-core's own limits
        raise ManifestError(f"{where}: unreadable build manifest ({shown(exc)})") from None
    if manifest.format_version > FORMAT_VERSION:
        raise ManifestError(
            f"{where}: format_version {manifest.format_version} is newer than this server "
            f"reads ({FORMAT_VERSION}); serve it with a newer image"
        )
    if len(manifest.files) > MAX_FILES:
        raise ManifestError(f"{where}: lists more than {MAX_FILES} files")
    for name in manifest.files:
        check_name(name, where)
    return manifest


def read_manifest(
    artifact_dir: Path, files: Mapping[str, FileStat] | None = None
) -> BuildManifest | None:
    """The artifact's manifest, None if it has none (or is no directory yet). `files` is
    `scan_files`' listing when the caller has it (else the directory is scanned, so the
    manifest file is confined)."""
    if files is None:
        if not Path(artifact_dir).is_dir():
            return None
        files = scan_files(artifact_dir)
    if MANIFEST_NAME not in files:
        return None
    path = Path(artifact_dir) / MANIFEST_NAME
    return parse_manifest(read_json_file(path, "build manifest"), str(path))


def record_files(artifact_dir: Path) -> dict[str, FileRecord]:
    """Size and hash of every file under the artifact, the manifest and hidden files excluded."""
    records = {}
    for rel, st in scan_files(artifact_dir).items():
        if rel != MANIFEST_NAME and not rel.startswith("."):
            records[rel] = FileRecord(size=st.size, sha256=sha256_file(artifact_dir / rel))
    return records


def write_manifest(artifact_dir: Path, manifest: BuildManifest) -> Path:
    manifest = manifest.model_copy(update={"files": record_files(artifact_dir)})
    path = artifact_dir / MANIFEST_NAME
    path.write_text(json.dumps(manifest.model_dump(mode="json"), indent=2) + "\n")
    return path


# ---- checking ----------------------------------------------------------------------------


def check_sizes(artifact_dir: Path, manifest: BuildManifest, files: Mapping[str, FileStat]) -> None:
    """Every listed file is among the confined files, at its recorded size (no I/O)."""
    for rel, record in manifest.files.items():
        check_name(rel, MANIFEST_NAME)  # a manifest built in code skipped parse_manifest
        found = files.get(rel)
        if found is None:
            raise ManifestError(f"{artifact_dir / rel}: listed in {MANIFEST_NAME} but missing")
        if found.size != record.size:
            raise ManifestError(
                f"{artifact_dir / rel}: size {found.size} differs from the manifest's {record.size}"
            )


def check_hashes(artifact_dir: Path, manifest: BuildManifest, names: Iterable[str]) -> None:
    """Hash the named files (already checked by `check_sizes`) against the manifest."""
    for rel in names:
        if sha256_file(artifact_dir / rel) != manifest.files[rel].sha256:
            raise ManifestError(
                f"{artifact_dir / rel}: sha256 differs from {MANIFEST_NAME} (corrupt download?)"
            )


def verify_files(artifact_dir: Path, manifest: BuildManifest, hashes: bool = True) -> None:
    """Raise ManifestError naming the first file that is missing, differs, or is not confined."""
    check_sizes(artifact_dir, manifest, scan_files(artifact_dir))
    if hashes:
        check_hashes(artifact_dir, manifest, manifest.files)


# ---- describing ----------------------------------------------------------------------------


def describe(manifest: BuildManifest) -> str:
    """One line for logs and model metadata: what was built, from what, for which GPU."""
    source = manifest.source_model
    if manifest.source_revision:
        source += f"@{manifest.source_revision[:12]}"
    opts = manifest.build_options
    parts = [manifest.kind, source]
    precision = str(opts.get("quantization") or "none")
    parts.append(str(opts.get("dtype", "?")) + ("" if precision == "none" else f"+{precision}"))
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
    return shown("; ".join(parts), 1000)


def total_size(manifest: BuildManifest) -> int:
    return sum(record.size for record in manifest.files.values())
