"""PNG plots of a benchmark sweep (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def plot_sweep(results: dict[str, Any], out_dir: Path) -> list[Path]:
    """Latency (median and p99 of TTFT, TPOT, ITL, E2E) against output throughput, one
    point per sweep point, labelled with its concurrency or request rate."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = results.get("runs") or []
    if not runs:
        return []
    panels = [("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"), ("e2el", "E2E latency")]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.8))
    xs = [r["metrics"]["output_throughput"] for r in runs]
    labels = [r["label"].split("=")[-1] if "=" in r["label"] else r["label"] for r in runs]
    for ax, (key, title) in zip(axes, panels, strict=True):
        for stat, style in (("median", "o-"), ("p99", "s--")):
            ys = [r["metrics"].get(f"{stat}_{key}_ms") for r in runs]
            pts = [(x, y) for x, y in zip(xs, ys, strict=True) if y is not None]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=stat)
        for x, y, text in zip(
            xs, [r["metrics"].get(f"median_{key}_ms") for r in runs], labels, strict=True
        ):
            if y is not None:
                ax.annotate(text, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
        ax.set_title(title)
        ax.set_xlabel("output tokens/s")
        ax.set_ylabel("ms")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    cfg = results.get("config", {})
    fig.suptitle(
        f"{cfg.get('backend', '?')} @ {cfg.get('url', '?')}: latency vs throughput "
        f"(points: {runs[0].get('mode', '')})",
        fontsize=10,
    )
    fig.tight_layout()
    path = out_dir / "latency_vs_throughput.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]
