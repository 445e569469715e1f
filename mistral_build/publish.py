"""Finishing and publishing an artifact: the same code for TensorRT-LLM engines and for the
PyTorch dev model, so the dev path goes through the publish-and-pull code production uses.

finish_artifact: copy the tokenizer files next to the weights and write the build manifest.
push_artifact:   upload the whole artifact to a Hugging Face repo in ONE commit and return
                 the commit sha to pin (`artifact_revision`).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path

from pydantic import BaseModel

from mistral_serving.artifacts.manifest import (
    MANIFEST_NAME,
    ArtifactError,
    BuildManifest,
    ManifestError,
    describe,
    read_manifest,
    verify_files,
    write_manifest,
)

# What a served artifact needs besides weights: the tokenizer and the chat format.
# Mistral's tokenizer_config.json carries the chat template; newer repos also ship
# chat_template.jinja. generation_config.json holds the EOS/BOS ids the server stops on.
TOKENIZER_FILES = (
    "tokenizer.model",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "generation_config.json",
)
# At least one of these must be there, or the artifact cannot encode a prompt.
TOKENIZER_REQUIRED_ANY = ("tokenizer.model", "tokenizer.json")

TOKEN_ENV = "HF_TOKEN"
# ArtifactError (from the manifest module, one class for build and serving): the artifact
# cannot be finished or published; the message is one line.


def copy_tokenizer_files(source: Path, artifact_dir: Path) -> list[str]:
    """Copy the tokenizer and chat-format files found in `source` into the artifact."""
    copied = []
    for name in TOKENIZER_FILES:
        src = source / name
        dst = artifact_dir / name
        if src.is_file():
            if src.resolve() != dst.resolve():
                shutil.copyfile(src, dst)
            copied.append(name)
    if not any(name in copied for name in TOKENIZER_REQUIRED_ANY):
        raise ArtifactError(
            f"{source}: no tokenizer.model or tokenizer.json; the artifact would not be self-contained"
        )
    return copied


def finish_artifact(artifact_dir: Path, tokenizer_source: Path, manifest: BuildManifest) -> Path:
    """Make the artifact self-contained (tokenizer + chat format) and describe it (manifest
    with sizes and hashes of every file). Returns the manifest path."""
    copy_tokenizer_files(tokenizer_source, artifact_dir)
    path = write_manifest(artifact_dir, manifest)
    print(f"manifest: {path}")
    written = read_manifest(artifact_dir)
    if written is None:  # only if the directory changed under us
        raise ArtifactError(f"{path}: written but not readable back")
    print(f"  {describe(written)}")
    return path


class PushResult(BaseModel):
    repo_id: str
    branch: str
    commit_sha: str
    commit_url: str


def hub_errors() -> tuple[type[BaseException], ...]:
    """What a Hub call raises when the Hub refuses or cannot be reached: huggingface_hub's
    own HTTP error and its HTTP client's (requests, httpx or httpx2, by its version)."""
    import importlib

    from huggingface_hub.errors import HfHubHTTPError

    found: list[type[BaseException]] = [HfHubHTTPError]
    for module, name in (
        ("requests", "RequestException"),
        ("httpx", "HTTPError"),
        ("httpx2", "HTTPError"),
    ):
        try:
            found.append(getattr(importlib.import_module(module), name))
        except (ImportError, AttributeError):
            continue
    return tuple(found)


def hub_failure(exc: BaseException) -> str:
    """A failed Hub call in one line: where, and what it answered (or why nothing)."""
    from huggingface_hub import constants

    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"the Hugging Face Hub at {constants.ENDPOINT}: {type(exc).__name__}: {first}"[:500]


def hf_token_from_env(env: Mapping[str, str] | None = None) -> str | None:
    """The token comes from the environment only (never an argument: it would show in `ps`
    and shell history) and is never printed."""
    source = os.environ if env is None else env
    return source.get(TOKEN_ENV) or source.get("HUGGING_FACE_HUB_TOKEN") or None


def verified_manifest(artifact_dir: Path) -> BuildManifest:
    """The artifact's manifest, once every file it lists was checked against it (sizes
    and hashes); an ArtifactError says what is missing or corrupt."""
    manifest = read_manifest(artifact_dir)
    if manifest is None:
        raise ArtifactError(f"{artifact_dir}: no {MANIFEST_NAME}; build the artifact first")
    try:
        verify_files(artifact_dir, manifest, hashes=True)
    except ManifestError as exc:
        raise ArtifactError(f"refusing to push a corrupt artifact: {exc}") from None
    return manifest


def push_artifact(
    artifact_dir: Path,
    repo_id: str,
    branch: str = "main",
    private: bool = True,
    token: str | None = None,
    endpoint: str | None = None,
) -> PushResult:
    """Upload every file of the artifact in one commit on `branch`, removing files the branch
    had that the artifact does not (so the commit is exactly this artifact).

    `create_commit` (not `upload_folder`/`upload_large_folder`) because those may split a
    folder into several commits when hf_xet is installed, and one commit is what `load()`
    pins. Resumable: blobs already on the Hub (Xet chunks or LFS objects from an interrupted
    run) are not sent again, so re-running the same push only uploads what is missing.
    """
    from huggingface_hub import CommitOperationAdd, CommitOperationDelete, HfApi
    from huggingface_hub.errors import RevisionNotFoundError

    manifest = verified_manifest(artifact_dir)
    api = HfApi(endpoint=endpoint, token=token)
    files = [*manifest.files, MANIFEST_NAME]
    total = sum(r.size for r in manifest.files.values())
    print(f"push: {len(files)} files, {total / 1e9:.2f} GB -> {repo_id}@{branch}")

    api.create_repo(repo_id, private=private, exist_ok=True)
    if branch != "main":
        api.create_branch(repo_id, branch=branch, exist_ok=True)

    try:
        remote = set(api.list_repo_files(repo_id, revision=branch))
    except RevisionNotFoundError:
        remote = set()
    stale = sorted(remote - set(files) - {".gitattributes"})

    operations: list = [
        CommitOperationAdd(path_in_repo=rel, path_or_fileobj=str(artifact_dir / rel))
        for rel in files
    ]
    operations += [CommitOperationDelete(path_in_repo=rel) for rel in stale]
    info = api.create_commit(
        repo_id,
        operations=operations,
        commit_message=f"{manifest.kind}: {describe(manifest)}"[:200],
        commit_description=describe(manifest),
        revision=branch,
    )
    result = PushResult(
        repo_id=repo_id, branch=branch, commit_sha=info.oid, commit_url=info.commit_url
    )
    print(f"pushed: {result.commit_url}")
    print("pin it in the Truss config (model_metadata) or the environment:")
    print(f"  artifact: {repo_id}")
    print(f"  artifact_revision: {result.commit_sha}")
    return result
