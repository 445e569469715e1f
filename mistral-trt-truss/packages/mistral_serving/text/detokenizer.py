"""Incremental detokenization: token ids in, complete characters out.

Linear in the output (each token's bytes are looked up once), never emits part of a
character, never drops the spaces SentencePiece encodes as "▁", and the text it emits,
joined, equals the whole-sequence decode of the same ids exactly (the Hugging Face
decoder's semantics: special tokens skipped, byte-fallback runs decoded as a whole, one
leading space stripped for SentencePiece models).
"""

from __future__ import annotations

import codecs

from mistral_serving.text.tokenizer import TokenTable

REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    def __init__(self, table: TokenTable) -> None:
        self._table = table
        self._byte_run = bytearray()  # pending byte-fallback tokens (sentencepiece)
        self._run_tokens = 0
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")  # byte_level
        self._at_start = table.strip_leading_space

    def push(self, ids: list[int]) -> str:
        """Text completed by these ids (may be empty while a character is pending)."""
        if self._table.kind == "byte_level":
            data = b"".join(self._table.token_bytes[i] or b"" for i in ids)
            return self._emit(self._utf8.decode(data))
        out: list[str] = []
        token_bytes, is_byte = self._table.token_bytes, self._table.is_byte_token
        for i in ids:
            piece = token_bytes[i]
            if piece is None:
                continue  # special token: skipped, and it does not end a byte run
            if is_byte[i]:
                self._byte_run += piece
                self._run_tokens += 1
                continue
            if self._run_tokens:
                out.append(self._end_run())
            out.append(piece.decode())
        return self._emit("".join(out))

    def flush(self) -> str:
        """Whatever is pending at the end of the sequence."""
        if self._table.kind == "byte_level":
            return self._emit(self._utf8.decode(b"", final=True))
        return self._emit(self._end_run() if self._run_tokens else "")

    def _end_run(self) -> str:
        try:
            text = self._byte_run.decode()
        except UnicodeDecodeError:
            text = REPLACEMENT * self._run_tokens
        self._byte_run.clear()
        self._run_tokens = 0
        return text

    def _emit(self, text: str) -> str:
        if self._at_start and text:
            self._at_start = False
            if text.startswith(" "):
                return text[1:]
        return text
