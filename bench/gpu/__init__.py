"""The GPU benchmark of the PyTorch engine and the service, by concern; `bench/gpu_bench.py`
is its command line and `bench/run_gpu.sh` runs it on a GPU machine, part by part.

  common       where rows go (`emit`), the deadline, the page-cache drop, the sweep levels
  artifact     the Mistral-7B-shaped random-weight artifact and its hash check
  inprocess    the engine in-process: cold load, sweeps, the captured step's GPU time
  correctness  the static engine's greedy tokens against an fp32 reference
  server       the real Truss server: start to ready, sweeps, GC pauses, structured output
  clients      the second load clients (AIPerf, guidellm) at the same levels
  peer         `transformers serve --continuous-batching` with the same client
  cli          the subcommands and their options
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ROOT / "mistral-trt-truss/packages"
for _path in (str(ROOT), str(PACKAGES)):
    if _path not in sys.path:
        sys.path.insert(0, _path)
