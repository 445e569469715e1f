"""The real Truss server under load: the launcher the image runs, on a prepared app folder,
started (from a cold page cache with --drop-page-cache) and timed to ready, then the load of
`python -m client bench` (client/bench.py) at each level, the second clients at the same
levels, and the garbage collector's pauses over the run."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

from bench.gpu import PACKAGES, common
from bench.gpu.clients import aiperf_level, guidellm_level
from bench.gpu.common import drop_page_cache, emit, level_row, levels_for, time_left
from bench.gpu.structured import PROFILE_ENV, guided_rounds, suite_rounds
from client.bench import BenchConfig, closed_loop_level, run_bench

# (input, output) tokens, requests per stream, and the seconds a level needs to be started.
SHAPE = (128, 128, 2, 20)
LONG_SHAPE = (common.LONG_INPUT, 256, 1, 60)


def service_level(
    url: str,
    concurrency: int,
    in_len: int,
    out_len: int,
    per_worker: int,
    transport: str = "raw",
    procs: int = 1,
    temperature: float | None = None,
) -> dict:
    """One concurrency level against the server, through `python -m client bench`'s code:
    streamed /v1/completions with exact-length token-id prompts, greedy unless `temperature`."""
    results = closed_loop_level(
        url, concurrency, in_len, out_len, per_worker, transport, procs, temperature
    )
    row = level_row("service", concurrency, in_len, out_len, results["runs"][0]["metrics"])
    row["temperature"] = temperature or 0.0
    if results["host"].get("warning"):
        row["host_warning"] = results["host"]["warning"]
    return row


def text_level(url: str, model: str, concurrency: int, in_len: int, out_len: int, n: int) -> dict:
    """One level with text prompts (`python -m client bench --backend openai`, synthetic
    prompts fitted to in_len tokens by the server's own counts): what any OpenAI server
    takes, so ours and the peer see the same load."""
    cfg = BenchConfig(
        url=url,
        backend="openai",
        model=model,
        num_prompts=n,
        input_len=in_len,
        output_len=out_len,
        concurrency=[concurrency],
        warmup=0,
        transport="raw",
        client_procs=4 if concurrency >= 16 else 1,
        progress=False,
        report=False,
    )
    results = asyncio.run(run_bench(cfg))
    return level_row("text", concurrency, in_len, out_len, results["runs"][0]["metrics"])


def text_sweep(url: str, model: str, label: str, levels: list[int]) -> None:
    for c in levels:
        if time_left() < 25:
            emit(figure="skipped", variant=label, concurrency=c, why="out of time")
            continue
        try:
            row = text_level(url, model, c, 128, 128, 2 if c == 1 else c)
        except Exception as exc:  # noqa: BLE001 - a figure that failed is reported, not fatal
            emit(figure="failed", variant=label, concurrency=c, error=repr(exc)[:300])
            continue
        emit(figure="text", server=label, **row)


def wait_until_ready(proc: subprocess.Popen, url: str, t0: float, log: str | None) -> float:
    import httpx

    while True:
        if proc.poll() is not None:
            raise SystemExit(f"server exited with {proc.returncode}; see {log}")
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return time.perf_counter() - t0
        except httpx.HTTPError:
            pass
        if time.perf_counter() - t0 > 300:
            raise SystemExit("server not ready in 300 s")
        time.sleep(0.1)


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def start_server(
    app: Path,
    settings: dict[str, str],
    log: str | None,
    packages: str | None = None,
    command: list[str] | None = None,
) -> tuple:
    """The launcher (`python -m mistral_serving.http.server`, as the image runs it) on a prepared
    app folder, through `local_server.LocalServer`, importing the serving code from
    `packages` (default: this repo's); (the server, seconds from launch to ready)."""
    from mistral_build.local_server import LocalServer

    packages = packages or str(PACKAGES)
    path = os.pathsep.join(p for p in (packages, os.environ.get("PYTHONPATH", "")) if p)
    log_path = Path(log) if log else None
    started = time.perf_counter()
    server = LocalServer.start(
        app.parent, settings, {"PYTHONPATH": path}, log_path, command=command
    )
    return server, time.perf_counter() - started


def warm_up(url: str, max_batch_size: int) -> None:
    """Capture the CUDA-graph buckets the levels use, outside the timings (the engine
    benchmark's warm-up, through the server)."""
    for c in (1, 2, 4, 8, 16, 32, 64, 128, 256):
        if c <= max_batch_size:
            service_level(url, c, 128, 4, 1, transport="httpx")


def server_settings(args) -> dict[str, str]:
    """The server's settings: the benchmark's limits, then --set's."""
    settings = {
        "artifact": str(Path(args.dir).resolve()),
        "engine": args.engine,
        "verify_hashes": "true" if args.verify else "false",
        "max_batch_size": str(args.max_batch_size),
        "max_seq_len": str(args.max_seq_len),
        "max_inflight": "512",
        "max_waiting": "1024",
    }
    if args.verify:
        settings["cache_dir"] = args.verify
    return settings | dict(item.partition("=")[::2] for item in args.set or [])


def service_bench(args) -> None:
    """`gpu_bench.py service`: start the server, then (unless --start-only) the project's
    client at every level, the second clients, structured output and text prompts."""
    settings = server_settings(args)
    if args.suite:  # the engine's structured-output timers, read by the suite
        os.environ[PROFILE_ENV] = str(Path(os.environ.get("LOGS", "/tmp")) / "guided-profile.json")
    cold = drop_page_cache()
    command = None
    if args.burst:  # the server under bench/burst_probe.py: its records' times written out
        logs = Path(os.environ.get("LOGS", "/tmp"))
        logs.mkdir(parents=True, exist_ok=True)
        probe = logs / f"burst-probe-{os.getpid()}.jsonl"
        os.environ["BURST_PROBE_OUT"] = str(probe)
        command = [sys.executable, str(Path(__file__).resolve().parents[1] / "burst_probe.py")]
    server, ready = start_server(
        Path(args.app).resolve(), settings, args.log, args.packages, command
    )
    url = server.url
    try:
        emit(
            figure="server_start_to_ready",
            seconds=round(ready, 1),
            page_cache_dropped=cold,
            evicted="artifact only" if common.DROP_CACHE == "artifact" else "all",
            verify_hashes=bool(args.verify),
            engine=args.engine,
            set=args.set,
        )
        if args.start_only:
            return
        warm_up(url, args.max_batch_size)
        gc_at_ready = gc_histogram(url)  # the run's pauses: from here to the end
        shapes = [SHAPE] + ([LONG_SHAPE] if args.long else [])
        token_id_sweeps(url, args, shapes)
        second_clients(url, args, settings, shapes)
        if args.burst:
            bursts_at(server.port, args, Path(os.environ["BURST_PROBE_OUT"]))
        if args.guided:
            guided_rounds(url, args)
        if args.suite:
            from mistral_serving.settings import Settings

            suite_rounds(url, args, Settings.load(settings).served_model_name)
        if args.text_levels:
            from mistral_serving.settings import Settings

            name = Settings.load(settings).served_model_name  # with any MTT_* of this process
            text_sweep(url, name, f"ours {args.set}", args.text_levels)
        emit(figure="server_gc", set=args.set, **gc_pauses(gc_at_ready, gc_histogram(url)))
    finally:
        server.stop(timeout=30)


def bursts_at(port: int, args, probe: Path) -> None:
    """bench/burst_ttft.py's bursts of 16 request starts against this server start: where
    each request's time to its first token goes, and the engine's prefill groups."""
    from types import SimpleNamespace

    from bench.burst_ttft import print_bursts, run_bursts

    if time_left() < 25:
        emit(figure="skipped", variant="burst", why="out of time")
        return
    shape = SimpleNamespace(concurrency=16, input_len=128, output_len=128,
                            client_procs=args.client_procs)  # fmt: skip
    bursts = run_bursts(port, shape, probe, args.burst)
    print_bursts(bursts)
    emit(figure="burst_ttft", engine=args.engine, concurrency=16, set=args.set, bursts=bursts)


def token_id_sweeps(url: str, args, shapes: list[tuple[int, int, int, int]]) -> None:
    """The project's client at each shape's levels: the `service` rows."""
    for in_len, out_len, per_worker, budget in shapes:
        for c in levels_for(args, in_len):
            if time_left() < budget:
                emit(figure="skipped", variant="service", concurrency=c, why="out of time")
                continue
            row = service_level(url, c, in_len, out_len, per_worker, args.client,
                                args.client_procs, args.temperature)  # fmt: skip
            emit(figure="service", set=args.set, client=args.client, **row)


def second_clients(
    url: str, args, settings: dict[str, str], shapes: list[tuple[int, int, int, int]]
) -> None:
    """guidellm (--guidellm, 128/128) and AIPerf (--aiperf, every shape) after our client,
    against the same server start."""
    if args.guidellm:
        for c in args.concurrency:
            if time_left() < 30:
                emit(figure="skipped", variant="guidellm", concurrency=c, why="out of time")
                continue
            guidellm_level(url, args, c)
    if not args.aiperf:
        return
    from mistral_serving.settings import Settings

    model = Settings.load(settings).served_model_name
    for in_len, out_len, _, _ in shapes:
        for c in levels_for(args, in_len):
            if time_left() < 30:
                emit(figure="skipped", variant="aiperf", concurrency=c, why="out of time")
                continue
            aiperf_level(url, model, str(Path(args.dir).resolve()), c, in_len, out_len,
                         temperature=args.temperature or 0.0, set=args.set,
                         token_ids=args.aiperf_token_ids)  # fmt: skip


def gc_histogram(url: str) -> dict:
    """The server's `gc_pause_seconds` histogram from `/metrics`, by generation:
    {"gen2": {"count": n, "sum": s, "buckets": {le: cumulative count}}}."""
    import requests
    from prometheus_client.parser import text_string_to_metric_families

    out: dict = {}
    text = requests.get(url + "/metrics", timeout=30).text
    for family in text_string_to_metric_families(text):
        if family.name.endswith("gc_pause_seconds"):
            for sample in family.samples:
                row = out.setdefault(
                    "gen" + sample.labels["generation"], {"count": 0, "sum": 0.0, "buckets": {}}
                )
                if sample.name.endswith("_count"):
                    row["count"] = sample.value
                elif sample.name.endswith("_sum"):
                    row["sum"] = sample.value
                elif sample.name.endswith("_bucket"):
                    row["buckets"][float(sample.labels["le"])] = sample.value
    return out


def gc_pauses(before: dict, after: dict) -> dict:
    """The pauses between two `gc_histogram` reads: count, total seconds, and an upper
    bound of the longest (the first bucket holding all of them), by generation."""
    out = {}
    for gen, row in after.items():
        old = before.get(gen, {"count": 0, "sum": 0.0, "buckets": {}})
        count = int(row["count"] - old["count"])
        bound = next(
            (
                le
                for le, v in sorted(row["buckets"].items())
                if v - old["buckets"].get(le, 0) >= count
            ),
            None,
        )
        out[gen] = {
            "count": count,
            "sum_s": round(row["sum"] - old["sum"], 4),
            "max_le_s": bound if count else None,
        }
    return out
