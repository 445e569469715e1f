"""Find the artifact to serve: a local directory, or a Hugging Face repo id at a pinned
revision fetched with `huggingface_hub` into the cache (offline from the cache when the
Hub cannot be reached). Then say what it is and check it against its build manifest."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Literal

from mistral_serving.engine_checks import is_engine_dir
from mistral_serving.manifest import BuildManifest, ManifestError, read_manifest, verify_files
from mistral_serving.settings import Settings, SettingsError

log = logging.getLogger(__name__)

ArtifactKind = Literal["trtllm_engine", "hf_checkpoint"]
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_COMMIT_SHA = re.compile(r"^[0-9a-f]{40}$")


class ArtifactError(RuntimeError):
    """The artifact cannot be found, fetched or trusted; the message is one actionable line."""


def resolve_artifact(settings: Settings, hf_token: str | None) -> Path:
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
            f"artifact {settings.artifact!r}: no such directory, and not a Hugging Face repo id "
            "(owner/name)"
        )
    if not settings.artifact_revision:
        raise SettingsError(
            f"artifact_revision is not set for repo {settings.artifact}: pin the commit sha that "
            "`build.py engine --push` printed (or a tag), so every replica serves the same files"
        )
    if not _COMMIT_SHA.match(settings.artifact_revision):
        log.warning(
            "artifact_revision %r is not a commit sha: a moved branch or tag changes "
            "what new replicas serve",
            settings.artifact_revision,
        )
    return download(settings.artifact, settings.artifact_revision, settings.cache_path, hf_token)


def download(repo_id: str, revision: str, cache_dir: Path, token: str | None) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    kwargs = dict(repo_id=repo_id, revision=revision, cache_dir=str(cache_dir / "hub"))
    try:
        return Path(snapshot_download(**kwargs, token=token or False))
    except RevisionNotFoundError:
        raise ArtifactError(f"revision {revision} not found in {repo_id}") from None
    except GatedRepoError:
        raise ArtifactError(
            f"{repo_id} is gated: accept its terms on the Hub with the account whose token is in "
            "the Truss secret hf_access_token"
        ) from None
    except RepositoryNotFoundError:
        hint = "no token was given" if not token else "the token cannot read it"
        raise ArtifactError(
            f"{repo_id} not found or private ({hint}); put a read token in the Truss secret "
            "hf_access_token"
        ) from None
    except HfHubHTTPError as exc:  # the Hub answered, with an error: not a network problem
        status = exc.response.status_code if exc.response is not None else "?"
        raise ArtifactError(
            f"the Hub refused {repo_id}@{revision} (HTTP {status}); check the token in the "
            "Truss secret hf_access_token and the repo's access rights"
        ) from None
    except (OSError, LocalEntryNotFoundError) as exc:  # network down: try the cache alone
        log.warning("Hub unreachable (%s); looking in the local cache", type(exc).__name__)
        try:
            return Path(snapshot_download(**kwargs, local_files_only=True))
        except LocalEntryNotFoundError:
            raise ArtifactError(
                f"cannot reach the Hub for {repo_id}@{revision} and it is not in the cache "
                f"{cache_dir / 'hub'}"
            ) from None


def artifact_kind(artifact_dir: Path) -> ArtifactKind:
    if is_engine_dir(artifact_dir):
        return "trtllm_engine"
    weights = any(artifact_dir.glob("*.safetensors")) or any(artifact_dir.glob("*.bin"))
    if (artifact_dir / "config.json").is_file() and weights:
        return "hf_checkpoint"
    raise ArtifactError(
        f"{artifact_dir} is neither a TensorRT-LLM engine (config.json + rank*.engine) nor a "
        "Hugging Face checkpoint (config.json + *.safetensors)"
    )


def check_manifest(artifact_dir: Path, verify_hashes: bool) -> BuildManifest | None:
    """The artifact's build manifest, its files checked (sizes always, hashes if asked)."""
    try:
        manifest = read_manifest(artifact_dir)
        if manifest is None:
            log.warning(
                "%s has no build manifest: versions, GPU and file integrity are unchecked",
                artifact_dir,
            )
            return None
        verify_files(artifact_dir, manifest, hashes=verify_hashes)
    except ManifestError as exc:
        raise ArtifactError(str(exc)) from None
    return manifest
