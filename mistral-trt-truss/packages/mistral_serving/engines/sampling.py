"""Per-request sampling for the PyTorch engines, safe for every value the schemas accept.

transformers' own continuous-batching manager takes one generation config for all
requests, so sampling is ours: each row of a step's logits is sampled with its own
request's options. For one row (float32):

1. Sanitize: NaN -> -inf, +inf -> the largest float, so a model that produced them still
   yields a token (the best finite one). A row with no finite logit at all fails that
   request alone (`EngineError`): there is no token worth emitting.
2. Penalties: repetition (HF semantics: over prompt and output, multiplicative),
   presence and frequency (OpenAI semantics: over output, additive), clamped so that a
   finite logit stays finite (a repetition penalty near 0 divides by almost nothing).
3. Log-probabilities, when asked: the log-softmax of this row, i.e. of the logits after
   penalties and BEFORE the masks below, temperature, top-k and top-p: they describe the
   model's distribution, not the sampler's truncated one. Without penalties this is
   vLLM's default (`raw_logprobs`, the model's own log-softmax); with penalties, vLLM's
   default ignores them and ours includes them.
4. Masks: stop tokens (EOS unless ignore_eos, and stop_token_ids) are -inf until
   `min_tokens` tokens exist; then the sequence's `mask_fn` (structured output: a
   per-row allowed-token mask) edits the row in place. If the masks leave no finite
   logit, the unmasked row's best token is taken rather than failing.
5. Greedy (top_k 1, or temperature below `GREEDY_TEMPERATURE`): argmax. Otherwise the
   row is shifted so its maximum is 0 before dividing by the temperature (no overflow:
   every value stays <= 0, the best stays at 0), then top-k, top-p (always keeps the best
   token: the kept set is the smallest one reaching top_p, and it is never empty), and a
   draw from the softmax with the request's own generator (seeded requests repeat).

Rows that are plain greedy (no penalty, no logprobs, no mask) take one batched argmax;
plain sampled rows (the same, and no min_tokens pending) take one batched draw: the same
shift, temperature, top-k and top-p as row by row (one `_truncate` for both), then the
exponential race (argmax of p / E with E ~ Exp(1), which picks token i with probability
p_i, as vLLM samples): a seeded row's E comes from its own generator, so it repeats its own
sequence whatever else is in the batch; unseeded rows share one draw from the first such
row's generator (seeded at random per request).

Prompt logprobs (`prompt_logprobs`, for echo) come from the prefill's logits at prompt
positions 0..n-2, each the model's own log-softmax (no penalty, mask or temperature): the
log-probability of prompt token i+1 given tokens 0..i, and the top k there.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from mistral_serving.engines.base import EngineError, SamplingOptions, TokenLogprob

NO_LOGPROB = -9999.0  # what a -inf log-probability is reported as (JSON has no -inf)


class Row(Protocol):
    """What the sampler reads of a sequence (the engines' `_Sequence`)."""

    @property
    def prompt(self) -> list[int]: ...
    @property
    def generated(self) -> list[int]: ...
    @property
    def sampling(self) -> SamplingOptions: ...
    @property
    def generator(self) -> torch.Generator: ...
    @property
    def stop_ids(self) -> Collection[int]: ...
    @property
    def mask_fn(self) -> Callable[[torch.Tensor], None] | None: ...


@dataclass(frozen=True)
class Sampled:
    token: int
    logprob: TokenLogprob | None = None


def sample_next_tokens(logits: torch.Tensor, seqs: Sequence[Row]) -> list[Sampled | Exception]:
    """One token per row of `logits` [n, vocab], each with its own request's options. A
    row whose sampling fails gets the exception in its place; the other rows are not
    affected."""
    out: list[Sampled | Exception] = [EngineError("not sampled")] * len(seqs)
    fast = [i for i, s in enumerate(seqs) if plain_greedy(s)]
    if fast:
        try:
            index = torch.tensor(fast, device=logits.device)
            picked = greedy_tokens(logits.index_select(0, index)).tolist()  # one host read
            for i, tok in zip(fast, picked):
                out[i] = pick_of(tok)
        except Exception:  # noqa: BLE001 - fall back to the careful per-row path
            fast = []
    drawn = [i for i, s in enumerate(seqs) if _plain_sampled(s)]
    if drawn:
        try:
            for i, tok in zip(drawn, _draw_batch(logits, drawn, seqs)):
                out[i] = pick_of(tok)
        except Exception:  # noqa: BLE001 - fall back to the careful per-row path
            drawn = []
    done = set(fast) | set(drawn)
    for i, seq in enumerate(seqs):
        if i in done:
            continue
        try:
            out[i] = sample_row(logits[i], seq)
        except Exception as exc:  # noqa: BLE001 - this row's failure is this row's alone
            out[i] = exc
    return out


_BIG = torch.finfo(torch.float32).max  # what +inf becomes
_NO_FINITE = "the model produced no finite logits for this request"


def greedy_tokens(logits: torch.Tensor) -> torch.Tensor:
    """Each row's argmax of `logits` [n, vocab] (float32), sanitized, -1 for a row without a
    finite logit: still on the device (no host read), so an engine can feed it to its next
    step before it reads it (`pick_of` turns each into a row's pick)."""
    values, tokens = _sanitize(logits).max(-1)
    return tokens.masked_fill(~torch.isfinite(values), -1)


def pick_of(token: int) -> Sampled | Exception:
    """A batched pass's token for one row: -1 marks a row without a finite logit."""
    return Sampled(token) if token >= 0 else EngineError(_NO_FINITE)


def plain_greedy(seq: Row) -> bool:
    """A row `greedy_tokens` samples exactly: greedy, no penalty, logprobs, mask or
    pending `min_tokens`."""
    s = seq.sampling
    return (
        s.greedy
        and not _penalized(s)
        and s.logprobs is None
        and seq.mask_fn is None
        and not _min_tokens_pending(seq)
    )


def _plain_sampled(seq: Row) -> bool:
    s = seq.sampling
    return (
        not s.greedy
        and not _penalized(s)
        and s.logprobs is None
        and seq.mask_fn is None
        and not _min_tokens_pending(seq)
    )


_TINY = torch.finfo(torch.float32).tiny


def _draw_batch(logits: torch.Tensor, rows: list[int], seqs: Sequence[Row]) -> list[int]:
    """One token per plain sampled row (`rows` of `logits`), -1 for a row without a finite
    logit: sanitized, truncated as `_pick` does row by row, one race, one host read."""
    x = _sanitize(logits.index_select(0, torch.tensor(rows, device=logits.device)).float())
    ok = torch.isfinite(x.max(-1).values)
    x = torch.where(ok[:, None], x, torch.zeros_like(x))  # as sample_row: the math stays finite
    probs = _truncate(x, [seqs[i].sampling for i in rows]).softmax(-1)
    race = torch.empty_like(probs)
    unseeded = [r for r, i in enumerate(rows) if seqs[i].sampling.seed is None]
    if unseeded:
        shared = torch.empty((len(unseeded), probs.shape[-1]), device=probs.device)
        shared.exponential_(generator=seqs[rows[unseeded[0]]].generator)
        race[unseeded] = shared
    for r, i in enumerate(rows):
        if seqs[i].sampling.seed is not None:
            race[r].exponential_(generator=seqs[i].generator)
    # E is clamped above 0: a truncated token (p = 0) must score 0, never 0 / 0 = NaN.
    tokens = (probs / race.clamp_min(_TINY)).argmax(-1)
    picked: list[int] = tokens.masked_fill(~ok, -1).tolist()
    return picked


def _penalized(s: SamplingOptions) -> bool:
    return s.repetition_penalty != 1.0 or s.presence_penalty != 0.0 or s.frequency_penalty != 0.0


def _min_tokens_pending(seq: Row) -> bool:
    return len(seq.generated) < seq.sampling.min_tokens and bool(seq.stop_ids)


def _sanitize(row: torch.Tensor) -> torch.Tensor:
    return torch.nan_to_num(row, nan=-math.inf, posinf=_BIG, neginf=-math.inf)


def sample_row(row: torch.Tensor, seq: Row) -> Sampled:
    """The next token for one sequence from its logits `row` [vocab] (left unchanged).

    No data-dependent branch until the end: on a GPU every host read waits for the
    device, so one read per row carries the token, the verdict and the logprobs."""
    opts = seq.sampling
    row = _sanitize(row.float())
    if _penalized(opts):
        _apply_penalties(row, seq)
        row = _sanitize(row)
    ok = torch.isfinite(row.max())
    # Without a finite logit the request fails below; until then keep the math finite
    # (a NaN reaching multinomial is a device-side assert on CUDA, fatal to the process).
    row = torch.where(ok, row, torch.zeros_like(row))
    logp = torch.log_softmax(row, -1) if opts.logprobs is not None else None
    masked = _apply_masks(row, seq)
    if masked is not row:  # the masks left nothing: the model's best beats no answer
        masked = torch.where(torch.isfinite(masked.max()), masked, row)
    token = _pick(masked, opts, seq.generator)
    if logp is None:
        picked, good = torch.stack([token, ok.long()]).tolist()
        logprob = None
    else:
        k = max(0, min(opts.logprobs or 0, logp.numel()))
        values, ids = torch.topk(logp, k)
        picked, good, *top_ids = torch.cat([token.view(1), ok.long().view(1), ids]).tolist()
        chosen, *top_values = torch.cat([logp[token].view(1), values]).tolist()
        top = tuple((i, _finite_lp(v)) for i, v in zip(top_ids, top_values))
        logprob = TokenLogprob(picked, _finite_lp(chosen), top)
    if not good:
        raise EngineError(_NO_FINITE)
    return Sampled(picked, logprob)


def prompt_logprobs(logits: torch.Tensor, prompt: Sequence[int], k: int) -> list[TokenLogprob]:
    """Prompt tokens 1..n-1's logprobs and the top k at each, from `logits` [n-1, vocab]:
    the prefill's logits at prompt positions 0..n-2. One device-to-host copy."""
    if len(prompt) < 2:
        return []
    logp = torch.log_softmax(_sanitize(logits.float()), -1)
    targets = torch.tensor(list(prompt[1:]), device=logp.device)
    chosen = logp.gather(1, targets[:, None])[:, 0]
    k = max(0, min(k, logp.shape[-1]))
    values, ids = torch.topk(logp, k, dim=-1)
    chosen_l, values_l, ids_l = (t.tolist() for t in (chosen, values, ids))
    return [
        TokenLogprob(tok, _finite_lp(c), tuple((i, _finite_lp(v)) for i, v in zip(ir, vr)))
        for tok, c, ir, vr in zip(prompt[1:], chosen_l, ids_l, values_l)
    ]


def _apply_penalties(row: torch.Tensor, seq: Row) -> None:
    opts = seq.sampling
    if opts.repetition_penalty != 1.0:  # HF semantics: over prompt and output tokens
        seen = torch.tensor(sorted(set(seq.prompt) | set(seq.generated)), device=row.device)
        scores = row[seen]
        penalized = torch.where(
            scores < 0, scores * opts.repetition_penalty, scores / opts.repetition_penalty
        )
        # A finite score stays finite (10 x -3e38 would be -inf: a token lost for good).
        row[seen] = torch.where(scores.isfinite(), penalized.clamp(-_BIG, _BIG), scores)
    if seq.generated and (opts.presence_penalty or opts.frequency_penalty):  # OpenAI semantics
        counts = collections.Counter(seq.generated)  # on the host: no device round trip
        ids = torch.tensor(list(counts), device=row.device)
        times = torch.tensor(list(counts.values()), dtype=row.dtype, device=row.device)
        row[ids] -= opts.presence_penalty + opts.frequency_penalty * times


def _apply_masks(row: torch.Tensor, seq: Row) -> torch.Tensor:
    if not _min_tokens_pending(seq) and seq.mask_fn is None:
        return row
    masked = row.clone()
    if _min_tokens_pending(seq):
        vocab = row.numel()
        stops = [t for t in seq.stop_ids if 0 <= t < vocab]
        if stops:
            masked[torch.tensor(stops, device=row.device)] = -math.inf
    if seq.mask_fn is not None:
        seq.mask_fn(masked)
        masked = _sanitize(masked)
    return masked


def _pick(row: torch.Tensor, opts: SamplingOptions, generator: torch.Generator) -> torch.Tensor:
    """The chosen token id as a 0-d tensor (still on the device)."""
    if opts.greedy:
        return row.argmax()
    kept = _truncate(row[None], [opts])
    return torch.multinomial(kept.softmax(-1), 1, generator=generator)[0, 0]


def _truncate(x: torch.Tensor, opts: Sequence[SamplingOptions]) -> torch.Tensor:
    """Rows `x` [n, vocab] (finite maxima) shifted so each maximum is 0, divided by each
    row's temperature, then each row's top-k and top-p: what is left to draw from."""
    vocab = x.shape[-1]
    # The schema stops at 2; inf/inf would be NaN. Max 0: nothing overflows, softmax sums >= 1.
    temps = torch.tensor([min(o.temperature, 1e4) for o in opts], device=x.device)
    x = (x - x.max(-1, keepdim=True).values) / temps[:, None].to(x.dtype)
    ks = [o.top_k if 0 < o.top_k < vocab else 0 for o in opts]
    if any(ks):
        top = torch.topk(x, max(ks), dim=-1).values
        kth = top.gather(1, torch.tensor([max(k, 1) - 1 for k in ks], device=x.device)[:, None])
        off = torch.tensor([k == 0 for k in ks], device=x.device)[:, None]
        x = x.masked_fill((x < kth) & ~off, -math.inf)
    if any(o.top_p < 1.0 for o in opts):
        # A row without top-p keeps everything (a cumulative sum may round past 1.0).
        top_p = torch.tensor([o.top_p if o.top_p < 1.0 else math.inf for o in opts])
        sorted_logits, order = torch.sort(x, descending=True, dim=-1)
        probs = sorted_logits.softmax(-1)
        # Keep the smallest prefix reaching top_p; the first token's "mass before" is 0,
        # so it always stays, however small top_p is.
        drop = probs.cumsum(-1) - probs > top_p.to(x.device, x.dtype)[:, None]
        x = x.scatter(1, order, sorted_logits.masked_fill(drop, -math.inf))
    return x


def _finite_lp(value: float) -> float:
    return value if math.isfinite(value) else NO_LOGPROB
