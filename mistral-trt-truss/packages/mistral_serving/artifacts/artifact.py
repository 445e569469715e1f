"""The artifact to serve, read once into one value: `load_artifact(settings, token)`.

1. Resolve: a local directory, or a Hugging Face repo id at a pinned revision fetched with
   `huggingface_hub` into the cache. `snapshot_download` itself serves a complete cached
   snapshot when the Hub cannot be reached or fails (5xx); every other Hub answer is
   reported as what it is (401, 403, 404, 5xx, an answer that is not JSON), in one line.
2. Confine: list every file without following a symlink out of the artifact
   (`manifest.scan_files`); a HF cache snapshot may point into its own repo's `blobs`.
3. Read config.json and build_manifest.json once; say what the artifact is.
4. Verify: sizes always; sha256 once per download (or first use of a local directory),
   remembered by a marker in the cache that any change of a file's size, mtime, ctime or
   inode invalidates, so later starts do not re-read gigabytes.

Every failure is an `ArtifactError` (or the `SettingsError` of a missing setting) with a
one-line message, meant to be the last line a failed load logs.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import logging
import os
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from mistral_serving.artifacts.file_bounds import check_file, check_parsed_files
from mistral_serving.artifacts.manifest import (
    CONFIG_NAME,
    MANIFEST_NAME,
    ArtifactError,
    ArtifactKind,
    BuildManifest,
    FileStat,
    ManifestError,
    check_hashes,
    check_sizes,
    is_engine_config,
    parse_json_object,
    parse_manifest,
    read_json_file,
    scan_files,
    shown,
)
from mistral_serving.artifacts.sources import check_source
from mistral_serving.settings import ArtifactSettings, SettingsError

__all__ = ["Artifact", "ArtifactError", "ArtifactKind", "load_artifact", "resolve_artifact"]

log = logging.getLogger(__name__)

_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
COMMIT_SHA = re.compile(r"^[0-9a-f]{40}$")
HUB_DIR = "hub"  # under the cache dir: huggingface_hub's cache
MARKER_DIR = "verified"  # under the cache dir: one marker per artifact directory


@dataclass(frozen=True)
class Artifact:
    """What load() serves, read once: pass it down instead of re-reading files."""

    path: Path  # the directory (a HF cache snapshot for a repo id)
    kind: ArtifactKind
    manifest: BuildManifest | None  # None: the artifact has no build manifest
    config: dict[str, Any]  # config.json, parsed (engine or checkpoint config); do not mutate


def load_artifact(settings: ArtifactSettings, hf_token: str | None) -> Artifact:
    """Resolve, confine, read and verify the artifact the settings name."""
    return open_artifact(resolve_artifact(settings, hf_token), settings)


# ---- resolve -------------------------------------------------------------------------


def resolve_artifact(settings: ArtifactSettings, hf_token: str | None) -> Path:
    """The local directory holding the artifact (downloaded first if it is a repo id)."""
    if not settings.artifact:
        raise SettingsError(
            "artifact is not set: set model_metadata.artifact (or MTT_ARTIFACT) to a local "
            "directory or a Hugging Face repo id"
        )
    local = Path(settings.artifact).expanduser()
    if local.exists():
        if not local.is_dir():
            raise ArtifactError(f"artifact {local} is a file; point it at the artifact directory")
        return local
    if not _REPO_ID.match(settings.artifact):
        raise ArtifactError(
            f"artifact '{shown(settings.artifact)}': no such directory, and not a Hugging Face "
            "repo id (owner/name)"
        )
    if not settings.artifact_revision:
        raise SettingsError(
            f"artifact_revision is not set for repo {settings.artifact}: pin the commit sha that "
            "`build.py engine --push` printed (or a tag), so every replica serves the same files"
        )
    if not COMMIT_SHA.match(settings.artifact_revision):
        log.warning(
            "artifact_revision %r is not a commit sha: a moved branch or tag changes "
            "what new replicas serve",
            settings.artifact_revision,
        )
    return download(settings.artifact, settings.artifact_revision, settings.cache_path, hf_token)


def cached_snapshot(repo_id: str, revision: str, cache_dir: Path) -> Path:
    """Where `download` keeps repo@revision (huggingface_hub's cache layout under
    `cache_dir/hub`), whether or not it is there yet."""
    owner, _, name = repo_id.partition("/")
    return cache_dir / HUB_DIR / f"models--{owner}--{name}" / "snapshots" / revision


def download(
    repo_id: str, revision: str, cache_dir: Path, token: str | None, into: Path | None = None
) -> Path:
    """repo@revision from the Hub into huggingface_hub's cache under `cache_dir` (a pod),
    or as plain files into `into` (the fill of a shared volume); resumable either way."""
    from huggingface_hub import snapshot_download

    where = cache_dir / HUB_DIR if into is None else into
    try:
        return Path(
            snapshot_download(
                repo_id=repo_id,
                revision=revision,
                token=token or False,
                cache_dir=None if into is not None else str(where),
                local_dir=None if into is None else str(into),
            )
        )
    except Exception as exc:  # every way the client fails becomes one line for the log
        log.debug("snapshot_download failed", exc_info=exc)
        raise ArtifactError(hub_failure(exc, repo_id, revision, token, where)) from None


def _chain(exc: BaseException) -> list[BaseException]:
    """The exception and its causes: huggingface_hub wraps the Hub's answer in
    LocalEntryNotFoundError when it also found nothing in the cache."""
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in chain and len(chain) < 16:
        chain.append(current)
        current = current.__cause__ or current.__context__
    return chain


def hub_failure(
    exc: BaseException, repo_id: str, revision: str, token: str | None, hub_cache: Path
) -> str:
    """What went wrong fetching repo@revision, in one line: the Hub's answer if it gave one."""
    from huggingface_hub import constants
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    where = f"{repo_id}@{revision}"
    token_hint = "no token was given" if not token else "the token cannot read it"
    secret = "the Truss secret hf_access_token"
    not_cached = f"and that revision is not (completely) in the cache {hub_cache}"
    chain = _chain(exc)
    for link in chain:
        if isinstance(link, RevisionNotFoundError):
            return f"revision {revision} not found in {repo_id}: pin a commit sha of that repo"
        if isinstance(link, GatedRepoError):
            return (
                f"{repo_id} is gated: accept its terms on the Hub with the account whose token "
                f"is in {secret}"
            )
        if isinstance(link, RepositoryNotFoundError):
            return f"{repo_id} not found or private ({token_hint}); put a read token in {secret}"
        # huggingface_hub 0.x (the TensorRT-LLM image's) makes LocalEntryNotFoundError an
        # HfHubHTTPError with no response: the HTTP answer, if any, is further down the chain.
        if isinstance(link, HfHubHTTPError) and getattr(link, "response", None) is not None:
            response = link.response
            status = getattr(response, "status_code", None)
            answered = f"the Hub answered HTTP {status} for {where}"
            if status == 401:
                return f"{answered}: the token in {secret} is invalid or expired; replace it"
            if status == 403:
                return f"{answered}: the token in {secret} may not read this repo; grant it read"
            if status == 404:
                return f"{answered}: a file or the revision is gone from the repo"
            if status == 429:
                return f"{answered} (rate limited) {not_cached}; retry later"
            if isinstance(status, int) and status >= 500:
                return f"{answered} {not_cached}; the Hub is failing: retry later"
            return f"{answered}"
    for link in chain:
        if isinstance(link, UnicodeDecodeError) or _is_json_error(link):
            return (
                f"the Hub's answer for {where} is not JSON ({shown(link, 80)}); is HF_ENDPOINT "
                f"({constants.ENDPOINT}) a Hugging Face Hub?"
            )
    for link in chain:
        if isinstance(link, OfflineModeIsEnabled):
            return f"HF_HUB_OFFLINE is set {not_cached}"
        if isinstance(link, _transport_errors()):
            return (
                f"cannot reach the Hub at {constants.ENDPOINT} ({type(link).__name__}) for "
                f"{where} {not_cached}"
            )
    return f"fetching {where} failed: {type(exc).__name__}: {shown(exc, 200)}"


def _transport_errors() -> tuple[type[BaseException], ...]:
    """The "could not reach it" errors of whichever HTTP client huggingface_hub uses:
    httpx2 (huggingface_hub 2.x), httpx (1.x), requests (0.x, the TensorRT-LLM image's)."""
    errors: list[type[BaseException]] = [ConnectionError, TimeoutError]
    for module, names in (
        ("httpx2", ("TransportError",)),
        ("httpx", ("TransportError",)),
        ("requests.exceptions", ("ConnectionError", "Timeout")),
    ):
        try:
            imported = importlib.import_module(module)
        except ImportError:
            continue
        errors += [getattr(imported, name) for name in names]
    return tuple(errors)


# ---- confine, read, verify ---------------------------------------------------------------


def open_artifact(path: Path, settings: ArtifactSettings) -> Artifact:
    """Read an artifact directory into an `Artifact`: every file confined, config.json and
    the manifest parsed once, sizes checked, hashes checked unless a marker vouches."""
    path = Path(path)
    files = scan_files(path)
    check_parsed_files(path)  # before any parser sees a file (file_bounds.py)
    check_source(path, files, settings)  # the pin; no marker inside a read-only mount
    config = _read_config(path, files)
    kind = _kind(path, files, config)
    manifest = None
    if MANIFEST_NAME in files:
        raw = read_json_file(path / MANIFEST_NAME, "build manifest")
        manifest = parse_manifest(raw, str(path / MANIFEST_NAME))
        if manifest.kind != kind:
            raise ManifestError(
                f"{path / MANIFEST_NAME}: says {manifest.kind} but the files are a {kind}; "
                "the manifest belongs to another artifact"
            )
        check_sizes(path, manifest, files)
        unlisted = sorted(
            f for f in files if f not in manifest.files and f != MANIFEST_NAME and f[0] != "."
        )
        if unlisted:
            log.warning(
                "%s: %d file(s) not in the build manifest, unchecked: %s",
                path,
                len(unlisted),
                shown(", ".join(unlisted[:5]), 300),
            )
        if settings.verify_hashes:
            verify_hashes_once(path, manifest, raw, files, settings.cache_path)
    else:
        log.warning(
            "%s has no build manifest: versions, GPU and file integrity are unchecked", path
        )
    return Artifact(path=path, kind=kind, manifest=manifest, config=config)


def _read_config(path: Path, files: Mapping[str, FileStat]) -> dict[str, Any]:
    if CONFIG_NAME not in files:
        raise ArtifactError(f"{path}: {_NEITHER} (no {CONFIG_NAME})")
    return read_config(path)


def read_config(directory: Path) -> dict[str, Any]:
    """The directory's config.json, parsed: the one reader of it. A load reads it once,
    into the `Artifact`, and hands that to the engine; an engine started from a bare
    directory (tests, tools) reads it here. Every failure is an ArtifactError."""
    path = Path(directory) / CONFIG_NAME
    check_file(path)  # within its bound before it is parsed (file_bounds.py)
    if not path.is_file():
        raise ArtifactError(f"{path}: no such file")
    return parse_json_object(read_json_file(path, CONFIG_NAME), str(path))


_NEITHER = (
    "neither a TensorRT-LLM engine (config.json + rank*.engine) nor a Hugging Face "
    "checkpoint (config.json + *.safetensors)"
)


def _kind(path: Path, files: Mapping[str, FileStat], config: dict[str, Any]) -> ArtifactKind:
    top = [f for f in files if "/" not in f]
    if is_engine_config(config) and any(_is_rank_file(f) for f in top):
        return "trtllm_engine"
    if not is_engine_config(config) and any(f.endswith((".safetensors", ".bin")) for f in top):
        return "hf_checkpoint"
    raise ArtifactError(f"{path} is {_NEITHER}")


def _is_rank_file(name: str) -> bool:
    return name.startswith("rank") and name.endswith(".engine")


def verify_hashes_once(
    path: Path,
    manifest: BuildManifest,
    raw_manifest: bytes,
    files: Mapping[str, FileStat],
    cache_dir: Path,
) -> None:
    """Hash every listed file unless a marker says they were hashed, unchanged since."""
    marker = marker_path(cache_dir, path)
    expected = marker_record(raw_manifest, manifest, files)
    if _read_marker(marker) == expected:
        log.info("%s: hashes verified earlier, files unchanged since (%s)", path, marker)
        return
    check_hashes(path, manifest, manifest.files)
    _write_marker(marker, expected)


def marker_path(cache_dir: Path, path: Path) -> Path:
    key = hashlib.sha256(os.path.realpath(path).encode(errors="surrogateescape")).hexdigest()
    return cache_dir / MARKER_DIR / f"{key[:32]}.json"


def marker_record(
    raw_manifest: bytes, manifest: BuildManifest, files: Mapping[str, FileStat]
) -> dict[str, Any]:
    """What must be unchanged for an earlier hash check to still hold."""
    return {
        "manifest_sha256": hashlib.sha256(raw_manifest).hexdigest(),
        "files": {rel: asdict(files[rel]) for rel in sorted(manifest.files)},
    }


def _read_marker(marker: Path) -> object:
    try:
        return json.loads(marker.read_bytes())
    except (OSError, ValueError, RecursionError):  # absent or damaged: hash again
        return None


def _write_marker(marker: Path, record: dict[str, Any]) -> None:
    """Atomically, so a crash never leaves a marker for files that were not all hashed."""
    try:
        marker.parent.mkdir(parents=True, exist_ok=True)
        tmp = marker.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(record))
        os.replace(tmp, marker)
    except OSError as exc:  # a read-only cache costs a re-hash next start, nothing else
        log.warning(
            "cannot write the verified marker %s (%s): next start hashes again", marker, exc
        )


def _is_json_error(exc: BaseException) -> bool:
    """json's JSONDecodeError, or simplejson's: requests decodes with simplejson where it
    is installed (the GPU machine has it), and neither class derives from the other."""
    return isinstance(exc, json.JSONDecodeError) or any(
        c.__name__ == "JSONDecodeError" for c in type(exc).__mro__
    )
