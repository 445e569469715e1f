"""Verdicts on what the server answered, without the server: greedy answers by token-prefix
agreement with a near-tie tolerance, the drain's record, chat logprobs.

Random weights have near-tied logits: batch-size-dependent kernels flip a greedy choice now
and then on a correct stack, and the continuation then differs. So greedy answers are
compared by token-prefix agreement (`judge_agreement`), each with a reference run at the
same batch size (`batch_pairs`: batch-mates with each other and with the reference): all
equal is a pass; pairs that differ only after their first MIN_AGREE_TOKENS tokens are a
WARN (near ties), however many; more than a quarter of the pairs differing within their
first MIN_AGREE_TOKENS tokens is a FAIL (wrong or garbled output). TensorRT-LLM's KV block
reuse is turned off for the run (`trtllm_kv_block_reuse=false`) so equal requests take the
same kernels.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mistral_build.verify.config import (
    EXITED_ON_SIGTERM,
    SHUTDOWN_BUDGET_NAME,
    SHUTDOWN_BUDGET_S,
)
from mistral_build.verify.results import CheckFailed, CheckWarned

# The near-tie tolerance: a flip is rare per token (random weights: the top two logits of
# 32,000 are seldom closer than the kernels' rounding), so a few pairs that differ, late,
# are near ties; many, or early, are a broken server.
MIN_AGREE_TOKENS = 4
LOGPROB_TOLERANCE = 1e-3  # the greedy token's logprob against the best listed (rounding)

Tokenize = Callable[[str], list[int]]


@dataclass(frozen=True)
class Agreement:
    """How two greedy answers to the same request compare, in tokens."""

    common: int  # tokens they share from the start
    lengths: tuple[int, int]

    @property
    def same(self) -> bool:
        return self.common == self.lengths[0] == self.lengths[1]

    @property
    def early(self) -> bool:
        """They differ within the first MIN_AGREE_TOKENS tokens (one ending early, by EOS,
        where the other goes on, counts as agreeing that far)."""
        return not self.same and self.common < min(MIN_AGREE_TOKENS, *self.lengths)


def agreement(reference: list[int], got: list[int]) -> Agreement:
    common = len(os.path.commonprefix([reference, got]))
    return Agreement(common, (len(reference), len(got)))


def judge_agreement(what: str, pairs: list[tuple[str, str]], tokenize: Tokenize) -> str:
    """(reference, other) greedy answers of equal requests. All equal: the pass detail.
    Differences after the first MIN_AGREE_TOKENS tokens only: CheckWarned, however many
    (near ties). More than a quarter of the pairs differing within MIN_AGREE_TOKENS tokens
    (any, for fewer than four pairs): CheckFailed."""
    n = len(pairs)
    found = [agreement(tokenize(a), tokenize(b)) for a, b in pairs]
    differ = [i for i, a in enumerate(found) if not a.same]
    if not differ:
        return f"{what}: {n} of {n} equal"
    early = [i for i in differ if found[i].early]
    where = "; ".join(
        f"#{i}: first {found[i].common} of {min(found[i].lengths)} tokens agree" for i in differ[:4]
    )
    summary = f"{what}: {len(differ)} of {n} differ ({where})"
    if len(early) > n // 4:
        raise CheckFailed(
            f"{summary}: {len(early)} differ within their first {MIN_AGREE_TOKENS} tokens "
            "(more than a near tie: wrong or garbled output)"
        )
    raise CheckWarned(
        f"{summary}; within the near-tie tolerance (agree on the first {MIN_AGREE_TOKENS}+ "
        "tokens): random weights flip greedy near-ties between batch sizes"
    )


def batch_pairs(references: list[str], batch: list[str]) -> list[tuple[str, str]]:
    """Pairs to judge for `batch`, answers of equal requests that shared a batch, against
    `references`, the same requests run together at the same batch size: the batch-mates
    with each other, the references with each other, and each answer with its reference.
    (A reference at another batch size differs from a whole batch at one near tie.)"""
    pairs = [(batch[0], other) for other in batch[1:]]
    pairs += [(references[0], other) for other in references[1:]]
    pairs += list(zip(references, batch, strict=True))
    return pairs


def make_tokenize(artifact: str | None) -> Tokenize:
    """The artifact's tokenizer (mistral_serving's loader, as the server reads it); UTF-8
    bytes if it has none (the comparison then counts bytes, which is stricter)."""
    if artifact:
        try:
            from mistral_serving.text.tokenizer import load_tokenizer

            tokenizer = load_tokenizer(Path(artifact))
            return tokenizer.encode
        except Exception as exc:  # no tokenizer files: compare bytes
            print(f"  (comparing answers by bytes: no tokenizer in {artifact}: {exc})")
    return lambda text: list(text.encode())


@dataclass
class Drain:
    """What the drain check saw, for `judge_drain`."""

    in_flight: float  # running at SIGTERM
    outcomes: list[tuple[str, str]]  # ("completed" | "cut", text) per stream
    # The same requests non-streamed, as many at once as there were streams (same batch size).
    references: list[str]
    drain_s: float  # SIGTERM -> the last stream ended
    shutdown_s: float  # the last stream ended -> the process exited (llm.shutdown() in it)
    grace: float
    code: int | None
    closed: bool  # the listener stopped accepting connections


def judge_drain(d: Drain, tokenize: Tokenize) -> str:
    states = [state for state, _ in d.outcomes]
    summary = (
        f"{d.in_flight:.0f} in flight at SIGTERM; streams: {', '.join(states)}; drained in "
        f"{d.drain_s:.1f} s, shutdown + exit {d.shutdown_s:.1f} s (exit {d.code}; grace "
        f"{d.grace:.0f} s)"
    )
    if d.in_flight < 2:
        raise CheckFailed(f"{summary}: the streams ended before SIGTERM: raise --drain-tokens")
    if "cut" in states:
        why = (
            "the streams outlast the grace period: lower --drain-tokens"
            if d.drain_s >= d.grace
            else "cut before the grace period ended: the drain does not let requests finish"
        )
        raise CheckFailed(f"{summary}: {why}")
    if d.code not in EXITED_ON_SIGTERM or not d.closed:
        raise CheckFailed(summary + ("" if d.closed else "; still accepting connections"))
    if d.shutdown_s > SHUTDOWN_BUDGET_S:
        raise CheckFailed(
            f"{summary}: the exit came {d.shutdown_s:.1f} s after the drain, more than the "
            f"{SHUTDOWN_BUDGET_S:.0f} s the Deployment leaves after it ({SHUTDOWN_BUDGET_NAME}; "
            "llm.shutdown() hangs?)"
        )
    pairs = batch_pairs(d.references, [text for _, text in d.outcomes])
    try:
        verdict = judge_agreement("drained and non-streamed batch-mates", pairs, tokenize)
        return f"{summary}; {verdict}"
    except CheckWarned as warned:
        raise CheckWarned(f"{summary}; {warned}") from None


def judge_logprobs(content: list[dict[str, Any]], completion_tokens: int, k: int) -> None:
    """OpenAI chat `logprobs.content` of a greedy answer; CheckFailed says what is wrong."""
    if len(content) != completion_tokens:
        raise CheckFailed(f"{len(content)} logprob entries for {completion_tokens} tokens")
    for i, entry in enumerate(content):
        lp = entry.get("logprob")
        top = [t.get("logprob") for t in entry.get("top_logprobs") or []]
        values = [lp, *top]
        if not all(isinstance(v, (int, float)) and math.isfinite(v) and v <= 0 for v in values):
            raise CheckFailed(f"token {i}: logprobs {values} are not all finite and <= 0")
        if not min(1, k) <= len(top) <= k:
            raise CheckFailed(f"token {i}: {len(top)} top_logprobs, asked for {k}")
        if not top:
            continue
        if top != sorted(top, reverse=True):
            raise CheckFailed(f"token {i}: top_logprobs {top} not best first")
        if lp < top[0] - LOGPROB_TOLERANCE:
            raise CheckFailed(
                f"token {i}: the greedy token's logprob {lp:.4f} is below the best listed "
                f"{top[0]:.4f}: logprobs do not belong to the sampled tokens"
            )
