"""Benchmark metric math: hand-computed cases and a cross-check against vLLM's formulas."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from client.metrics import (
    RequestTiming,
    compute_metrics,
    meets_slos,
    parse_slos,
    percentile,
    summarize,
)


def rec(
    ttft: float,
    latency: float,
    out: int | None,
    itl: list[float] | None = None,
    prompt: int = 10,
    ok: bool = True,
) -> RequestTiming:
    return RequestTiming(
        index=0,
        success=ok,
        ttft=ttft,
        latency=latency,
        output_tokens=out,
        prompt_tokens=prompt,
        itl=itl or [],
    )


def test_tpot_excludes_the_first_token() -> None:
    # 11 tokens: the first at 0.1 s, the other 10 over the next 1.0 s -> 100 ms each.
    assert rec(0.1, 1.1, 11).tpot == pytest.approx(0.1)
    assert rec(0.2, 0.5, 4).tpot == pytest.approx(0.1)
    assert rec(0.3, 0.3, 1).tpot is None
    assert rec(0.3, 0.3, 0).tpot is None


def test_hand_computed_run() -> None:
    records = [
        rec(0.1, 1.1, 11, itl=[0.1] * 10, prompt=100),
        rec(0.3, 0.3, 1, prompt=50),
        rec(0.0, 5.0, None, ok=False, prompt=999),
    ]
    m = compute_metrics(records, duration_s=2.0, slos={"ttft": 250})
    assert m["completed"] == 2 and m["failed"] == 1
    assert m["total_input_tokens"] == 150  # failed requests do not count
    assert m["total_output_tokens"] == 12
    assert m["request_throughput"] == pytest.approx(1.0)
    assert m["output_throughput"] == pytest.approx(6.0)
    assert m["total_token_throughput"] == pytest.approx(81.0)
    # TTFT over the two successes: 100 ms and 300 ms.
    assert m["mean_ttft_ms"] == pytest.approx(200.0)
    assert m["median_ttft_ms"] == pytest.approx(200.0)
    assert m["std_ttft_ms"] == pytest.approx(100.0)
    assert m["p90_ttft_ms"] == pytest.approx(280.0)  # 100 + 0.9 * 200
    assert m["p99_ttft_ms"] == pytest.approx(298.0)
    # TPOT only from the request with > 1 token.
    assert m["mean_tpot_ms"] == pytest.approx(100.0)
    assert m["p99_tpot_ms"] == pytest.approx(100.0)
    # ITL pools every gap of every request.
    assert m["mean_itl_ms"] == pytest.approx(100.0)
    assert m["mean_e2el_ms"] == pytest.approx(700.0)
    assert m["p50_e2el_ms"] == pytest.approx(700.0)
    # Goodput: only the 100 ms TTFT request meets ttft <= 250 ms.
    assert m["good_requests"] == 1
    assert m["request_goodput"] == pytest.approx(0.5)


def test_goodput_tpot_of_single_token_request_is_zero_and_slo_is_inclusive() -> None:
    a = rec(0.1, 1.1, 11)  # tpot 100 ms
    b = rec(0.3, 0.3, 1)  # tpot counted as 0 for goodput, as in vLLM
    assert not meets_slos(a, {"tpot": 50})
    assert meets_slos(b, {"tpot": 50})
    assert meets_slos(a, {"tpot": 100.0, "ttft": 100.0, "e2el": 1100.0})  # equal is good
    assert not meets_slos(a, {"e2el": 1099.0})
    m = compute_metrics([a, b], 1.0, slos={"tpot": 50})
    assert m["request_goodput"] == pytest.approx(1.0)


def test_no_slo_means_no_goodput_and_empty_samples_are_none() -> None:
    m = compute_metrics([rec(0.2, 0.2, 1)], 1.0)
    assert m["request_goodput"] is None
    assert m["mean_tpot_ms"] is None and m["p99_itl_ms"] is None
    assert m["mean_ttft_ms"] == pytest.approx(200.0)
    with pytest.raises(ValueError):
        compute_metrics([], 0.0)


def test_parse_slos() -> None:
    assert parse_slos(["ttft:500", "tpot:50"]) == {"ttft": 500.0, "tpot": 50.0}
    assert parse_slos(["ttft:500,e2el:2000"]) == {"ttft": 500.0, "e2el": 2000.0}
    for bad in (["itl:5"], ["ttft"], ["ttft:-1"], ["ttft:abc"]):
        with pytest.raises(ValueError):
            parse_slos(bad)


def test_percentile_hand_values() -> None:
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([1, 2, 3, 4], 0) == 1
    assert percentile([1, 2, 3, 4], 100) == 4
    assert percentile([10.0], 99) == 10.0
    assert percentile([0, 10], 90) == pytest.approx(9.0)
    with pytest.raises(ValueError):
        percentile([], 50)


floats = st.floats(min_value=0, max_value=1e4, allow_nan=False, allow_infinity=False)


@settings(max_examples=200, deadline=None)
@given(st.lists(floats, min_size=1, max_size=50), st.floats(min_value=0, max_value=100))
def test_percentile_matches_numpy(values: list[float], q: float) -> None:
    assert percentile(values, q) == pytest.approx(
        float(np.percentile(values, q)), rel=1e-9, abs=1e-9
    )


def test_summarize_matches_numpy() -> None:
    values = [0.01, 0.5, 0.25, 0.125, 0.9]
    s = summarize(values)
    assert s["mean"] == pytest.approx(np.mean(values) * 1000)
    assert s["std"] == pytest.approx(np.std(values) * 1000)
    assert s["median"] == pytest.approx(np.median(values) * 1000)
    assert s["p99"] == pytest.approx(np.percentile(values, 99) * 1000)


def vllm_calculate(records: list[RequestTiming], dur_s: float, goodput: dict[str, float]) -> dict:
    """vLLM benchmark_serving.calculate_metrics, transcribed (output_len from the server)."""
    itls, tpots, all_tpots, ttfts, e2els, out_lens = [], [], [], [], [], []
    total_input = completed = good = 0
    for r in records:
        if not r.success:
            out_lens.append(0)
            continue
        output_len = r.output_tokens
        out_lens.append(output_len)
        total_input += r.prompt_tokens
        tpot = 0
        if output_len > 1:
            tpot = (r.latency - r.ttft) / (output_len - 1)
            tpots.append(tpot)
        all_tpots.append(tpot)
        itls += r.itl
        ttfts.append(r.ttft)
        e2els.append(r.latency)
        completed += 1
    valid, slo_values = [], []
    for key, series in (("ttft", ttfts), ("tpot", all_tpots), ("e2el", e2els)):
        if key in goodput:
            valid.append(series)
            slo_values.append(goodput[key] / 1000)
    if goodput:
        for req in zip(*valid, strict=True):
            if all(s >= r for s, r in zip(slo_values, req, strict=True)):
                good += 1
    out = {
        "completed": completed,
        "total_input_tokens": total_input,
        "total_output_tokens": sum(out_lens),
        "request_throughput": completed / dur_s,
        "request_goodput": good / dur_s,
        "output_throughput": sum(out_lens) / dur_s,
    }
    for name, xs in (("ttft", ttfts), ("tpot", tpots), ("itl", itls), ("e2el", e2els)):
        out[f"mean_{name}_ms"] = np.mean(xs or 0) * 1000
        out[f"median_{name}_ms"] = np.median(xs or 0) * 1000
        out[f"std_{name}_ms"] = np.std(xs or 0) * 1000
        out[f"p99_{name}_ms"] = np.percentile(xs or 0, 99) * 1000
    return out


record_strategy = st.builds(
    lambda ttft, extra, out, gaps, prompt, ok: RequestTiming(
        index=0,
        success=ok,
        ttft=ttft,
        latency=ttft + extra,
        output_tokens=out,
        prompt_tokens=prompt,
        itl=gaps,
    ),
    st.floats(min_value=0.001, max_value=5),
    st.floats(min_value=0, max_value=20),
    st.integers(min_value=1, max_value=500),
    st.lists(st.floats(min_value=0, max_value=1), max_size=8),
    st.integers(min_value=1, max_value=4000),
    st.booleans(),
)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(record_strategy, min_size=1, max_size=20),
    st.floats(min_value=0.1, max_value=100),
    st.dictionaries(
        st.sampled_from(["ttft", "tpot", "e2el"]),
        st.floats(min_value=1, max_value=5000),
        max_size=3,
    ),
)
def test_agrees_with_vllm_calculate_metrics(
    records: list[RequestTiming], dur: float, slos: dict[str, float]
) -> None:
    ours = compute_metrics(records, dur, slos)
    ref = vllm_calculate(records, dur, slos)
    for key, expected in ref.items():
        got = ours[key]
        if key == "request_goodput" and not slos:
            assert got is None
            continue
        if got is None:  # we say None where vLLM says 0 for "no samples"
            assert expected == 0
            continue
        assert math.isclose(got, expected, rel_tol=1e-9, abs_tol=1e-9), key


def test_from_times_and_summary_row_use_the_one_definition() -> None:
    from client.metrics import summary_row

    r = RequestTiming.from_times(3, 10.0, [10.5, 10.7, 11.0], 11.2, 4, run_start=9.0)
    assert (r.index, r.start, r.ttft, r.latency) == (3, 1.0, 0.5, pytest.approx(1.2))
    assert r.itl == pytest.approx([0.2, 0.3]) and r.chunks == 3
    assert r.tpot == pytest.approx((1.2 - 0.5) / 3)
    none = RequestTiming.from_times(0, 0.0, [0.1, 0.2], 0.3, None)
    assert none.output_tokens == 2 and none.output_tokens_source == "chunks"
    m = compute_metrics([r, none], 2.0)
    row = summary_row(m)
    assert row["requests"] == 2 and row["output_tokens"] == 6 and row["output_tok_s"] == 3.0
    assert row["ttft_ms_p50"] == pytest.approx(percentile([0.5, 0.1], 50) * 1000)
    assert row["itl_ms_p99"] == pytest.approx(round(percentile([0.2, 0.3, 0.1], 99) * 1000, 1))
