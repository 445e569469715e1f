"""Whole-text decoding for tests: what a stream of `ids` joins to (the serving code only
ever decodes incrementally), and what that must equal."""

from __future__ import annotations

from collections.abc import Sequence

from mistral_serving.text.detokenizer import IncrementalDetokenizer, partial_tail
from mistral_serving.text.tokenizer import Tokenizer, TokenTable


def decode(tok: Tokenizer, ids: Sequence[int]) -> str:
    detok = IncrementalDetokenizer(tok.table)
    return detok.push(list(ids)) + detok.flush()


def expected_text(hf: object, table: TokenTable, ids: Sequence[int]) -> str:
    """Hugging Face's whole-sequence decode, less the character the ids end inside: the
    decode has a U+FFFD for it, the detokenizer holds it back."""
    if table.kind == "byte_level":
        raw = b"".join(table.token_bytes[i] or b"" for i in ids)
        whole = hf.decode(ids, skip_special_tokens=True)  # type: ignore[attr-defined]
        return whole[:-1] if partial_tail(raw) else whole
    run: list[int] = []  # positions of the trailing byte-fallback run (specials skipped)
    for at in range(len(ids) - 1, -1, -1):
        if table.token_bytes[ids[at]] is None:
            continue
        if not table.is_byte_token[ids[at]]:
            break
        run.insert(0, at)
    cut = partial_tail(b"".join(table.token_bytes[ids[at]] or b"" for at in run))
    kept = list(ids[: run[-cut]] if cut else ids)
    return hf.decode(kept, skip_special_tokens=True)  # type: ignore[attr-defined]
