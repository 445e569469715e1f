"""Benchmark plots: SLO lines, run details in the title, y from 0, units, overlays, and a
clear error (never a traceback) for files that are not results."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib.pyplot as plt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from client.bench import main as bench_main
from client.plots import describe, figure, load_results, plot_runs


def results(label: str, scale: float, mode: str = "concurrency") -> dict:
    runs = []
    for c in (1, 4, 16):
        m = {"output_throughput": 100.0 * c * scale}
        for key in ("ttft", "tpot", "itl", "e2el"):
            m[f"median_{key}_ms"] = 10.0 * c * scale
            m[f"p99_{key}_ms"] = 20.0 * c * scale
        runs.append(
            {"label": f"concurrency={c}", "mode": mode, "concurrency": c,
             "request_rate": float(c) if mode == "rate" else None, "metrics": m}
        )  # fmt: skip
    return {
        "label": label,
        "config": {"input_len": 128, "output_len": 64, "num_prompts": 50, "slos": {}},
        "prompts": {"source": "synthetic"},
        "runs": runs,
    }


def test_two_runs_overlaid_with_slos_units_and_zero_based_axes() -> None:
    ours, theirs = results("predict @ http://a:8080", 1.0), results("openai m @ http://b", 2.0)
    fig = figure([ours, theirs], slos={"ttft": 500.0, "tpot": 50.0})
    try:
        axes = fig.axes
        assert [t.get_text() for t in axes[0].get_legend().get_texts()] == [
            ours["label"],
            theirs["label"],
        ]
        for ax in axes:
            assert ax.get_ylim()[0] == 0 and ax.get_xlim()[0] == 0
            assert "(" in ax.get_ylabel() and "(" in ax.get_xlabel()  # units
        assert axes[0].get_ylabel() == "output throughput (tokens/s)"
        assert axes[1].get_ylabel() == "TTFT (ms)"

        def hlines(ax) -> set[float]:
            return {ln.get_ydata()[0] for ln in ax.get_lines() if ln.get_linestyle() == ":"}

        assert hlines(axes[1]) == {500.0} and hlines(axes[2]) == {50.0}
        assert hlines(axes[3]) == set()  # no ITL SLO
        assert axes[1].get_ylim()[1] > 500  # the SLO line is in view
        title = fig._suptitle.get_text()
        assert "128 in / 64 out tokens" in title and "50 prompts per point" in title
        assert "concurrency 1,4,16" in title and theirs["label"] in title
    finally:
        plt.close(fig)


def test_runs_own_slos_are_drawn_by_default_and_rate_runs_label_the_x_axis() -> None:
    run = results("r", 1.0, mode="rate")
    run["config"]["slos"] = {"e2el": 90.0}
    fig = figure([run])
    try:
        lines = [ln for ln in fig.axes[4].get_lines() if ln.get_linestyle() == ":"]
        assert [ln.get_ydata()[0] for ln in lines] == [90.0]
        assert fig.axes[0].get_xlabel() == "request rate (req/s)"
        assert "request rate 1,4,16/s" in describe(run)
    finally:
        plt.close(fig)


def test_bench_plot_command_overlays_files(tmp_path: Path, capsys) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    for d, res in ((a, results("ours", 1.0)), (b, results("theirs", 1.5))):
        d.mkdir()
        (d / "results.json").write_text(json.dumps(res))
    code = bench_main(["plot", str(a / "results.json"), str(b), "--slo", "ttft:100"])
    assert code == 0
    out = a / "compare.png"
    assert out.read_bytes()[:4] == b"\x89PNG"
    assert str(out) in capsys.readouterr().out
    code = bench_main(["plot", str(a), str(b), "--label", "x", "--label", "y", "--out",
                       str(tmp_path / "c.png")])  # fmt: skip
    assert code == 0 and (tmp_path / "c.png").exists()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "cannot read"),
        ("{oops", "is not JSON"),
        ('{"runs": []}', "not a benchmark result"),
        ('{"runs": [{"label": "x"}]}', "without 'metrics'"),
    ],
)
def test_bench_plot_rejects_bad_files_clearly(tmp_path: Path, capsys, content, message) -> None:
    path = tmp_path / "r.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(SystemExit) as info:
        bench_main(["plot", str(path)])
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_bench_plot_label_count_must_match(tmp_path: Path, capsys) -> None:
    (tmp_path / "results.json").write_text(json.dumps(results("a", 1.0)))
    with pytest.raises(SystemExit):
        bench_main(["plot", str(tmp_path), "--label", "x", "--label", "y"])
    assert "2 --label for 1 runs" in capsys.readouterr().err


@settings(max_examples=100, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=5),
        lambda inner: (
            st.lists(inner, max_size=3)
            | st.dictionaries(st.sampled_from(["runs", "metrics", "label", "x"]), inner, max_size=3)
        ),
        max_leaves=12,
    )
)
def test_load_results_accepts_results_or_says_why(tmp_path_factory, data) -> None:
    path = tmp_path_factory.mktemp("r") / "results.json"
    path.write_text(json.dumps(data))
    try:
        loaded = load_results(path)
    except ValueError as exc:
        assert str(path) in str(exc)
        return
    assert loaded["runs"] and all(isinstance(r["metrics"], dict) for r in loaded["runs"])


def test_plot_runs_writes_png(tmp_path: Path) -> None:
    out = plot_runs([results("a", 1.0)], tmp_path / "sub" / "p.png")
    assert out.read_bytes()[:4] == b"\x89PNG"
