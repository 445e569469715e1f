"""Plots for docs/perf/history/round-01.md from the GPU runs' results (docs/perf/run*-results.jsonl).

python bench/plots.py   # writes docs/perf/engine-variants.png
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PERF = ROOT / "docs/perf"


def rows(run: int) -> list[dict]:
    return [json.loads(x) for x in (PERF / f"run{run}-results.jsonl").read_text().splitlines()]


def pick(data, figure, shape, **match):
    out = {}
    for r in data:
        if r.get("figure") != figure or (r.get("input_len"), r.get("output_len")) != shape:
            continue
        if all(r.get(k) == v for k, v in match.items()):
            out[r["concurrency"]] = r
    return out


def main() -> None:
    final = rows(4)
    # Engine variants (the tuning record), 128/128.
    r1, r4 = rows(1), final
    variants = [
        (
            "HF generate, one at a time (article)",
            {
                c: r
                for r in r1
                if r.get("figure") == "article_hf_generate_serial"
                for c in (1, 64, 256)
            },
        ),
        (
            "dynamic DynamicCache engine (before)",
            pick(r1, "engine", (128, 128), variant="dynamic (before)"),
        ),
        ("static KV, eager", pick(r1, "engine", (128, 128), variant="static eager")),
        ("static KV + CUDA graphs", pick(r1, "engine", (128, 128), variant="static+graphs")),
        ("+ fused qkv / gate-up (final)", pick(r4, "engine", (128, 128), variant="static+graphs")),
    ]
    fig, ax = plt.subplots(figsize=(8, 4.2))
    width = 0.16
    levels = [1, 64, 256]
    for i, (name, data) in enumerate(variants):
        ys = [data[c]["output_tok_s"] if c in data else 0 for c in levels]
        xs = [j + (i - 2) * width for j in range(len(levels))]
        ax.bar(xs, ys, width, label=name)
    ax.set_xticks(range(len(levels)), [f"{c} concurrent" for c in levels])
    ax.set_yscale("log")
    ax.set_ylabel("output tok/s (log)")
    ax.set_title("PyTorch engine variants, 128 in / 128 out, H200")
    ax.axhline(3000, color="gray", ls=":", lw=1)
    ax.axhline(150, color="gray", ls=":", lw=1)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(PERF / "engine-variants.png", dpi=110)


if __name__ == "__main__":
    main()
