"""Whole-text decoding for tests: what a stream of `ids` joins to (the serving code only
ever decodes incrementally)."""

from __future__ import annotations

from collections.abc import Sequence

from mistral_serving.text.detokenizer import IncrementalDetokenizer
from mistral_serving.text.tokenizer import Tokenizer


def decode(tok: Tokenizer, ids: Sequence[int]) -> str:
    detok = IncrementalDetokenizer(tok.table)
    return detok.push(list(ids)) + detok.flush()
