"""bench/cold_start.py on the CPU with the dev model: a fresh interpreter loads the engine
with the server's kernel cache (the row says how many compiled kernels it found there)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_row_names_its_phases_and_the_kernels_it_found(dev_model: Path, tmp_path: Path) -> None:
    kernels = tmp_path / "kernels"
    (kernels / "abc").mkdir(parents=True)
    for name in ("one.json", "two.cubin"):
        (kernels / "abc" / name).write_text("x")
    env = dict(os.environ, TRITON_CACHE_DIR=str(kernels))
    cmd = [sys.executable, str(ROOT / "bench/cold_start.py"), str(dev_model), "--evict", "none"]
    args = ["--max-batch-size", "2", "--max-seq-len", "256", "--out", str(tmp_path / "r.jsonl")]
    out = subprocess.run([*cmd, *args], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    (row,) = [json.loads(line) for line in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert row["figure"] == "cold_start_phases" and row["triton_cache_files"] == 2
    assert list(row["marks_s"]) == [
        "interpreter",
        "import torch",
        "import transformers + engine code",
        "engine loaded",
        "first request done",
    ]
