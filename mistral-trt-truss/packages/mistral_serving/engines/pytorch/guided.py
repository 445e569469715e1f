"""Structured output (OpenAI's `response_format`) for the PyTorch engines, with xgrammar.

xgrammar is the grammar engine TensorRT-LLM and vLLM use. A `GuidedDecoder` holds one
grammar compiler for the served tokenizer (compiled grammars are cached by xgrammar);
each request gets a `GuidedMatcher` that, before every sampling step, masks the logits
of every token the grammar does not allow next, and accepts the token that was chosen.
Once the grammar is complete only EOS is allowed, so the output always parses. The
TensorRT-LLM engine does the same inside the runtime (`GuidedDecodingParams`).

Cost (`bench/guided_bench.py`; docs/perf/history/structured-output.md): a schema is
compiled once, then xgrammar's cache answers; per token, the bitmask is filled and applied.
The mask is applied with numpy rather than xgrammar's CPU kernel, whose time grows with the
tokens it blocks (slowest on most steps of a schema, where only a few are allowed), and on
an accelerator without copying the logits to the host.

Compiles run on the decoder's own thread (`matcher_later`), never on the caller's (the
server's event loop) nor inside the engine's step; every schema that reaches an engine has
passed `grammar.GrammarGate` (static bounds, then a compile proven within the time limit in
a killable child process). Compiled grammars are kept by xgrammar's cache, bounded by
`grammar_cache_bytes` (least recently used first out).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from types import ModuleType
from typing import Protocol

import numpy as np
import torch

from mistral_serving.engines.base import EngineRequestError
from mistral_serving.structured.constraint import GuidedDecoding
from mistral_serving.structured.grammar_pool import clean_xgrammar_error
from mistral_serving.text.tokenizer import Tokenizer

DEFAULT_CACHE_BYTES = 64 * 2**20  # settings.grammar_cache_bytes' default


# xgrammar ships no type information: what this module uses of it (xgrammar 0.2.x,
# `xgrammar/compiler.py`, `xgrammar/matcher.py`).
class CompiledGrammar(Protocol):
    """`xgrammar.CompiledGrammar`: handed to a `GrammarMatcher`."""

    @property
    def memory_size_bytes(self) -> int: ...


class _GrammarCompiler(Protocol):
    def compile_json_schema(self, schema: str, *, any_whitespace: bool) -> CompiledGrammar: ...

    def get_cache_size_bytes(self) -> int: ...


class _GrammarMatcher(Protocol):
    def fill_next_token_bitmask(self, bitmask: torch.Tensor) -> None: ...

    def accept_token(self, token_id: int) -> bool: ...

    def is_terminated(self) -> bool: ...


class GuidedDecoder:
    """xgrammar (a slow import) and its compiler are set up at the first structured
    request, not at start-up: most servers never see one."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        vocab_size: int | None = None,
        cache_limit_bytes: int = DEFAULT_CACHE_BYTES,
    ) -> None:
        self._tokenizer = tokenizer
        # The model's vocabulary can be larger than the tokenizer's (padded embeddings):
        # those ids decode to nothing and are never allowed.
        n = len(tokenizer.table.token_bytes)
        self.vocab_size = max(vocab_size or n, n)
        self.cache_limit_bytes = cache_limit_bytes
        self._compiler: _GrammarCompiler | None = None
        self._xgr: ModuleType | None = None
        self._cache_bytes = 0
        self._lock = threading.Lock()  # compile calls may come from several threads
        # One thread: compiles are CPU-bound (max_threads=1) and already proven cheap.
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="grammar-compile")

    def _compiler_once(self) -> tuple[ModuleType, _GrammarCompiler]:
        """Under the lock: the grammar compiler for this tokenizer."""
        if self._compiler is None or self._xgr is None:
            import xgrammar as xgr

            tok = self._tokenizer
            info = xgr.TokenizerInfo(
                [b or b"" for b in tok.table.token_bytes],
                xgr.VocabType.RAW,
                vocab_size=self.vocab_size,
                stop_token_ids=sorted({tok.eos_id, *tok.stop_token_ids}),
            )
            self._xgr = xgr
            # xgrammar's LRU, bounded in bytes (unbounded, it kept every schema forever).
            limit = self.cache_limit_bytes
            self._compiler = xgr.GrammarCompiler(
                info, max_threads=1, cache_enabled=limit > 0, cache_limit_bytes=max(limit, 1)
            )
        return self._xgr, self._compiler

    def compile(self, guided: GuidedDecoding) -> CompiledGrammar:
        """The compiled grammar (xgrammar's cache answers a repeated schema); a schema
        xgrammar cannot compile is the client's error."""
        with self._lock:
            try:
                # json_object is OpenAI's "any JSON object"; no free whitespace, so a model
                # cannot stall in a run of spaces. grammar_pool's child compiles the same way.
                schema = guided.json_schema if guided.kind == "json_schema" else None
                _, compiler = self._compiler_once()
                compiled = compiler.compile_json_schema(
                    schema or '{"type": "object"}', any_whitespace=False
                )
                self._cache_bytes = int(compiler.get_cache_size_bytes())
                return compiled
            except Exception as exc:  # xgrammar raises RuntimeError/ValueError on bad schemas
                raise EngineRequestError(
                    f"response_format: cannot use this schema: {clean_xgrammar_error(exc)}"
                ) from None

    def matcher(self, guided: GuidedDecoding) -> GuidedMatcher:
        """A fresh matcher for one request, compiled on the calling thread."""
        compiled = self.compile(guided)
        xgr, _ = self._compiler_once()  # set up by the compile
        return GuidedMatcher(xgr, compiled, self.vocab_size)

    def matcher_later(
        self, guided: GuidedDecoding, done: Callable[[GuidedMatcher | BaseException], None]
    ) -> None:
        """Compile on the decoder's thread, then call `done` there with the matcher or the
        error: the caller (an event loop, the engine's step) never waits for a compile."""

        def build() -> None:
            try:
                result: GuidedMatcher | BaseException = self.matcher(guided)
            except BaseException as exc:  # noqa: BLE001 - handed to the request it belongs to
                result = exc
            done(result)

        self._executor.submit(build)

    def cache_bytes(self) -> int:
        """Memory held by xgrammar's cache of compiled grammars after the last compile
        (read without the lock: a scrape never waits for a compile)."""
        return self._cache_bytes


class GuidedMatcher:
    """Per-request grammar state: `mask` before sampling, `accept` after."""

    def __init__(self, xgr: ModuleType, compiled: CompiledGrammar, vocab_size: int) -> None:
        self._xgr = xgr
        self._matcher: _GrammarMatcher = xgr.GrammarMatcher(compiled)
        self._bitmask: torch.Tensor = xgr.allocate_token_bitmask(1, vocab_size)
        self._vocab_size = vocab_size

    def mask(self, logits: torch.Tensor) -> None:
        """Set the logits of disallowed tokens to -inf, in place (one row, any device)."""
        self._matcher.fill_next_token_bitmask(self._bitmask)
        row = logits.view(-1)
        n = min(row.numel(), self._vocab_size)
        # Token i is bit i % 32 of word i // 32: the words' little-endian bytes (no copy
        # on a little-endian host), bits least significant first, are one bool per token.
        words = self._bitmask.numpy().astype("<i4", copy=False).view(np.uint8)
        allowed = np.unpackbits(words, count=n, bitorder="little").view(np.bool_)
        if row.device.type == "cpu" and row.dtype == torch.float32:
            # Through numpy's memory view: no copy, and legal on inference tensors.
            np.copyto(row.detach().numpy()[:n], -np.inf, where=~allowed)
            return
        # Elsewhere (a GPU, or another dtype): 1 byte per token goes to the device, the
        # logits stay there (no host round trip of the row).
        blocked = torch.from_numpy(~allowed).to(row.device)
        row[:n].masked_fill_(blocked, float("-inf"))

    def accept(self, token_id: int) -> None:
        if not self._matcher.is_terminated() and not self._matcher.accept_token(token_id):
            raise EngineRequestError(
                f"token {token_id} is not allowed by the response_format grammar"
            )

    @property
    def done(self) -> bool:
        return self._matcher.is_terminated()

    @property
    def xgrammar_matcher(self) -> _GrammarMatcher:
        """The xgrammar matcher (for `guided_batch.py`'s batched fill)."""
        return self._matcher

    @property
    def vocab_size(self) -> int:
        return self._vocab_size
