"""A peer side by side: `transformers serve --continuous-batching` (bench/peer_serve.py) on
the same artifact, started from the same page cache state and measured by the same client
with text prompts (the only prompts it takes)."""

from __future__ import annotations

import shlex
import subprocess
import sys
import time
from pathlib import Path

from bench.gpu import ROOT
from bench.gpu.common import drop_page_cache, emit, time_left
from bench.gpu.server import stop, text_level, text_sweep, wait_until_ready


def peer_bench(args) -> None:
    artifact = str(Path(args.dir).resolve())
    command = [
        sys.executable,
        str(ROOT / "bench/peer_serve.py"),
        artifact,
        "--continuous-batching",
        "--host",
        "127.0.0.1",
        "--port",
        str(args.port),
        *shlex.split(args.peer_flags),
    ]
    cold = drop_page_cache()
    log = open(args.log, "w") if args.log else subprocess.DEVNULL  # noqa: SIM115
    t0 = time.perf_counter()
    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{args.port}"
    try:
        ready = wait_until_ready(proc, url + "/health", t0, args.log)
        emit(
            figure="peer_start_to_ready",
            seconds=round(ready, 1),
            page_cache_dropped=cold,
            command=" ".join(command[2:]),
        )
        t = time.perf_counter()
        for c in (1, 16, 64, 256):  # warm-up: cache allocation, graph capture
            if time_left() < 60:
                break
            try:
                text_level(url, artifact, c, 128, 4, c)
            except Exception as exc:  # noqa: BLE001
                emit(figure="failed", variant="peer warm-up", concurrency=c, error=repr(exc)[:300])
        emit(figure="peer_warmup", seconds=round(time.perf_counter() - t, 1))
        text_sweep(url, artifact, "transformers serve", args.text_levels or [1, 64, 256])
    finally:
        stop(proc)
