"""Where the real server's time goes at high concurrency: one device call.

The real Truss server (default settings: engine in the server's process) on an artifact, the
same warm-up as `gpu_bench.py service` (bench/gpu/server.py), then at one concurrency (128 in / 128 out, token-id
prompts, `python -m client bench`'s raw client in 4 processes):

1. a plain run (no profiler), with the server's /metrics read before and after: the mean queue
   time (arrival -> engine slot) and mean server-side TTFT of that run;
2. the same run with `py-spy record --threads --idle --nonblocking` attached (speedscope
   format: samples stay in time order per thread, so the ramp can be cut out afterwards);
3. the same run with `py-spy record --gil` (only the thread holding the GIL is sampled);
4. a longer run (more requests per worker: one ramp over more tokens), no profiler;
then the engine alone in-process (`gpu_bench.py engine`'s drive) for runs 1 and 4's loads.

Everything goes under --out: results.jsonl (rows + timings), the py-spy files, the server log.
`bench/profile_summary.py` turns the py-spy files into the text summary in docs/perf/.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
# The same helpers and rows as the GPU benchmark (bench/gpu/).
from bench.gpu import common, inprocess  # noqa: E402
from bench.gpu.server import service_level, start_server, warm_up  # noqa: E402

# BENCH_PACKAGES: another copy of the serving packages (e.g. the last commit's) for both the
# server and the in-process engine, so that uncommitted work in the tree is not measured.
PACKAGES = os.environ.get("BENCH_PACKAGES") or str(
    Path(__file__).resolve().parents[1] / "mistral-trt-truss/packages"
)
sys.path.insert(0, PACKAGES)

START = time.time()


def scrape(url: str) -> dict[str, float]:
    """The server's queue-time and TTFT histogram sums and counts (Prometheus text)."""
    import httpx

    text = httpx.get(url + "/metrics", timeout=5, follow_redirects=True).text
    found: dict[str, float] = {}
    for line in text.splitlines():
        m = re.match(
            r"^([\w:]*(?:queue_time|time_to_first_token)\w*_(?:sum|count))(\{[^}]*\})? (\S+)$", line
        )
        if m:
            key = m.group(1)
            found[key] = found.get(key, 0.0) + float(m.group(3))
    return found


def phase_means(before: dict, after: dict) -> dict:
    """Mean seconds per request of each histogram over one run (after - before)."""
    out = {}
    for key in after:
        if key.endswith("_sum"):
            base = key[: -len("_sum")]
            n = after.get(base + "_count", 0) - before.get(base + "_count", 0)
            s = after[key] - before.get(key, 0)
            if n:
                out[base.split(":")[-1] + "_mean"] = round(s / n, 4)
                out[base.split(":")[-1] + "_n"] = int(n)
    return out


def level(url: str, args, per_worker: int, label: str) -> None:
    before = scrape(url)
    t0 = time.time()
    row = service_level(url, args.concurrency, 128, 128, per_worker, "raw", 4)
    common.emit(
        figure="service",
        label=label,
        per_worker=per_worker,
        t_start=round(t0 - START, 3),
        wall=round(time.time() - t0, 3),
        **row,
        **phase_means(before, scrape(url)),
    )


def profiled_level(url: str, args, pid: int, name: str, extra: list[str]) -> None:
    out = Path(args.out) / name
    cmd = [args.pyspy, "record", "-p", str(pid), "-r", str(args.rate), "--nonblocking"]
    cmd += [*extra, "-o", str(out)]
    log = open(Path(args.out) / "pyspy.log", "a")  # noqa: SIM115
    t_spy = time.time()
    spy = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    time.sleep(1.0)  # py-spy attaches and starts sampling (its first sample is time 0)
    try:
        level(url, args, 2, name)
    finally:
        t_end = time.time()
        time.sleep(0.3)
        spy.send_signal(signal.SIGINT)  # py-spy writes its file on Ctrl-C
        try:
            spy.wait(timeout=60)
        except subprocess.TimeoutExpired:
            spy.kill()
        common.emit(
            figure="pyspy",
            file=name,
            cmd=" ".join(cmd),
            rc=spy.returncode,
            t_spy=round(t_spy - START, 3),
            t_stop=round(t_end + 0.3 - START, 3),
        )


def server(args) -> None:
    settings = {
        "artifact": str(Path(args.artifact).resolve()),
        "engine": "pytorch",
        "verify_hashes": "false",
        "max_batch_size": str(args.max_batch_size),
        "max_seq_len": "2048",
        "max_inflight": "512",
        "max_waiting": "1024",
    }
    log_path = Path(args.out) / "server.log"
    app = Path(args.app).resolve()
    srv, ready = start_server(app, settings, str(log_path), PACKAGES)
    url = srv.url
    try:
        common.emit(figure="server_start_to_ready", seconds=round(ready, 1), pid=srv.process.pid)
        t = time.time()
        warm_up(url, args.max_batch_size)
        common.emit(figure="warmup", seconds=round(time.time() - t, 1))
        level(url, args, 2, "plain")
        profiled_level(
            url,
            args,
            srv.process.pid,
            "spy-threads.json",
            ["--threads", "--idle", "--format", "speedscope"],
        )
        profiled_level(
            url, args, srv.process.pid, "spy-gil.json", ["--gil", "--format", "speedscope"]
        )
        if time.time() < args.deadline - 60:
            level(url, args, args.long_per_worker, "long")
    finally:
        srv.stop(timeout=30)


def engine_alone(args) -> None:
    """The in-process engine for the same two loads (gpu_bench.py engine's drive)."""
    from client.metrics import compute_metrics
    from mistral_serving.engines.factory import start_torch_engine

    ns = argparse.Namespace(max_batch_size=args.max_batch_size, max_seq_len=2048, set=None)
    artifact = Path(args.artifact)
    engine = start_torch_engine(artifact, inprocess.engine_settings(artifact, ns), 2)
    for c in (1, 2, 4, 8, 16, 32, 64, 128, 256):
        if c <= args.max_batch_size:
            asyncio.run(inprocess.drive(engine, c, 128, 4, 1))
    for per_worker in (2, args.long_per_worker):
        if time.time() > args.deadline - 30:
            common.emit(figure="skipped", what="engine", per_worker=per_worker)
            continue
        records, wall = asyncio.run(inprocess.drive(engine, args.concurrency, 128, 128, per_worker))
        row = common.level_row("engine", args.concurrency, 128, 128, compute_metrics(records, wall))
        common.emit(figure="engine", per_worker=per_worker, **row)
    inprocess.release(engine)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("artifact")
    ap.add_argument("app")
    ap.add_argument("--out", required=True)
    ap.add_argument("--concurrency", type=int, default=256)
    ap.add_argument("--max-batch-size", type=int, default=256)
    ap.add_argument("--long-per-worker", type=int, default=6)
    ap.add_argument("--pyspy", default="py-spy")
    ap.add_argument("--rate", type=int, default=200)
    ap.add_argument("--budget", type=float, default=400, help="seconds for both parts")
    ap.add_argument("--skip-engine", action="store_true")
    args = ap.parse_args()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    common.OUT = Path(args.out) / "results.jsonl"
    args.deadline = START + args.budget
    import mistral_serving

    common.emit(figure="packages", path=str(Path(mistral_serving.__file__).parent))
    server(args)
    if not args.skip_engine and time.time() < args.deadline - 60:
        engine_alone(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
