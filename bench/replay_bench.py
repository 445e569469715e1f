"""The server's own cost per streamed token, on the CPU.

Starts the real Truss server with the replay engine (`engine: replay`: pre-made tokens, no
model), drives it with `python -m client bench`'s raw transport (streamed OpenAI
completions, token-id prompts) and reads the server process's CPU time, so the figure is
tokens per second per core of the server alone (the load client runs in this process, on
other cores).

    python bench/replay_bench.py [--concurrency 256] [--output-len 256] \
        [--profile docs/replay-profile.txt]   # py-spy: self time per function
        [--set max_inflight=512] [--context .benchcarry/ctx]  # a setting; no truss package
        [--context DIR --packages OTHER/mistral-trt-truss/packages]  # another version's server
        [--aiperf]   # then AIPerf (AIPERF_PY) at the same level: a second client's figures
        [--aiperf-token-ids]  # AIPerf sends our client's token-id bodies, not its own text
        [--set engine_process=on]  # the replay engine in its own process: the IPC's cost
        [--set engine_process=on --set frontend_processes=4]  # several front-end processes

Prints one JSON line (with engine_process=on, `engine_process_cpu_s` is that process's CPU;
`server_cpu_s` is the server's processes' together: the launcher and its front-ends).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "mistral-trt-truss/packages"), str(ROOT)]

from client.bench import closed_loop_level  # noqa: E402
from client.hostinfo import process_cpu_seconds  # noqa: E402
from client.metrics import summary_row  # noqa: E402


def cpu_seconds(pid: int) -> float:
    seconds = process_cpu_seconds(pid)
    if seconds is None:
        raise SystemExit(f"cannot read the CPU time of process {pid} (Linux /proc only)")
    return seconds


def load_level(
    url: str,
    concurrency: int,
    in_len: int,
    out_len: int,
    per_worker: int,
    procs: int,
    transport: str = "raw",
) -> dict:
    """One closed-loop level through the benchmark client; its compact figures and host."""
    results = closed_loop_level(url, concurrency, in_len, out_len, per_worker, transport, procs)
    row = {"concurrency": concurrency, "input_len": in_len, "output_len": out_len}
    row.update(summary_row(results["runs"][0]["metrics"]), host=results["host"])
    return row


def process_tree(pid: int) -> tuple[list[int], list[int]]:
    """The server's processes under `pid` (it, and with `frontend_processes` above 1 its
    front-end processes), and the engine process(es) among them (Linux /proc)."""
    parents: dict[int, int] = {}
    commands: dict[int, bytes] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            commands[int(entry.name)] = (entry / "cmdline").read_bytes()
        except OSError:
            continue  # gone meanwhile
        parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    tree, grew = {pid}, True
    while grew:
        more = {p for p, parent in parents.items() if parent in tree} - tree
        tree |= more
        grew = bool(more)
    engines = sorted(p for p in tree if b"engines.process.worker" in commands.get(p, b""))
    return sorted(tree - set(engines)), engines


def tree_cpu_seconds(pids: list[int]) -> float:
    return sum(cpu_seconds(p) for p in pids)


def top_functions(raw: Path, n: int = 25) -> list[str]:
    """py-spy's raw (collapsed) stacks -> the functions with the most self samples."""
    own: collections.Counter = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        total += int(count)
        own[stack.split(";")[-1]] += int(count)
    return [f"{100 * c / total:5.1f}%  {frame}" for frame, c in own.most_common(n)]


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", type=int, default=256)
    ap.add_argument("--input-len", type=int, default=16)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--requests-per-worker", type=int, default=2)
    ap.add_argument("--port", type=int, default=8093)
    ap.add_argument(
        "--step-ms",
        type=float,
        default=10.0,
        help="replay engine step (10 ms x 256 streams = 25,600 tok/s offered)",
    )
    ap.add_argument(
        "--client-procs",
        type=int,
        default=1,
        help="load client processes (this machine has 2 cores: keep 1)",
    )
    ap.add_argument("--profile", help="write py-spy's top self-time functions here")
    ap.add_argument(
        "--context",
        type=Path,
        help="a prepared Truss build context (local_server.prepare_app_dir) to run, for a "
        "machine without the truss package; the repo's serving code is imported",
    )
    ap.add_argument(
        "--packages",
        type=Path,
        help="with --context: the serving packages the server imports (default: this repo's; "
        "another checkout's to compare two versions under one benchmark)",
    )
    ap.add_argument("--set", action="append", default=[], help="more settings: KEY=VALUE")
    ap.add_argument(
        "--aiperf",
        action="store_true",
        help="then AIPerf at the same level (bench/gpu/clients.py's aiperf_level, AIPERF_PY)",
    )
    ap.add_argument(
        "--aiperf-token-ids",
        action="store_true",
        help="AIPerf sends our client's token-id bodies, not its synthetic text",
    )
    args = ap.parse_args()
    if args.packages is not None and args.context is None:
        ap.error("--packages needs --context (a build context without its own packages)")
    return args


def server_context(args: argparse.Namespace) -> Path:
    """The Truss build context to serve: --context (its server imports --packages, or
    this repo's), else one rendered from this repo."""
    from mistral_build.local_server import prepare_app_dir, render_build_context
    from mistral_build.paths import CACHE_DIR

    if args.context is not None:
        packages = str((args.packages or ROOT / "mistral-trt-truss/packages").resolve())
        os.environ["PYTHONPATH"] = os.pathsep.join(
            p for p in (packages, os.environ.get("PYTHONPATH", "")) if p
        )
        return args.context.resolve()
    context = render_build_context(CACHE_DIR / "replay-bench-context")
    prepare_app_dir(context)
    return context


def start_profiler(pid: int, raw: Path) -> subprocess.Popen:
    """py-spy sampling process `pid` into `raw` (collapsed stacks) until SIGINT."""
    spy = subprocess.Popen(
        ["py-spy", "record", "-p", str(pid), "-r", "200", "--format", "raw", "-o", str(raw),
         "--nonblocking"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    time.sleep(1)
    return spy


def measured_level(
    url: str, args: argparse.Namespace, servers: list[int], engines: list[int]
) -> dict:
    """The measured level, with the CPU the server's processes and the engine process
    spent on it."""
    child0 = tree_cpu_seconds(engines)
    cpu0, t0 = tree_cpu_seconds(servers), time.perf_counter()
    row = load_level(
        url,
        args.concurrency,
        args.input_len,
        args.output_len,
        args.requests_per_worker,
        args.client_procs,
    )
    cpu, wall = tree_cpu_seconds(servers) - cpu0, time.perf_counter() - t0
    child_cpu = round(tree_cpu_seconds(engines) - child0, 2) if engines else None
    row.update(
        kind="service+replay",
        set=args.set,
        step_ms=args.step_ms,
        server_cpu_s=round(cpu, 2),
        server_cores_busy=round(cpu / wall, 2),
        tok_per_s_per_core=round(row["output_tokens"] / cpu, 1),
        engine_process_cpu_s=child_cpu,
        server_processes=len(servers),
    )
    return row


def aiperf_server_cpu(
    url: str, settings: dict[str, str], args: argparse.Namespace, servers: list[int]
) -> dict:
    """AIPerf at the same level, and the server's CPU over its whole run."""
    from bench.gpu.clients import aiperf_level
    from mistral_build.paths import DEV_MODEL_DIR
    from mistral_serving.settings import Settings

    model = Settings.load(settings).served_model_name
    cpu0, t0 = tree_cpu_seconds(servers), time.perf_counter()
    aiperf = aiperf_level(url, model, str(DEV_MODEL_DIR), args.concurrency,
                          args.input_len, args.output_len, step_ms=args.step_ms,
                          token_ids=args.aiperf_token_ids)  # fmt: skip
    # The server's CPU over AIPerf's whole run (its warm-up requests included).
    cpu, wall = tree_cpu_seconds(servers) - cpu0, time.perf_counter() - t0
    return {"figure": "aiperf_server", "server_cpu_s": round(cpu, 2),
            "server_cores_busy": round(cpu / wall, 2), "requests": 3 * args.concurrency,
            "ok": aiperf["figure"] == "aiperf"}  # fmt: skip


def main() -> int:
    from mistral_build.dev_model import build_dev_model
    from mistral_build.local_server import launch_server, wait_ready
    from mistral_build.paths import CACHE_DIR, DEV_MODEL_DIR

    args = parse_args()
    build_dev_model()
    context = server_context(args)
    settings = {
        "artifact": str(DEV_MODEL_DIR),
        "engine": "replay",
        "device": "cpu",
        "max_inflight": "1024",
        "max_waiting": "1024",
        "max_batch_size": str(args.concurrency),
        "replay_step_ms": str(args.step_ms),
    } | dict(item.partition("=")[::2] for item in args.set)
    log = open(CACHE_DIR / "replay-bench-server.log", "w")  # noqa: SIM115
    proc = launch_server(context, args.port, settings, log)
    url = f"http://127.0.0.1:{args.port}"
    spy = None
    try:
        wait_ready(url, proc, 60, Path(log.name))
        load_level(url, 8, args.input_len, 8, 1, 1)  # warm-up
        if args.profile:
            raw = Path(args.profile).with_suffix(".raw")
            spy = start_profiler(proc.pid, raw)
        # engine_process=on: the replay engine's own process; frontend_processes: the
        # front-end processes under the launcher, whose CPU counts as the server's.
        servers, engines = process_tree(proc.pid)
        print(json.dumps(measured_level(url, args, servers, engines)), flush=True)
        if spy is not None:
            spy.send_signal(2)  # SIGINT: py-spy writes its output and exits
            spy.wait(timeout=30)
            lines = top_functions(raw)
            Path(args.profile).write_text("\n".join(lines) + "\n")
            print("\n".join(lines[:15]))
        if args.aiperf:
            print(json.dumps(aiperf_server_cpu(url, settings, args, servers)), flush=True)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
