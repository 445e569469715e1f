"""`make bench`: 16 concurrent streaming requests against 16 sequential ones, on the real
Truss server with the dev model (CPU). Prints both runs' figures side by side.

It starts the server the way `make serve` does, then runs `python -m client bench` twice
with the same prompts: `--concurrency 16` and `--one-at-a-time` (the article's way of
serving). Figures, not assertions: speed targets live in benchmarks, not tests.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "mistral-trt-truss" / "packages"))

from mistral_build.dev_model import build_dev_model  # noqa: E402
from mistral_build.local_server import (  # noqa: E402
    dev_settings,
    launch_server,
    prepare_app_dir,
    render_build_context,
)

REQUESTS, INPUT_LEN, OUTPUT_LEN = 16, 64, 128


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bench(url: str, out: Path, mode: list[str]) -> dict:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "client",
            "bench",
            "--url",
            url,
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
    with tempfile.TemporaryDirectory() as tmp:
        context = prepare_app_dir(render_build_context(Path(tmp) / "context")).parent
        port = free_port()
        server = launch_server(context, port, dev_settings(build_dev_model()), subprocess.DEVNULL)
        try:
            url = f"http://127.0.0.1:{port}"
            runs = {
                "16 concurrent": bench(url, Path(tmp) / "c", ["--concurrency", "16"]),
                "16 sequential": bench(url, Path(tmp) / "s", ["--one-at-a-time"]),
            }
        finally:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(60)
    print(f"\n{REQUESTS} requests, {INPUT_LEN} tokens in / {OUTPUT_LEN} out, dev model on CPU")
    print(
        f"{'run':<16}{'wall s':>9}{'out tok/s':>11}{'req/s':>8}{'TTFT p50 ms':>13}"
        f"{'TPOT p50 ms':>13}"
    )
    for name, result in runs.items():
        m = result["runs"][0]["metrics"]
        print(
            f"{name:<16}{m['duration_s']:>9.2f}{m['output_throughput']:>11.1f}"
            f"{m['request_throughput']:>8.2f}{m['median_ttft_ms']:>13.1f}"
            f"{m['median_tpot_ms']:>13.1f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
