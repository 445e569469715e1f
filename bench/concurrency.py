"""`make bench`: 16 concurrent streaming requests against 16 sequential ones, on the real
Truss server with the dev model (CPU). Prints both runs' figures side by side.

It starts the server the way `make serve` does, then runs `python -m client bench` twice
with the same prompts: `--concurrency 16` and `--one-at-a-time` (the article's way of
serving). Figures, not assertions: speed targets live in benchmarks, not tests.

Results stay under bench/results/<time>/ (ignored by git): each run's results.json (with the
host's CPUs, load average before and after, versions and commit) and plot, and
compare.png with both runs overlaid. Before each run it waits (up to 90 s) for the load
average to fall below half the CPUs; a run on a busy machine is flagged with a WARNING.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "mistral-trt-truss" / "packages"), str(REPO)]

from client.bench import default_out_dir  # noqa: E402
from client.hostinfo import cpu_count, load_average  # noqa: E402
from client.plots import plot_runs  # noqa: E402
from mistral_build.dev_model import build_dev_model  # noqa: E402
from mistral_build.local_server import (  # noqa: E402
    LocalServer,
    dev_settings,
    prepare_app_dir,
    render_build_context,
)

REQUESTS, INPUT_LEN, OUTPUT_LEN = 16, 64, 128
SETTLE_S = 90  # the longest wait for the load average to fall before a run


def settle() -> None:
    """Wait (bounded) until the 1-minute load average is below half the CPUs: the load of
    the server's start or of the previous run would otherwise count against this one."""
    limit = 0.5 * cpu_count()
    deadline = time.monotonic() + SETTLE_S
    load = load_average()
    if load is not None and load > limit:
        print(f"waiting for the load average ({load:.2f}) to fall below {limit:g} ...")
    while load is not None and load > limit and time.monotonic() < deadline:
        time.sleep(5)
        load = load_average()


def bench(url: str, out: Path, label: str, server_pid: int, mode: list[str]) -> dict:
    settle()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "client",
            "bench",
            "--url",
            url,
            "--label",
            label,
            "--num-prompts",
            str(REQUESTS),
            "--input-len",
            str(INPUT_LEN),
            "--output-len",
            str(OUTPUT_LEN),
            "--warmup",
            "2",
            "--wait-ready",
            "300",
            "--server-pid",
            str(server_pid),
            "--no-progress",
            "--out",
            str(out),
            *mode,
        ],
        check=True,
        cwd=REPO,
    )
    return json.loads((out / "results.json").read_text())


def main() -> int:
    out = REPO / default_out_dir()
    with tempfile.TemporaryDirectory() as tmp:
        context = prepare_app_dir(render_build_context(Path(tmp) / "context")).parent
        server = LocalServer.start(context, dev_settings(build_dev_model()), wait=False)
        try:
            url = server.url
            runs = {
                "16 concurrent": bench(
                    url,
                    out / "concurrent",
                    "16 concurrent",
                    server.process.pid,
                    ["--concurrency", "16"],
                ),
                "16 sequential": bench(
                    url,
                    out / "sequential",
                    "16 sequential",
                    server.process.pid,
                    ["--one-at-a-time"],
                ),
            }
        finally:
            server.stop(timeout=60)
    compare = plot_runs(list(runs.values()), out / "compare.png")
    print(f"\n{REQUESTS} requests, {INPUT_LEN} tokens in / {OUTPUT_LEN} out, dev model on CPU")
    print(
        f"{'run':<16}{'wall s':>9}{'out tok/s':>11}{'req/s':>8}{'TTFT p50 ms':>13}"
        f"{'TPOT p50 ms':>13}{'load before/after':>19}"
    )
    warnings = []
    for name, result in runs.items():
        m = result["runs"][0]["metrics"]
        host = result["host"]
        print(
            f"{name:<16}{m['duration_s']:>9.2f}{m['output_throughput']:>11.1f}"
            f"{m['request_throughput']:>8.2f}{m['median_ttft_ms']:>13.1f}"
            f"{m['median_tpot_ms']:>13.1f}{host['load_before']:>10.2f}/{host['load_after']:<8.2f}"
        )
        if host.get("warning"):
            warnings.append(f"WARNING ({name}): {host['warning']}")
    for line in warnings:
        print(line)
    print(f"results: {out}/{{concurrent,sequential}}/results.json; plot: {compare}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
