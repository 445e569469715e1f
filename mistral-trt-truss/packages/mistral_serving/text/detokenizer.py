"""Incremental detokenization: token ids in, complete characters out.

Linear in the output (each token's bytes are looked up once), never emits part of a
character, never drops the spaces SentencePiece encodes as "▁", and the text it emits,
joined, equals the whole-sequence decode of the same ids exactly (the Hugging Face
decoder's semantics: special tokens skipped, byte-fallback runs decoded as a whole, one
leading space stripped for SentencePiece models), but for one thing: a sequence that ends
inside a character (a length limit cut it) ends without it, where the whole decode has a
U+FFFD for it (vLLM holds it back too). Bytes that can never be a character are U+FFFD.
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
        """Whatever is pending at the end of the sequence, less a character it ends inside."""
        if self._table.kind == "byte_level":
            pending = self._utf8.getstate()[0]
            if pending and partial_tail(pending) == len(pending):
                self._utf8.reset()
                return ""
            return self._emit(self._utf8.decode(b"", final=True))
        if cut := partial_tail(bytes(self._byte_run)):
            del self._byte_run[-cut:]
            self._run_tokens -= cut  # a byte-fallback token is one byte
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


def partial_tail(data: bytes) -> int:
    """How many bytes at the end of `data` are the start of a character, cut (0: none):
    a lead byte and the continuation bytes after it, fewer than the lead announces, that
    some continuation completes into a valid character (a surrogate's start never is)."""
    for size in range(1, min(3, len(data)) + 1):
        lead = data[-size]
        if 0x80 <= lead < 0xC0:
            continue  # a continuation byte: the character starts further back
        if not 0xC2 <= lead <= 0xF4:
            return 0  # ASCII, or a byte no character starts with
        need = 2 if lead < 0xE0 else 3 if lead < 0xF0 else 4
        if size >= need:
            return 0
        # The lead byte limits the second byte only (E0 needs A0.., ED ..9F, F0 90..).
        seconds = [b""] if size > 1 else [bytes([b]) for b in (0x80, 0x90, 0xA0)]
        for second in seconds:
            rest = b"\x80" * (need - size - len(second))
            try:
                (data[-size:] + second + rest).decode("utf-8")
            except UnicodeDecodeError:
                continue
            return size
        return 0
    return 0
