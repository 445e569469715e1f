"""The sampler's cost per decode step (`engines/sampling.py`), on the device it runs on.

For n rows of vocab-sized float32 logits, the median time of one `sample_next_tokens` call
(host read included) with every row greedy, every row sampled unseeded (one batched draw),
and every row sampled with its own seed (row by row, each request's own generator), at
temperature 1 with and without top-p 0.9; the batched draw's tokens are checked to lie in
each row's own kept set.

    python bench/sampler_bench.py [--device cuda] [--rows 16 256] [--vocab 32000]

Prints one JSON line per (rows, case).
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "mistral-trt-truss/packages"))

from mistral_serving.engines.base import SamplingOptions  # noqa: E402
from mistral_serving.engines.sampling import _truncate, sample_next_tokens  # noqa: E402


@dataclass
class Row:
    prompt: list[int]
    sampling: SamplingOptions
    generator: torch.Generator
    generated: list[int] = field(default_factory=list)
    stop_ids: frozenset[int] = frozenset()
    mask_fn: None = None


def median_ms(fn, device: torch.device, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return round(statistics.median(times), 3)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--rows", type=int, nargs="+", default=[16, 256])
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--repeat", type=int, default=30)
    args = ap.parse_args()
    device = torch.device(args.device)
    for n in args.rows:
        logits = torch.randn(n, args.vocab, device=device) * 3
        cases = {
            "greedy": SamplingOptions(max_new_tokens=8, temperature=0.0),
            "sampled": SamplingOptions(max_new_tokens=8, temperature=1.0),
            "sampled_top_p": SamplingOptions(max_new_tokens=8, temperature=1.0, top_p=0.9),
            "seeded_top_p": SamplingOptions(max_new_tokens=8, temperature=1.0, top_p=0.9, seed=1),
        }
        for name, opts in cases.items():
            rows = [Row([0], opts, torch.Generator(device=device).manual_seed(i)) for i in range(n)]
            ms = median_ms(functools.partial(sample_next_tokens, logits, rows), device, args.repeat)
            out = sample_next_tokens(logits, rows)
            kept = _truncate(logits.float(), [opts] * n) != float("-inf")
            inside = all(kept[r, o.token].item() for r, o in enumerate(out))  # type: ignore[union-attr]
            print(json.dumps({"figure": "sampler", "device": str(device), "rows": n,
                              "case": name, "ms_per_step_p50": ms, "tokens_in_kept_sets": inside}),
                  flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
