"""The prefill rule both PyTorch engines share (`dynamic.py`, `static.py`):
what one step may prefill together, and how prompt logprobs (echo)
are computed without materialising logits for positions nobody asked about.

A prefill of `rows` prompts padded to `width` columns costs:
- activations and KV writes for `rows x width` positions (padding included: the dynamic
  engine left-pads, the static one right-pads), bounded by `max_num_tokens`;
- logits: one row of `vocab` for each prompt's last position (the first token is sampled
  from it), and, for each prompt that asked for prompt logprobs, its own positions only,
  projected through lm_head `chunk` positions at a time.
Every logit position costs `vocab x (model dtype + 12)` bytes at its peak (the logits,
their float32 copy, its sanitized copy and the float32 log-softmax), and `prefill_logits_bytes` bounds what one
projection may hold. So a prompt-logprobs prompt of any length beside any number of short
prompts holds at most `prefill_logits_bytes` of logits at once: never `rows x longest x
vocab` (33 requests with one 2,000-token echo were 8.45 GB on the dev model that way).

The first waiting request is always admitted (alone if it must be), so nothing starves.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

import torch

from mistral_serving.engines.base import SamplingOptions, TokenLogprob
from mistral_serving.engines.sampling import prompt_logprobs

# Bytes of float32 work per logit on top of the logit itself, in
# `sampling.prompt_logprobs`: `.float()` (a copy unless already float32), the NaN/inf
# sanitizing copy and the log-softmax.
_WORK_BYTES_PER_LOGIT = 12


class Prompted(Protocol):
    prompt: list[int]
    sampling: SamplingOptions


S = TypeVar("S", bound=Prompted)


@dataclass(frozen=True)
class PrefillBudget:
    max_tokens: int  # rows x width per step (`max_num_tokens`)
    logits_bytes: int  # logits one projection may hold (`prefill_logits_bytes`)
    vocab: int  # columns of lm_head's output
    logit_size: int  # bytes of one logit in the model's dtype

    @property
    def position_bytes(self) -> int:
        """Peak bytes of one position's logits while its logprobs are computed."""
        return self.vocab * (self.logit_size + _WORK_BYTES_PER_LOGIT)

    @property
    def chunk(self) -> int:
        """Prompt positions projected through lm_head at once (at least 1)."""
        return max(1, self.logits_bytes // self.position_bytes)

    def fits(self, rows: int, width: int) -> bool:
        """Whether `rows` prompts padded to `width` may be prefilled in one step: their
        padded positions within `max_tokens`, their last-position logits within the
        logits budget."""
        return rows * width <= self.max_tokens and rows * self.position_bytes <= self.logits_bytes


def take_admissible(waiting: collections.deque[S], room: int, budget: PrefillBudget) -> list[S]:
    """Pop from the head of `waiting`, in order, the requests one prefill step may take:
    at most `room` (free batch slots), while the padded batch fits `budget`. The first is
    always taken when there is room. The caller holds the lock on `waiting`."""
    taken: list[S] = []
    width = 0
    while waiting and len(taken) < room:
        wider = max(width, len(waiting[0].prompt))
        if taken and not budget.fits(len(taken) + 1, wider):
            break
        width = wider
        taken.append(waiting.popleft())
    return taken


# How torch words an allocation that failed: torch.OutOfMemoryError on CUDA (a
# RuntimeError); on the CPU a plain RuntimeError from c10's DefaultCPUAllocator
# ("not enough memory" / "can't allocate memory").
_ALLOCATION_WORDS = ("out of memory", "not enough memory", "can't allocate memory")


def is_allocation_failure(exc: BaseException) -> bool:
    """Whether `exc` says an allocation failed (the request's size, not a broken device:
    a CUDA error such as an illegal memory access is not one)."""
    if isinstance(exc, (MemoryError, torch.OutOfMemoryError)):
        return True
    return isinstance(exc, RuntimeError) and any(w in str(exc) for w in _ALLOCATION_WORDS)


def chunked_prompt_logprobs(
    hidden: torch.Tensor,
    prompt: Sequence[int],
    k: int,
    project: Callable[[torch.Tensor], torch.Tensor],
    chunk: int,
) -> list[TokenLogprob]:
    """Prompt tokens 1..n-1's logprobs (and the top k) from `hidden` [n, H], the final
    hidden states of this prompt's own positions 0..n-1: `project` (lm_head) is applied
    to at most `chunk` positions at a time, so the logits held at once are
    `chunk x vocab`, whatever the prompt's length. Same values as one projection of all
    positions (`sampling.prompt_logprobs` per chunk: each position is its own softmax)."""
    n = len(prompt)
    out: list[TokenLogprob] = []
    for start in range(0, n - 1, chunk):
        end = min(start + chunk, n - 1)
        logits = project(hidden[start:end])
        out.extend(prompt_logprobs(logits, prompt[start : end + 1], k))
        del logits  # free before the next chunk is projected
    return out
