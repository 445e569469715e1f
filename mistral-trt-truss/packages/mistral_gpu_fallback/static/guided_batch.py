"""Structured output at batch speed: one token bitmask per step for every constrained row.

The per-row path (`guided.GuidedMatcher.mask`, called from `sampling.sample_row`) fills a
bitmask for one row, unpacks it on the host, copies it to the device and masks that row,
and the row then takes the careful per-row sampler (one host read per row). With 64
constrained streams that is 64 fills, 64 host-to-device copies and 64 device round trips
per step. Here, instead (as vLLM's and TensorRT-LLM's xgrammar backends do):

1. `xgrammar.BatchGrammarMatcher.batch_fill_next_token_bitmask` fills one
   `[rows, ceil(vocab / 32)]` int32 bitmask for all of them (xgrammar's own threads). The
   engine calls it right after launching the step's forward pass, so on a GPU the fill runs
   while the device computes the logits.
2. One copy of that bitmask to the device (pinned memory, asynchronous).
3. One masking kernel over all those rows: xgrammar's `apply_token_bitmask_inplace`
   (its Triton kernel) on CUDA; elsewhere the same operation in torch (bits unpacked on the
   device, one `masked_fill`), which on the CPU beats xgrammar's per-row CPU kernel.

The masked rows then need no per-row mask: a greedy constrained row joins the batched
argmax of the plain greedy rows. Rows for which this would change what the per-row path
does keep it: a row that asks for logprobs (they come from the unmasked logits) and a row
whose `min_tokens` still holds its stop tokens back (that path's "nothing left" fallback).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from typing import Any, Protocol

import torch

from mistral_gpu_fallback.static.guided_profile import GuidedProfile

log = logging.getLogger(__name__)


class _Matcher(Protocol):
    """What this module needs of `guided.GuidedMatcher`."""

    @property
    def xgrammar_matcher(self) -> Any: ...

    @property
    def vocab_size(self) -> int: ...


def unpack_allowed(bitmask: torch.Tensor, vocab: int) -> torch.Tensor:
    """[rows, vocab] bool from a [rows, words] int32 bitmask (token i is bit i % 32 of
    word i // 32), on the bitmask's device."""
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    bits = (bitmask[:, :, None] >> shifts) & 1
    return bits.reshape(bitmask.shape[0], -1)[:, :vocab].bool()


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, rows: Sequence[int]) -> None:
    """Set `logits[r, t]` to -inf where bit t of `bitmask[i]` is 0, for r = rows[i], in
    place. `bitmask` is on the logits' device; columns past its bits are masked too."""
    vocab = min(logits.shape[1], bitmask.shape[1] * 32)
    index = torch.tensor(list(rows), device=logits.device)
    sub = logits.index_select(0, index)
    sub[:, :vocab].masked_fill_(~unpack_allowed(bitmask, vocab), -math.inf)
    sub[:, vocab:] = -math.inf
    logits.index_copy_(0, index, sub)


class BatchMasker:
    """One engine's batched masking state: xgrammar's batch matcher and the bitmask
    buffer (pinned on CUDA), grown to the most rows seen."""

    def __init__(self, device: torch.device, profile: GuidedProfile | None = None) -> None:
        import xgrammar as xgr  # loaded already: a constrained row has a matcher

        self._xgr = xgr
        self._device = device
        self._profile = profile  # guided_profile.py: timers for benchmarks, else None
        self._batch = xgr.BatchGrammarMatcher()
        self._host: torch.Tensor | None = None
        self._triton = device.type == "cuda"  # xgrammar's kernel; torch if it cannot load

    def _buffer(self, rows: int, vocab: int) -> torch.Tensor:
        words = (vocab + 31) // 32
        host = self._host
        if host is None or host.shape[0] < rows or host.shape[1] != words:
            host = torch.empty((rows, words), dtype=torch.int32)
            if self._device.type == "cuda":
                host = host.pin_memory()
            self._host = host
        return host[:rows]

    def mask(self, logits: torch.Tensor, rows: Sequence[int], matchers: Sequence[_Matcher]) -> None:
        """Mask `logits` [n, vocab] (float32, in place) at `rows` by their `matchers`."""
        if self._profile is not None:
            self._mask_timed(self._profile, logits, rows, matchers)
            return
        host = self._buffer(len(rows), matchers[0].vocab_size)
        self._batch.batch_fill_next_token_bitmask([m.xgrammar_matcher for m in matchers], host)
        self._apply(logits, host.to(self._device, non_blocking=True), rows)

    def _apply(self, logits: torch.Tensor, bitmask: torch.Tensor, rows: Sequence[int]) -> None:
        if self._triton:
            try:
                self._xgr.apply_token_bitmask_inplace(
                    logits, bitmask, vocab_size=logits.shape[1], indices=list(rows)
                )
                return
            except Exception as exc:  # noqa: BLE001 - e.g. no triton: the torch kernel then
                log.warning("xgrammar's bitmask kernel failed (%r); masking with torch", exc)
                self._triton = False
        apply_bitmask(logits, bitmask, rows)

    def _mask_timed(
        self,
        profile: GuidedProfile,
        logits: torch.Tensor,
        rows: Sequence[int],
        matchers: Sequence[_Matcher],
    ) -> None:
        """`mask`, with its three parts timed (guided_profile.py)."""
        t0 = time.perf_counter()
        host = self._buffer(len(rows), matchers[0].vocab_size)
        self._batch.batch_fill_next_token_bitmask([m.xgrammar_matcher for m in matchers], host)
        profile.add("fill", time.perf_counter() - t0)
        profile.count("fill_rows", len(rows))
        with profile.span("h2d", self._device):
            bitmask = host.to(self._device, non_blocking=True)
        with profile.span("apply", self._device):
            self._apply(logits, bitmask, rows)
