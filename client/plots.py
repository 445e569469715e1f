"""PNG plots of benchmark runs (matplotlib, Agg backend: no display needed).

One figure for one run or several overlaid (``python -m client bench plot RUN.json
OTHER.json``): output throughput against the load, and the median (solid) and p99
(dashed) of TTFT, TPOT, ITL and end-to-end latency against output throughput. Every y
axis starts at 0, axes carry units, SLOs are drawn as horizontal lines, and the title
says what was run (lengths, prompts, load). The legend names each run by its label.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from client.helpformat import HelpFormatter
from client.metrics import parse_slos

PANELS = (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"), ("e2el", "End-to-end latency"))


def load_results(path: str | Path) -> dict[str, Any]:
    """A results.json (or a directory holding one), checked enough to plot."""
    p = Path(path)
    if p.is_dir():
        p = p / "results.json"
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ValueError(f"cannot read {p}: {exc.strerror}") from exc
    except ValueError as exc:
        raise ValueError(f"{p} is not JSON: {exc}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("runs"), list) or not data["runs"]:
        raise ValueError(f"{p} is not a benchmark result (no 'runs')")
    for run in data["runs"]:
        if not isinstance(run, dict) or not isinstance(run.get("metrics"), dict):
            raise ValueError(f"{p}: a run without 'metrics'")
    data.setdefault("label", str(p.parent.name or p))
    return data


def load_of(run: dict[str, Any]) -> float:
    """The x of the throughput panel: concurrency, request rate, or 1 when sequential."""
    if run.get("mode") == "rate" and run.get("request_rate"):
        return float(run["request_rate"])
    return float(run.get("concurrency") or 1)


def describe(results: dict[str, Any]) -> str:
    """'label: 128 in / 128 out tokens, 50 prompts per point, concurrency 1,4,16'."""
    cfg = results.get("config") or {}
    runs = results["runs"]
    modes = {r.get("mode") for r in runs}
    if modes == {"rate"}:
        load = "request rate " + ",".join(f"{load_of(r):g}" for r in runs) + "/s"
    elif modes == {"sequential"}:
        load = "one at a time"
    else:
        load = "concurrency " + ",".join(f"{load_of(r):g}" for r in runs)
    source = (results.get("prompts") or {}).get("source", "")
    prompts = f"{cfg.get('num_prompts', '?')} prompts per point" + (
        f" ({source})" if source else ""
    )
    return (
        f"{results['label']}: {cfg.get('input_len', '?')} in / {cfg.get('output_len', '?')} "
        f"out tokens, {prompts}, {load}"
    )


def plot_runs(
    runs: Sequence[dict[str, Any]], path: str | Path, slos: dict[str, float] | None = None
) -> Path:
    """Draw one or more results (as written by the benchmark) into one PNG."""
    import matplotlib.pyplot as plt

    fig = figure(runs, slos)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def figure(runs: Sequence[dict[str, Any]], slos: dict[str, float] | None = None) -> Any:
    """The matplotlib Figure of :func:`plot_runs` (the caller closes it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not runs:
        raise ValueError("nothing to plot")
    limits = dict(slos) if slos is not None else {}
    if slos is None:  # the SLOs the runs themselves were measured against
        for results in runs:
            limits.update((results.get("config") or {}).get("slos") or {})
    fig, axes = plt.subplots(1, 1 + len(PANELS), figsize=(4.0 * (1 + len(PANELS)), 4.2))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    rate_runs = any(r.get("mode") == "rate" for res in runs for r in res["runs"])
    for n, results in enumerate(runs):
        color = colors[n % len(colors)]
        points = results["runs"]
        xs = [p["metrics"]["output_throughput"] for p in points]
        axes[0].plot([load_of(p) for p in points], xs, "o-", color=color, label=results["label"])
        for ax, (key, _) in zip(axes[1:], PANELS, strict=True):
            for stat, style in (("median", "o-"), ("p99", "s--")):
                ys = [p["metrics"].get(f"{stat}_{key}_ms") for p in points]
                pts = [(x, y) for x, y in zip(xs, ys, strict=True) if y is not None]
                if pts:
                    ax.plot(*zip(*pts, strict=True), style, color=color)
            for x, p in zip(xs, points, strict=True):
                y = p["metrics"].get(f"median_{key}_ms")
                if y is not None:
                    ax.annotate(
                        f"{load_of(p):g}", (x, y), textcoords="offset points", xytext=(3, 3),
                        fontsize=7, color=color,
                    )  # fmt: skip
    axes[0].set_title("Output throughput")
    axes[0].set_xlabel("request rate (req/s)" if rate_runs else "concurrency (requests in flight)")
    axes[0].set_ylabel("output throughput (tokens/s)")
    for ax, (key, title) in zip(axes[1:], PANELS, strict=True):
        ax.set_title(f"{title} (solid median, dashed p99)", fontsize=9)
        ax.set_xlabel("output throughput (tokens/s)")
        ax.set_ylabel(f"{title} (ms)")
        if key in limits:
            ax.axhline(limits[key], color="red", ls=":", lw=1.2)
            ax.annotate(
                f"SLO {limits[key]:g} ms", (0, limits[key]), xycoords=("axes fraction", "data"),
                xytext=(2, 2), textcoords="offset points", color="red", fontsize=8,
            )  # fmt: skip
    for ax in axes:
        # From 0, with room past the highest point for its marker and label; after the
        # SLO lines, so they stay in view.
        ax.set_xlim(0, ax.get_xlim()[1] * 1.08)
        ax.set_ylim(0, ax.get_ylim()[1] * 1.08)
        ax.grid(True, alpha=0.3)
    axes[0].legend(fontsize=7, loc="best")
    fig.suptitle("\n".join(describe(r) for r in runs), fontsize=9)
    fig.tight_layout()
    return fig


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m client bench plot",
        description="Overlay benchmark runs in one plot (this server against another).",
        formatter_class=HelpFormatter,
    )
    p.add_argument("results", nargs="+", help="results.json files (or their directories)")
    p.add_argument("--out", help="PNG to write (unset: compare.png beside the first run)")
    p.add_argument(
        "--slo",
        nargs="*",
        metavar="NAME:MS",
        help="SLO lines, e.g. --slo ttft:500 tpot:50 (unset: the runs' own SLOs)",
    )
    p.add_argument(
        "--label",
        action="append",
        help="a legend name per run, in order (unset: each run's own label)",
    )
    args = p.parse_args(argv)
    try:
        runs = [load_results(path) for path in args.results]
        slos = parse_slos(args.slo) if args.slo is not None else None
    except ValueError as exc:
        p.error(str(exc))
    if args.label:
        if len(args.label) != len(runs):
            p.error(f"{len(args.label)} --label for {len(runs)} runs")
        for results, label in zip(runs, args.label, strict=True):
            results["label"] = label
    first = Path(args.results[0])
    out = (
        Path(args.out) if args.out else (first if first.is_dir() else first.parent) / "compare.png"
    )
    print(f"wrote {plot_runs(runs, out, slos)}")
    return 0
