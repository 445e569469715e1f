"""The PyTorch engine in the server's process vs in its own process (`engine_process`),
on the real Truss server with the dev model (CPU): the same `python -m client bench` load
against each (default: 16 concurrent streams, 64 tokens in / 128 out). Figures, not
assertions. Each server is started, measured and stopped in turn, so the two never share
the CPUs. Also counts the CPU seconds of the server and of its engine process.

    python bench/engine_process_bench.py [--concurrency 16] [--requests 32]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "mistral-trt-truss" / "packages"), str(REPO)]

from bench.concurrency import settle  # noqa: E402
from mistral_build.dev_model import build_dev_model  # noqa: E402
from mistral_build.local_server import (  # noqa: E402
    LocalServer,
    dev_settings,
    prepare_app_dir,
    render_build_context,
)

TICKS = os.sysconf("SC_CLK_TCK")


def group_cpu_seconds(pgid: int) -> dict[str, float]:
    """CPU seconds (user + system) of the server and of its engine process, from /proc."""
    out = {"server": 0.0, "engine process": 0.0}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if int(fields[2]) != pgid:
            continue
        seconds = (int(fields[11]) + int(fields[12])) / TICKS
        key = "engine process" if b"mistral_gpu_fallback.process.worker" in cmdline else "server"
        out[key] += seconds
    return out


def measure(context: Path, setting: str, args: argparse.Namespace, out: Path) -> dict:
    settings = dev_settings(build_dev_model()) | {"engine_process": setting}
    # Ready before measuring, so the server's load is not counted in the CPU figures.
    server = LocalServer.start(context, settings, log_path=out / f"server-{setting}.log")
    try:
        settle()
        before = group_cpu_seconds(server.process.pid)
        subprocess.run(
            [
                sys.executable,
                "-m",
                "client",
                "bench",
                "--url",
                server.url,
                "--label",
                f"engine_process={setting}",
                "--num-prompts",
                str(args.requests),
                "--input-len",
                str(args.input_len),
                "--output-len",
                str(args.output_len),
                "--concurrency",
                str(args.concurrency),
                "--warmup",
                "2",
                "--wait-ready",
                "300",
                "--no-progress",
                "--out",
                str(out / setting),
            ],
            check=True,
            cwd=REPO,
        )
        after = group_cpu_seconds(server.process.pid)
    finally:
        server.stop(timeout=60)
    result = json.loads((out / setting / "results.json").read_text())
    metrics = result["runs"][0]["metrics"]
    # Includes the warm-up and the predict route's off-the-clock replay pass.
    cpu = {k: after[k] - before[k] for k in after}
    return {"metrics": metrics, "cpu": cpu, "host": result["host"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--input-len", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--order", nargs="+", default=["off", "on"], choices=["off", "on"])
    args = ap.parse_args()
    out = Path(tempfile.mkdtemp(prefix="engine-process-bench-"))
    context = prepare_app_dir(render_build_context(out / "context")).parent
    runs = {setting: measure(context, setting, args, out) for setting in args.order}
    print(
        f"\n{args.requests} requests, {args.concurrency} concurrent, {args.input_len} in / "
        f"{args.output_len} out, dev model on CPU ({os.cpu_count()} CPUs)"
    )
    print(
        f"{'engine_process':<16}{'out tok/s':>10}{'TTFT p50 ms':>13}{'TPOT p50 ms':>13}"
        f"{'server cpu s':>14}{'engine proc cpu s':>19}{'load before':>13}"
    )
    for setting, run in runs.items():
        m, cpu = run["metrics"], run["cpu"]
        print(
            f"{setting:<16}{m['output_throughput']:>10.1f}{m['median_ttft_ms']:>13.1f}"
            f"{m['median_tpot_ms']:>13.1f}{cpu['server']:>14.1f}{cpu['engine process']:>19.1f}"
            f"{run['host']['load_before']:>13.2f}"
        )
    print(f"results and server logs: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
