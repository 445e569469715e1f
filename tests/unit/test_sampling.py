"""The PyTorch engines' sampler (`engines/sampling.py`, shared by the dynamic and the static
engine): options act on the logits as documented, and no value the schemas accept, nor
any logits a broken model can produce, yields NaN, an exception or a masked token."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mistral_serving.engines.base import EngineError, SamplingOptions
from mistral_serving.engines.sampling import NO_LOGPROB, Sampled, sample_next_tokens, sample_row

VOCAB = 16


@dataclass
class Row:
    prompt: list[int]
    sampling: SamplingOptions
    generated: list[int] = field(default_factory=list)
    generator: torch.Generator = field(default_factory=lambda: torch.Generator().manual_seed(0))
    stop_ids: frozenset[int] = frozenset({2})
    mask_fn: object = None


def row(prompt=(0,), generated=(), seed=0, **opts) -> Row:
    return Row(
        list(prompt),
        SamplingOptions(max_new_tokens=10, **opts),
        list(generated),
        torch.Generator().manual_seed(seed),
    )


def pick(logits, r: Row) -> int:
    out = sample_next_tokens(torch.tensor([logits], dtype=torch.float32), [r])[0]
    assert isinstance(out, Sampled), out
    return out.token


LOGITS = [0.0, 5.0, 4.0, 3.0, -1.0]


def test_sampling_options_act_on_the_logits():
    assert pick(LOGITS, row(top_k=1)) == 1
    # Repetition penalty (HF): seen token 1 drops from 5 to 5/10.
    assert pick(LOGITS, row([1], top_k=1, repetition_penalty=10.0)) == 2
    # Presence/frequency (OpenAI) on generated tokens only: 1 seen twice, 2 once.
    r = row([0], [1, 1, 2], top_k=1, frequency_penalty=1.0, presence_penalty=0.1)
    assert pick(LOGITS, r) == 3  # 5-2.1, 4-1.1, 3
    # top_k=2 never leaves {1, 2}; top_p tiny keeps only the best.
    picks = {pick(LOGITS, row(seed=i, top_k=2, temperature=2.0)) for i in range(50)}
    assert picks == {1, 2}
    picks = {pick(LOGITS, row(seed=i, top_p=0.01, temperature=2.0)) for i in range(20)}
    assert picks == {1}
    # temperature 0, or below the greedy threshold, is greedy whatever top_k says.
    assert pick(LOGITS, row(temperature=0.0)) == 1
    assert pick(LOGITS, row(temperature=5e-324)) == 1


def test_min_tokens_masks_the_stop_tokens_until_reached():
    logits = [0.0, 1.0, 9.0, 3.0]  # 2 (a stop id) is the best
    assert pick(logits, row(top_k=1, min_tokens=2)) == 3
    assert pick(logits, row(generated=[3], top_k=1, min_tokens=2)) == 3
    assert pick(logits, row(generated=[3, 3], top_k=1, min_tokens=2)) == 2


def test_a_mask_fn_restricts_the_tokens_and_an_empty_mask_falls_back():
    r = row(top_k=1)
    r.mask_fn = lambda logits: logits[1:3].fill_(-math.inf)
    assert pick(LOGITS, r) == 3
    r.mask_fn = lambda logits: logits.fill_(-math.inf)
    assert pick(LOGITS, r) == 1  # nothing allowed: the model's best rather than no answer
    r.mask_fn = lambda logits: logits.fill_(math.nan)
    assert pick(LOGITS, r) == 1


def test_logprobs_are_the_log_softmax_before_temperature_and_truncation():
    logits = torch.tensor(LOGITS)
    expected = torch.log_softmax(logits, -1)
    out = sample_row(logits.clone(), row(temperature=0.3, top_k=2, logprobs=3))
    lp = out.logprob
    assert lp is not None and lp.token_id == out.token
    assert lp.logprob == pytest.approx(float(expected[out.token]), abs=1e-6)
    assert [t for t, _ in lp.top] == [1, 2, 3]
    assert [v for _, v in lp.top] == pytest.approx(expected[[1, 2, 3]].tolist(), abs=1e-6)
    # After penalties: token 1 seen, 5 -> 0.5.
    out = sample_row(logits.clone(), row([1], top_k=1, repetition_penalty=10.0, logprobs=0))
    penalized = torch.log_softmax(torch.tensor([0.0, 0.5, 4.0, 3.0, -1.0]), -1)
    assert out.token == 2 and out.logprob.top == ()
    assert out.logprob.logprob == pytest.approx(float(penalized[2]), abs=1e-6)


def test_a_row_without_a_finite_logit_fails_alone():
    logits = torch.tensor(
        [[math.nan] * 4, [0.0, math.nan, 1.0, -math.inf], [-math.inf] * 4, [0.0, 0, 0, 7]]
    )
    rows = [row(top_k=1), row(top_k=1), row(temperature=1.0), row(temperature=0.5, seed=3)]
    out = sample_next_tokens(logits, rows)
    assert isinstance(out[0], EngineError) and "no finite logits" in str(out[0])
    assert out[1] == Sampled(2)
    assert isinstance(out[2], EngineError)
    assert isinstance(out[3], Sampled)


def test_a_failing_row_does_not_touch_the_others():
    rows = [row(top_k=1), row(temperature=1.0), row(top_k=1, logprobs=1)]
    rows[1].mask_fn = lambda logits: 1 / 0
    out = sample_next_tokens(torch.tensor([LOGITS] * 3), rows)
    assert out[0] == Sampled(1) and isinstance(out[1], ZeroDivisionError)
    assert isinstance(out[2], Sampled) and out[2].token == 1


# ---- property-based: every accepted option value, any logits ----

special = st.sampled_from([math.nan, math.inf, -math.inf, 3.4e38, -3.4e38, 0.0])
logit_values = st.one_of(st.floats(-1e4, 1e4, width=32), special)
temperatures = st.one_of(
    st.just(0.0),
    st.just(5e-324),
    st.floats(5e-324, 1e-5),
    st.floats(1e-5, 2.0),
)
options = st.builds(
    SamplingOptions,
    max_new_tokens=st.just(8),
    temperature=temperatures,
    top_k=st.one_of(st.integers(0, VOCAB + 2), st.just(1 << 20)),
    top_p=st.one_of(st.just(1.0), st.just(1e-300), st.floats(1e-300, 1.0)),
    seed=st.integers(0, 2**63 - 1),
    repetition_penalty=st.one_of(
        st.just(1.0), st.just(10.0), st.just(5e-324), st.floats(5e-324, 10.0)
    ),
    presence_penalty=st.floats(-2.0, 2.0),
    frequency_penalty=st.floats(-2.0, 2.0),
    min_tokens=st.integers(0, 3),
    logprobs=st.one_of(st.none(), st.integers(0, 20)),
)


@settings(max_examples=400, deadline=None)
@given(
    opts=options,
    logits=st.lists(logit_values, min_size=VOCAB, max_size=VOCAB),
    prompt=st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=6),
    generated=st.lists(st.integers(0, VOCAB - 1), max_size=6),
)
def test_sampling_never_yields_nan_or_raises_for_accepted_options(opts, logits, prompt, generated):
    r = Row(prompt, opts, generated, torch.Generator().manual_seed(opts.seed or 0))
    out = sample_next_tokens(torch.tensor([logits], dtype=torch.float32), [r])[0]
    finite = [i for i, v in enumerate(logits) if not math.isnan(v) and v != -math.inf]
    if not finite:
        assert isinstance(out, EngineError)  # nothing to say: this request fails alone
        return
    assert isinstance(out, Sampled), out
    assert 0 <= out.token < VOCAB
    assert out.token in finite  # never a NaN / -inf logit while a finite one exists
    if opts.logprobs is None:
        assert out.logprob is None
    else:
        lp = out.logprob
        assert lp is not None and lp.token_id == out.token
        values = [lp.logprob, *(v for _, v in lp.top)]
        assert all(math.isfinite(v) and (v <= 1e-6 or v == NO_LOGPROB) for v in values)
        assert len(lp.top) == min(opts.logprobs, VOCAB)


@settings(max_examples=200, deadline=None)
@given(opts=options, logits=st.lists(st.floats(-50, 50, width=32), min_size=VOCAB, max_size=VOCAB))
def test_greedy_options_pick_the_best_allowed_token(opts, logits):
    """Greedy with no penalty: the argmax, or with min_tokens pending the best non-stop."""
    opts = SamplingOptions(
        max_new_tokens=8, top_k=1, min_tokens=opts.min_tokens, logprobs=opts.logprobs
    )
    r = Row([0], opts)
    token = pick(logits, r)
    allowed = [v if (i != 2 or not opts.min_tokens) else -math.inf for i, v in enumerate(logits)]
    assert allowed[token] == max(allowed)


def test_extreme_penalties_keep_a_finite_logit_finite():
    # -3.4e38 * 10 overflows; it is the only finite logit, so it must still be picked.
    logits = [-math.inf, -3.4e38, math.nan, -math.inf]
    assert pick(logits, row([1], top_k=1, repetition_penalty=10.0)) == 1
    assert pick(logits, row([1], temperature=1.0, repetition_penalty=10.0, logprobs=2)) == 1
    # A penalty near 0 divides by almost nothing: +inf would win over everything, NaN later.
    assert pick([1.0, 2.0, 0.5], row([0], temperature=0.7, repetition_penalty=5e-324)) == 0


# ---- plain sampled rows: one batched draw ----


def reference_kept(logits: list[float], opts: SamplingOptions) -> set[int]:
    """The tokens one row may draw: the row-by-row formula of the sampler before rows were
    batched (shift, temperature, top-k's k-th value, top-p's smallest prefix), as a spec."""
    row = torch.tensor(logits, dtype=torch.float32)
    row = (row - row.max()) / min(opts.temperature, 1e4)
    if 0 < opts.top_k < row.numel():
        row = row.masked_fill(row < torch.topk(row, opts.top_k).values[-1], -math.inf)
    if opts.top_p < 1.0:
        sorted_logits, order = torch.sort(row, descending=True)
        probs = sorted_logits.softmax(-1)
        drop = probs.cumsum(-1) - probs > opts.top_p
        row = row.scatter(0, order, sorted_logits.masked_fill(drop, -math.inf))
    return {i for i, v in enumerate(row.tolist()) if v != -math.inf}


sampled_options = st.builds(
    SamplingOptions,
    max_new_tokens=st.just(8),
    temperature=st.one_of(st.floats(1e-5, 2.0), st.just(2.0)),
    top_k=st.one_of(st.just(0), st.integers(2, VOCAB + 2)),
    top_p=st.one_of(st.just(1.0), st.floats(1e-6, 1.0)),
)


@settings(max_examples=200, deadline=None)
@given(
    batch=st.lists(
        st.tuples(sampled_options, st.lists(st.floats(-30, 30, width=32), min_size=VOCAB,
                                            max_size=VOCAB)),
        min_size=1, max_size=8,
    ),
    seed=st.integers(0, 2**32),
)  # fmt: skip
def test_plain_sampled_rows_draw_together_from_each_rows_own_truncation(batch, seed):
    rows = [Row([0], opts, generator=torch.Generator().manual_seed(seed)) for opts, _ in batch]
    out = sample_next_tokens(torch.tensor([logits for _, logits in batch]), rows)
    for (opts, logits), got in zip(batch, out):
        assert isinstance(got, Sampled) and got.logprob is None
        assert got.token in reference_kept(logits, opts), (opts, logits, got)


def test_plain_sampled_rows_take_one_draw_not_the_per_row_path(monkeypatch):
    import mistral_serving.engines.sampling as sampling

    calls = []
    monkeypatch.setattr(sampling, "sample_row", lambda r, s: calls.append(s) or Sampled(0))
    rows = [row(temperature=0.8), row(temperature=1.0, top_k=3), row(temperature=1.0, top_p=0.5)]
    seeded = Row([0], SamplingOptions(max_new_tokens=8, temperature=1.0, seed=7))
    penalized = row([1], temperature=1.0, repetition_penalty=1.2)
    out = sample_next_tokens(torch.tensor([LOGITS] * 5), [*rows, seeded, penalized])
    assert calls == [penalized]  # only what the batch does not do goes row by row
    assert all(isinstance(o, Sampled) for o in out[:4])


@pytest.mark.parametrize("seeded", [False, True])
def test_the_batched_draw_follows_the_softmax(seeded):
    """4,000 rows, temperature 0.5 over logits 0..3, unseeded (one shared draw) or each with
    its own seed (its own generator): each token's share is its softmax probability, within
    5 standard errors (seeded generators: the same draw each run); the top-k and top-p rows
    in the same batch never leave their kept sets."""
    logits = [0.0, 1.0, 2.0, 3.0]
    n = 4000

    def opts(i: int) -> SamplingOptions:
        return SamplingOptions(max_new_tokens=8, temperature=0.5, seed=i if seeded else None)

    plain = [Row([0], opts(i), generator=torch.Generator().manual_seed(i)) for i in range(n)]
    topk = Row([0], SamplingOptions(max_new_tokens=8, temperature=5.0, top_k=2))
    topp = Row([0], SamplingOptions(max_new_tokens=8, temperature=5.0, top_p=0.3))
    out = sample_next_tokens(torch.tensor([logits] * (n + 2)), [*plain, topk, topp])
    tokens = [o.token for o in out if isinstance(o, Sampled)]
    assert len(tokens) == n + 2
    probs = torch.softmax(torch.tensor(logits) / 0.5, -1).tolist()
    for t, p in enumerate(probs):
        share = tokens[:n].count(t) / n
        assert abs(share - p) <= 5 * math.sqrt(p * (1 - p) / n) + 1e-9, (t, share, p)
    assert tokens[n] in {2, 3} and tokens[n + 1] in {2, 3}


def test_a_truncated_token_is_never_drawn_even_where_the_race_draws_zero(monkeypatch):
    """E = 0 (possible in floating point) on a token top-k removed (p = 0) would make 0 / 0 =
    NaN, which argmax would pick: E is clamped above 0."""
    original = torch.Tensor.exponential_
    monkeypatch.setattr(torch.Tensor, "exponential_", lambda t, **kw: original(t, **kw).fill_(0.0))
    r = Row([0], SamplingOptions(max_new_tokens=8, temperature=1.0, top_k=2))
    assert sample_next_tokens(torch.tensor([LOGITS]), [r])[0].token in {1, 2}


def test_a_seeded_row_beside_batched_rows_repeats_its_own_sequence():
    logits = torch.tensor([LOGITS] * 3)
    seeded = SamplingOptions(max_new_tokens=8, temperature=1.5, top_p=0.9, seed=11)

    def seeded_row() -> Row:
        return Row([0], seeded, generator=torch.Generator().manual_seed(11))

    alone = [sample_next_tokens(logits[:1], [seeded_row()])[0] for _ in range(20)]
    beside = [
        sample_next_tokens(logits, [row(temperature=1.0), seeded_row(), row(top_k=1)])
        for _ in range(20)
    ]
    assert [b[1] for b in beside] == alone
    assert all(b[2] == Sampled(1) for b in beside)
