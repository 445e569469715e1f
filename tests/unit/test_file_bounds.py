"""Every artifact file the server parses has a size bound (file_bounds.FILE_BOUNDS),
checked before any parser sees it: by `open_artifact` (the load), `load_tokenizer` and
`read_config` (an engine started from a bare directory reads config.json there). A file over its bound
is refused with one line naming the file and the bound; at the bound it is not. The big
files are sparse (no disk is used)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from mistral_serving.artifacts.artifact import open_artifact, read_config
from mistral_serving.artifacts.file_bounds import (
    FILE_BOUNDS,
    FOLDER_BOUNDS,
    MiB,
    check_file,
    check_parsed_files,
)
from mistral_serving.artifacts.manifest import ArtifactError
from mistral_serving.settings import Settings
from mistral_serving.text.tokenizer import load_tokenizer

SMALL_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer.model",
    "tokenizer_config.json",
)


def sparse(path: Path, size: int) -> Path:
    with path.open("wb") as f:
        f.truncate(size)
    return path


def checkpoint(tmp_path: Path, dev_model: Path) -> Path:
    """The dev model's small files and an empty weights file: what `open_artifact` and
    `load_tokenizer` read."""
    root = tmp_path / "ckpt"
    root.mkdir()
    for name in SMALL_FILES:
        shutil.copyfile(dev_model / name, root / name)
    (root / "model.safetensors").write_bytes(b"")
    return root


def settings_for(root: Path, tmp_path: Path) -> Settings:
    return Settings(artifact=str(root), cache_dir=str(tmp_path / "cache"), verify_hashes=False)


def test_the_dev_models_files_are_within_their_bounds(dev_model: Path) -> None:
    check_parsed_files(dev_model)
    assert all(bound >= MiB for bound in FILE_BOUNDS.values())


@pytest.mark.parametrize("name", list(FILE_BOUNDS))
def test_a_file_over_its_bound_refuses_the_load_in_one_line(
    tmp_path: Path, dev_model: Path, name: str
) -> None:
    root = checkpoint(tmp_path, dev_model)
    bound = FILE_BOUNDS[name]
    sparse(root / name, bound + 1)
    with pytest.raises(ArtifactError) as err:
        open_artifact(root, settings_for(root, tmp_path))
    message = str(err.value)
    assert "\n" not in message
    assert name in message and f"at most {bound} bytes" in message


@pytest.mark.parametrize("name", list(FILE_BOUNDS))
def test_a_file_at_its_bound_passes_the_check(tmp_path: Path, name: str) -> None:
    check_file(sparse(tmp_path / name, FILE_BOUNDS[name]))


@pytest.mark.parametrize(
    "name", ["tokenizer.json", "tokenizer.model", "tokenizer_config.json", "generation_config.json"]
)
def test_load_tokenizer_refuses_an_oversized_tokenizer_file(
    tmp_path: Path, dev_model: Path, name: str
) -> None:
    """Before SentencePiece, tokenizers or transformers parse it (a 336 MB tokenizer.json
    made tokenizers abort the process)."""
    root = checkpoint(tmp_path, dev_model)
    sparse(root / name, FILE_BOUNDS[name] + 1)
    with pytest.raises(ArtifactError, match=f"a {name} is at most"):
        load_tokenizer(root)
    with pytest.raises(ArtifactError, match=f"a {name} is at most"):
        load_tokenizer(root, prefer_sentencepiece=False)


def test_read_config_refuses_an_oversized_config(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    # Valid JSON, just too big: it would parse.
    path.write_text(json.dumps({"pad": "x" * (FILE_BOUNDS["config.json"])}))
    with pytest.raises(ArtifactError, match="a config.json is at most"):
        read_config(tmp_path)


def test_names_without_a_bound_and_absent_files_are_not_checked(tmp_path: Path) -> None:
    check_file(sparse(tmp_path / "model.safetensors", 5 * 2**30))  # weights: their own checks
    check_file(tmp_path / "tokenizer.json")  # absent


def test_every_additional_chat_template_is_bounded(tmp_path: Path, dev_model: Path) -> None:
    root = checkpoint(tmp_path, dev_model)
    folder = root / "additional_chat_templates"
    folder.mkdir()
    (folder / "tool_use.jinja").write_text("{{ messages }}")
    check_parsed_files(root)
    sparse(folder / "rag.jinja", FOLDER_BOUNDS["additional_chat_templates"] + 1)
    with pytest.raises(ArtifactError, match="rag.jinja: .*a file in additional_chat_templates/"):
        load_tokenizer(root)
