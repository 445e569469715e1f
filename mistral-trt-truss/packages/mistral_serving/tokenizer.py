"""The artifact's tokenizer: exact encoding, and a per-token byte table for decoding.

Encoding uses SentencePiece when the artifact ships `tokenizer.model` (Mistral and
Llama-2 repos do): that is what Mistral's reference encoder (`mistral-common`) runs, so
prompts and chats get exactly its token ids; the converted `tokenizer.json` of these
models merges whitespace differently on some inputs. Without `tokenizer.model` the
Hugging Face tokenizer encodes.

Decoding never calls a whole-text decode: every token id maps to the bytes it stands for
(`TokenTable`), and `detokenizer.IncrementalDetokenizer` turns a stream of ids into text
in time linear in the output.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

SPIECE_UNDERLINE = "▁"


@dataclass(frozen=True)
class TokenTable:
    """What each token id decodes to.

    kind "sentencepiece": pieces with "▁" for spaces and byte-fallback tokens <0xNN>;
      a run of byte tokens decodes as a whole (invalid UTF-8 -> one U+FFFD per byte, as
      the Hugging Face ByteFallback decoder does) and one leading space is stripped.
    kind "byte_level": GPT-2 style byte-level BPE (Llama 3); bytes concatenate and
      decode with replacement of invalid sequences.
    """

    kind: Literal["sentencepiece", "byte_level"]
    token_bytes: tuple[bytes | None, ...]  # None: special token, skipped when decoding
    is_byte_token: tuple[bool, ...]
    strip_leading_space: bool


class Tokenizer:
    def __init__(
        self,
        table: TokenTable,
        bos_id: int | None,
        eos_id: int,
        encode_fn,  # (text: str) -> list[int], no special tokens added
    ) -> None:
        self.table = table
        self.bos_id = bos_id
        self.eos_id = eos_id
        self._encode = encode_fn

    @property
    def vocab_size(self) -> int:
        return len(self.table.token_bytes)

    def encode(self, text: str, bos: bool = False) -> list[int]:
        ids = self._encode(text)
        return [self.bos_id, *ids] if bos and self.bos_id is not None else ids

    def decode(self, ids: list[int]) -> str:
        """The whole text of `ids` (special tokens skipped), as streaming would join it."""
        from mistral_serving.detokenizer import IncrementalDetokenizer

        detok = IncrementalDetokenizer(self.table)
        return detok.push(ids) + detok.flush()


def load_tokenizer(artifact_dir: Path, prefer_sentencepiece: bool = True) -> Tokenizer:
    sp_model = artifact_dir / "tokenizer.model"
    if prefer_sentencepiece and sp_model.is_file():
        return _sentencepiece_tokenizer(sp_model)
    if (artifact_dir / "tokenizer.json").is_file():
        return _hf_tokenizer(artifact_dir)
    raise FileNotFoundError(
        f"{artifact_dir}: no tokenizer.model or tokenizer.json; the artifact must ship its "
        "tokenizer files (build.py copies them next to the engine)"
    )


def _sentencepiece_tokenizer(path: Path) -> Tokenizer:
    import sentencepiece

    sp = sentencepiece.SentencePieceProcessor(model_file=str(path))
    token_bytes: list[bytes | None] = []
    is_byte: list[bool] = []
    for i in range(sp.get_piece_size()):
        piece = sp.id_to_piece(i)
        if sp.is_control(i) or sp.is_unknown(i):
            token_bytes.append(None)
            is_byte.append(False)
        elif sp.is_byte(i):
            token_bytes.append(bytes([int(piece[3:5], 16)]))
            is_byte.append(True)
        else:
            token_bytes.append(piece.replace(SPIECE_UNDERLINE, " ").encode())
            is_byte.append(False)
    table = TokenTable("sentencepiece", tuple(token_bytes), tuple(is_byte), True)
    return Tokenizer(table, sp.bos_id(), sp.eos_id(), lambda text: sp.encode(text))


def _byte_level_decoder_map() -> dict[str, int]:
    """Inverse of GPT-2's bytes_to_unicode: printable stand-in char -> byte value."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    bs += list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def _hf_tokenizer(artifact_dir: Path) -> Tokenizer:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(artifact_dir))
    spec = json.loads((artifact_dir / "tokenizer.json").read_text())
    byte_level = "ByteLevel" in json.dumps(spec.get("decoder"))
    special = set(tok.all_special_ids)
    pieces = tok.convert_ids_to_tokens(list(range(len(tok))))
    byte_map = _byte_level_decoder_map() if byte_level else {}
    token_bytes: list[bytes | None] = []
    is_byte: list[bool] = []
    for i, piece in enumerate(pieces):
        if i in special or piece is None:
            token_bytes.append(None)
            is_byte.append(False)
        elif byte_level:
            token_bytes.append(
                bytes(byte_map[c] for c in piece)
                if all(c in byte_map for c in piece)
                else piece.encode()
            )
            is_byte.append(False)
        elif len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
            token_bytes.append(bytes([int(piece[3:5], 16)]))
            is_byte.append(True)
        else:
            token_bytes.append(piece.replace(SPIECE_UNDERLINE, " ").encode())
            is_byte.append(False)
    kind = "byte_level" if byte_level else "sentencepiece"
    table = TokenTable(kind, tuple(token_bytes), tuple(is_byte), not byte_level)
    eos = tok.eos_token_id
    if eos is None:
        raise ValueError(f"{artifact_dir}: tokenizer has no eos token")
    return Tokenizer(
        table, tok.bos_token_id, eos, lambda text: tok.encode(text, add_special_tokens=False)
    )
