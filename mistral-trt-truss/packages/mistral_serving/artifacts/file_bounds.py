"""The size bound of every artifact file the server parses: the one place that says it.

A parser given a file far larger than any real one of its kind can allocate many times
its size (a 336 MB tokenizer.json made the tokenizers library ask for 7.5 GB and abort the
process with a Rust backtrace). So before anything reads one of these files, its size is
checked here, and a file over its bound refuses the load with one line naming the file
and the bound. The bounds leave ample room over the largest real files of their kind
(sizes of published checkpoints: tokenizer.json 1.8 MB Mistral-7B, 9.1 MB Llama 3, 33 MB
Gemma 3; tokenizer.model 0.5 MB Mistral, 4.2 MB Gemma; tokenizer_config.json up to a few
hundred kB with a full added_tokens_decoder; config.json and generation_config.json a few
kB; chat templates a few kB).
"""

from __future__ import annotations

from pathlib import Path

from mistral_serving.artifacts.manifest import ArtifactError, shown

MiB = 2**20

# File name (at the artifact's top level) -> the largest size it may have, in bytes.
FILE_BOUNDS: dict[str, int] = {
    "config.json": 1 * MiB,
    "generation_config.json": 1 * MiB,
    "build_manifest.json": 16 * MiB,  # lists every file with its hash
    "model.safetensors.index.json": 16 * MiB,
    "tokenizer.json": 40 * MiB,
    "tokenizer.model": 16 * MiB,
    "tokenizer_config.json": 8 * MiB,
    "special_tokens_map.json": 1 * MiB,
    "added_tokens.json": 8 * MiB,
    "chat_template.jinja": 1 * MiB,
    "chat_template.json": 1 * MiB,
    "vocab.json": 32 * MiB,
    "merges.txt": 32 * MiB,
}
# Folder (at the artifact's top level) -> the bound of each file in it: transformers
# reads every `additional_chat_templates/*.jinja` as a named chat template.
FOLDER_BOUNDS: dict[str, int] = {"additional_chat_templates": 1 * MiB}


def check_file(path: Path, bound: int | None = None) -> None:
    """Refuse `path` if it is a file over its kind's bound (or `bound`); absent: nothing
    to check; a name without a bound: not one the server parses."""
    bound = FILE_BOUNDS.get(path.name) if bound is None else bound
    if bound is None:
        return
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return
    except OSError as exc:
        raise ArtifactError(f"{path}: cannot be read ({shown(exc.strerror)})") from None
    if size > bound:
        raise ArtifactError(
            f"{path}: {size} bytes; {_kind(path)} is at most {bound} bytes "
            f"({bound // MiB} MiB): refused before parsing"
        )


def check_parsed_files(directory: Path) -> None:
    """`check_file` for every file of `directory` the server may parse."""
    for name in FILE_BOUNDS:
        check_file(directory / name)
    for folder, bound in FOLDER_BOUNDS.items():
        if (directory / folder).is_dir():
            for path in sorted((directory / folder).iterdir()):
                check_file(path, bound)


def _kind(path: Path) -> str:
    return f"a {path.name}" if path.name in FILE_BOUNDS else f"a file in {path.parent.name}/"
