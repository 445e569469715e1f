"""The real tokenizers the tests read, each loaded once per test process: the fixtures in
tests/conftest.py and the hypothesis strategies (which take a path, not a fixture) share
them."""

from __future__ import annotations

import functools
from pathlib import Path

from mistral_serving.text.tokenizer import Tokenizer, load_tokenizer


@functools.cache
def tokenizer_at(path: str, prefer_sentencepiece: bool = True) -> Tokenizer:
    return load_tokenizer(Path(path), prefer_sentencepiece=prefer_sentencepiece)
