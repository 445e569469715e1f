"""How many torch threads the CPU dev server should use on a busy 2-core machine.

Serves SmolLM2 (what `make serve` serves) with `torch_threads` 1 and 2 (and the default,
which is the CPUs this process may use), with 0 and 2 CPU-hog processes beside it, and
measures output tokens/s two ways: `python -m client bench` (4 concurrent streams, 32
tokens each) and the server's own `generation_tokens_total` counter over the same window.
Every configuration runs `--repeats` times. A benchmark, not a test: it prints figures.

    python bench/threads_bench.py --repeats 2 --json /tmp/threads.json   # ~6-10 min
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "mistral-trt-truss" / "packages"), str(REPO)]

from mistral_build.local_server import (  # noqa: E402
    LocalServer,
    prepare_app_dir,
    render_build_context,
)
from mistral_build.smollm2 import SMOLLM2_DIR  # noqa: E402
from tests.e2e.util import value  # noqa: E402


def hog(stop: multiprocessing.synchronize.Event) -> None:  # type: ignore[name-defined]
    x = 0
    while not stop.is_set():
        for _ in range(100_000):
            x += 1


def generated(url: str) -> float:
    return value(url, "mtt:generation_tokens_total")


def one(context: Path, threads: int | None, hogs: int) -> dict:
    settings = {"artifact": str(SMOLLM2_DIR), "engine": "pytorch", "device": "cpu"}
    if threads is not None:
        settings["torch_threads"] = str(threads)
    server = LocalServer.start(context, settings)
    stop = multiprocessing.Event()
    workers = [multiprocessing.Process(target=hog, args=(stop,)) for _ in range(hogs)]
    try:
        for w in workers:
            w.start()
        out = Path(tempfile.mkdtemp(prefix="threads-"))
        before, t0 = generated(server.url), time.monotonic()
        subprocess.run(
            [sys.executable, "-m", "client", "bench", "--url", server.url, "--chat",
             "--concurrency", "4", "--num-prompts", "8", "--input-len", "32",
             "--output-len", "32", "--warmup", "1", "--no-progress", "--out", str(out)],
            cwd=REPO, check=True, capture_output=True, timeout=900,
        )  # fmt: skip
        counted = (generated(server.url) - before) / (time.monotonic() - t0)
        metrics = json.loads((out / "results.json").read_text())["runs"][0]["metrics"]
        return {
            "load_average_1m": round(os.getloadavg()[0], 2),
            "torch_threads": threads or "default",
            "hogs": hogs,
            "client_output_tok_s": round(metrics["output_throughput"], 2),
            "server_counter_tok_s": round(counted, 2),
        }
    finally:
        stop.set()
        for w in workers:
            w.join()
        server.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    context = render_build_context(REPO / ".cache" / "threads-bench-context")
    prepare_app_dir(context)
    rows = []
    for _ in range(args.repeats):
        for hogs in (0, 2):
            for threads in (1, 2, None):
                row = one(context, threads, hogs)
                print(json.dumps(row), flush=True)
                rows.append(row)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
