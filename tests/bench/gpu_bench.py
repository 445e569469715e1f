"""GPU benchmark of the PyTorch engine and the service, one step per subcommand;
`tests/bench/run_gpu.sh` runs them all in one device call. Prints one JSON line per figure
(and appends it to --out).

  make-artifact DIR   a Mistral-7B-shaped bf16 checkpoint with random weights (no download),
                      saved as safetensors with the dev tokenizer files beside it
  engine DIR          in-process: cold load, the article's way (HF generate, one request at
                      a time), and the engine variants at several concurrency levels
  service DIR APP     the real Truss server on DIR: start-to-ready, then the load of
                      `python -m client bench` (client/bench.py) at several concurrency levels
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "mistral-trt-truss/packages"), str(ROOT)]

# One benchmark client and one set of metric definitions for every figure.
from client.bench import BenchConfig, run_bench  # noqa: E402
from client.datasets import token_id_prompts  # noqa: E402
from client.metrics import RequestTiming, compute_metrics, summary_row  # noqa: E402

OUT: Path | None = None
DEADLINE = float("inf")
DROP_CACHE = False


def id_prompts(n: int, length: int, seed: int = 0) -> list[list[int]]:
    return [item.prompt for item in token_id_prompts(n, length, seed=seed)]


def level_row(kind: str, concurrency: int, in_len: int, out_len: int, metrics: dict) -> dict:
    """One sweep point's figures, computed by client.metrics like every other benchmark."""
    return {
        "kind": kind,
        "concurrency": concurrency,
        "input_len": in_len,
        "output_len": out_len,
        **summary_row(metrics),
    }


def service_level(
    url: str,
    concurrency: int,
    in_len: int,
    out_len: int,
    per_worker: int,
    transport: str = "raw",
    procs: int = 1,
) -> dict:
    """One concurrency level against the server, through `python -m client bench`'s code:
    streamed /v1/completions with exact-length token-id prompts, greedy."""
    cfg = BenchConfig(
        url=url,
        backend="openai",
        prompt_ids=True,
        num_prompts=concurrency * per_worker,
        input_len=in_len,
        output_len=out_len,
        concurrency=[concurrency],
        warmup=0,
        transport=transport,
        client_procs=procs if transport == "raw" else 1,
        progress=False,
        report=False,
    )
    results = asyncio.run(run_bench(cfg))
    row = level_row("service", concurrency, in_len, out_len, results["runs"][0]["metrics"])
    if results["host"].get("warning"):
        row["host_warning"] = results["host"]["warning"]
    return row


def emit(**row) -> None:
    line = json.dumps(row)
    print(line, flush=True)
    if OUT:
        with OUT.open("a") as f:
            f.write(line + "\n")


def time_left() -> float:
    return DEADLINE - time.time()


def drop_page_cache() -> bool:
    """Make 'from local disk' mean the disk, not the page cache (root on the device VM,
    with --drop-page-cache only: never on a shared machine)."""
    if not DROP_CACHE:
        return False
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


MISTRAL_7B = dict(
    vocab_size=32000,
    hidden_size=4096,
    intermediate_size=14336,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=8,
    max_position_embeddings=32768,
    rope_theta=1e6,
    sliding_window=None,
    bos_token_id=1,
    eos_token_id=2,
)


def make_artifact(args) -> None:
    import torch
    from transformers import AutoModelForCausalLM, MistralConfig

    shape = dict(MISTRAL_7B)
    if args.tiny:
        shape.update(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=4096,
        )
    t = time.perf_counter()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(MistralConfig(**shape), dtype=torch.bfloat16)
    init_s = time.perf_counter() - t
    out = Path(args.dir)
    shutil.rmtree(out, ignore_errors=True)
    t = time.perf_counter()
    model.save_pretrained(out, max_shard_size="5GB")
    save_s = time.perf_counter() - t
    for name in ("tokenizer.model", "tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(Path(args.tokenizer_from) / name, out / name)
    size = sum(f.stat().st_size for f in out.glob("*.safetensors"))
    emit(
        figure="artifact",
        init_s=round(init_s, 1),
        save_s=round(save_s, 1),
        safetensors_GB=round(size / 1e9, 2),
    )


# ---- in-process ----


async def drive(
    engine, concurrency: int, in_len: int, out_len: int, per_worker: int, seed: int = 0
):
    from mistral_serving.engines.base import SamplingOptions

    todo = id_prompts(concurrency * per_worker, in_len, seed)
    records: list[RequestTiming] = []
    counter = iter(range(10**9))

    async def worker():
        while todo:
            prompt = todo.pop()
            start, arrivals, n = time.perf_counter(), [], 0
            async for delta in engine.generate(
                f"b{next(counter)}", prompt, SamplingOptions(max_new_tokens=out_len, top_k=1)
            ):
                if delta.token_ids:
                    arrivals.append(time.perf_counter())
                    n += len(delta.token_ids)
            records.append(
                RequestTiming.from_times(
                    len(records),
                    start,
                    arrivals,
                    time.perf_counter(),
                    n,
                    run_start=t0,
                    prompt_tokens=len(prompt),
                )
            )

    t0 = time.perf_counter()
    await asyncio.gather(*[worker() for _ in range(concurrency)])
    return records, time.perf_counter() - t0


def sweep(
    engine, name: str, levels, in_len: int, out_len: int, per_worker: int, budget_s: float
) -> None:
    for c in levels:
        if time_left() < budget_s:
            emit(figure="skipped", variant=name, concurrency=c, why="out of time")
            continue
        records, wall = asyncio.run(drive(engine, c, in_len, out_len, per_worker))
        row = level_row("engine", c, in_len, out_len, compute_metrics(records, wall))
        emit(figure="engine", variant=name, **row)


def release(engine) -> None:
    """Stop an engine and free its GPU buffers (the next variant needs the memory)."""
    import gc

    import torch

    engine.shutdown()
    for name in ("_k", "_v", "_graphs", "_cache", "_pool"):
        if hasattr(engine, name):
            setattr(engine, name, None)
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def article_way(model, args) -> None:
    import torch

    # The article's way: HF generate, one request at a time (so any concurrency gets this
    # rate; requests queue). In-process, so no HTTP cost: an upper bound for it.
    dev = next(model.parameters()).device
    reps = 2 if args.quick else 3
    prompts = id_prompts(reps + 1, 128, seed=7)
    model.generate(
        torch.tensor([prompts[0]], device=dev),
        max_new_tokens=8,
        min_new_tokens=8,
        do_sample=False,
        pad_token_id=0,
    )
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    t = time.perf_counter()
    for p in prompts[1:]:
        model.generate(
            torch.tensor([p], device=dev),
            max_new_tokens=128,
            min_new_tokens=128,
            do_sample=False,
            pad_token_id=0,
        )
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    wall = time.perf_counter() - t
    emit(
        figure="article_hf_generate_serial",
        requests=reps,
        output_tok_s=round(reps * 128 / wall, 1),
        e2e_s=round(wall / reps, 2),
    )


def disk_read_test(artifact: Path) -> None:
    """Cold read rate of the artifact's disk: one sequential reader vs 8 in parallel."""
    import threading

    shards = sorted(artifact.glob("*.safetensors"))
    chunk, total = 64 * 2**20, 2 * 2**30
    for threads, path in ((1, shards[0]), (8, shards[1 % len(shards)])):
        if not drop_page_cache():
            return
        offsets = list(range(0, min(total, path.stat().st_size), chunk))

        def work(mine, path=path):
            fd, buf = os.open(path, os.O_RDONLY), bytearray(chunk)
            for off in mine:
                os.preadv(fd, [buf], off)
            os.close(fd)

        t = time.perf_counter()
        pool = [threading.Thread(target=work, args=(offsets[i::threads],)) for i in range(threads)]
        for th in pool:
            th.start()
        for th in pool:
            th.join()
        dt = time.perf_counter() - t
        emit(
            figure="disk_read",
            threads=threads,
            GB=round(len(offsets) * chunk / 1e9, 2),
            GB_s=round(len(offsets) * chunk / 1e9 / dt, 2),
        )


def graph_floor(engine) -> None:
    """GPU time of one captured decode step (replays back to back): the floor under TPOT."""
    import torch

    for key, (graph, _) in sorted(engine._graphs.items()):
        if key[1] != 256 or key[0] not in (1, 16, 64, 256):
            continue
        graph.replay()
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(20):
            graph.replay()
        torch.cuda.synchronize()
        emit(
            figure="graph_step_gpu_ms",
            rows=key[0],
            columns=key[1],
            ms=round((time.perf_counter() - t) / 20 * 1000, 2),
        )


def engine_bench(args) -> None:

    from mistral_serving.engines.base import EngineLimits
    from mistral_serving.engines.pytorch import TorchEngine
    from mistral_serving.engines.pytorch_static import StaticTorchEngine
    from mistral_serving.settings import Settings

    artifact = Path(args.dir)
    if args.disk_test:
        disk_read_test(artifact)
    cold = drop_page_cache()
    settings = Settings(
        artifact=str(artifact),
        engine="pytorch",
        pytorch_kv_cache="static",
        max_batch_size=args.max_batch_size,
        max_seq_len=args.max_seq_len,
        verify_hashes=False,
    )
    t = time.perf_counter()
    engine = StaticTorchEngine.from_pretrained(artifact, settings, eos_token_id=2)
    asyncio.run(drive(engine, 1, 8, 2, 1))  # first token out: the engine works
    emit(
        figure="cold_load",
        seconds=round(time.perf_counter() - t, 1),
        page_cache_dropped=cold,
        what="StaticTorchEngine.from_pretrained + first 2-token request",
    )
    model = engine._model

    # Warm-up: capture the graphs the sweeps use (bucket x width), outside the timings.
    t = time.perf_counter()
    for c in (1, 2, 4, 8, 16, 32, 64, 128, 256):
        if c <= args.max_batch_size:
            asyncio.run(drive(engine, c, 128, 4, 1))
    emit(figure="warmup", seconds=round(time.perf_counter() - t, 1), details=engine.info.details)

    levels = [c for c in (1, 16, 64, 256) if c <= args.max_batch_size]
    sweep(engine, "static+graphs", levels, 128, 128, 2, 20)
    if engine._graphs:
        # The engine thread is idle now (no requests), so replaying here is safe.
        graph_floor(engine)
    interval = sys.getswitchinterval()  # from_pretrained set gil_switch_interval_ms
    sys.setswitchinterval(0.005)  # Python's default: does the GIL hand-off cost step time?
    sweep(engine, "static+graphs, GIL switch 5 ms", [1, 256], 128, 128, 1, 20)
    sys.setswitchinterval(interval)
    if not args.skip_variants:
        article_way(model, args)
    if not args.quick:
        sweep(
            engine,
            "static+graphs",
            [c for c in (1, 16, 64, 256) if c <= args.max_batch_size],
            1024,
            256,
            1,
            60,
        )
    release(engine)
    del engine

    # Attempt record: the same fast path without CUDA graphs, and the original engine.
    limits = EngineLimits(args.max_seq_len - 1, args.max_seq_len, args.max_batch_size)
    if args.skip_variants:
        return
    if time_left() > 60:
        eager = StaticTorchEngine(model, 2, limits, 8192, cuda_graphs=False)
        sweep(eager, "static eager", [1, 256][: 1 if args.quick else 2], 128, 128, 1, 40)
        release(eager)
        del eager
    if time_left() > 60:
        dynamic = TorchEngine(model, 2, limits, 8192)
        sweep(dynamic, "dynamic (before)", [1, 64, 256][: 1 if args.quick else 3], 128, 128, 1, 40)
        release(dynamic)
        del dynamic


# ---- the real Truss server ----


def service_bench(args) -> None:
    import httpx

    app = Path(args.app).resolve()
    env = dict(os.environ)
    packages = str(Path(__file__).resolve().parents[2] / "mistral-trt-truss/packages")
    env.update(
        {
            "INFERENCE_SERVER_PORT": str(args.port),
            "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": os.pathsep.join(p for p in (packages, env.get("PYTHONPATH", "")) if p),
            "MTT_ARTIFACT": str(Path(args.dir).resolve()),
            "MTT_ENGINE": args.engine,
            "MTT_VERIFY_HASHES": "false",
            "MTT_MAX_BATCH_SIZE": str(args.max_batch_size),
            "MTT_MAX_SEQ_LEN": str(args.max_seq_len),
            "MTT_MAX_INFLIGHT": "512",
            "MTT_MAX_WAITING": "1024",
        }
    )
    if args.engine == "pytorch":
        env["MTT_PYTORCH_KV_CACHE"] = "static"
    for item in args.set or []:
        key, _, value = item.partition("=")
        env["MTT_" + key.upper()] = value
    cold = drop_page_cache()
    log = open(args.log, "w") if args.log else subprocess.DEVNULL  # noqa: SIM115
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, str(app / "main.py")],
        cwd=app,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{args.port}"
    try:
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"server exited with {proc.returncode}; see {args.log}")
            try:
                if httpx.get(url + "/v1/models/model", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.perf_counter() - t0 > 300:
                raise SystemExit("server not ready in 300 s")
            time.sleep(0.1)
        emit(
            figure="server_start_to_ready",
            seconds=round(time.perf_counter() - t0, 1),
            page_cache_dropped=cold,
            engine=args.engine,
            set=args.set,
        )
        for c in (1, 2, 4, 8, 16, 32, 64, 128, 256):  # same warm-up as the engine run
            if c <= args.max_batch_size:
                service_level(url, c, 128, 4, 1, transport="httpx")
        for in_len, out_len, per_worker, budget in ((128, 128, 2, 20), (1024, 256, 1, 60)):
            if (args.quick or args.short) and in_len > 128:
                continue
            for c in args.concurrency:
                if time_left() < budget:
                    emit(figure="skipped", variant="service", concurrency=c, why="out of time")
                    continue
                row = service_level(
                    url, c, in_len, out_len, per_worker, args.client, args.client_procs
                )
                emit(figure="service", set=args.set, client=args.client, **row)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def main() -> int:
    global OUT, DEADLINE, DROP_CACHE
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("step", choices=["make-artifact", "engine", "service"])
    ap.add_argument("dir")
    ap.add_argument("app", nargs="?")
    ap.add_argument("--tokenizer-from", default=".cache/dev-model")
    ap.add_argument("--tiny", action="store_true", help="a tiny model (CPU check of the script)")
    ap.add_argument("--quick", action="store_true", help="fewer levels (CPU check)")
    ap.add_argument("--max-batch-size", type=int, default=256)
    ap.add_argument("--max-seq-len", type=int, default=2048)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64, 256])
    ap.add_argument("--engine", default="pytorch")
    ap.add_argument("--port", type=int, default=8089)
    ap.add_argument("--log")
    ap.add_argument("--out")
    ap.add_argument(
        "--skip-variants",
        action="store_true",
        help="only the fast path (no eager / dynamic / HF generate runs)",
    )
    ap.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="service: a setting for the server (MTT_KEY=VALUE)",
    )
    ap.add_argument(
        "--client",
        choices=["raw", "httpx"],
        default="raw",
        help="service: the transport of `python -m client bench` (raw: lean HTTP/1.1)",
    )
    ap.add_argument("--client-procs", type=int, default=4)
    ap.add_argument("--short", action="store_true", help="service: 128/128 only")
    ap.add_argument("--disk-test", action="store_true", help="time cold disk reads first")
    ap.add_argument(
        "--drop-page-cache",
        action="store_true",
        help="drop the OS page cache before a cold load (the device VM only)",
    )
    ap.add_argument("--deadline", type=float, help="unix time after which sweeps are skipped")
    args = ap.parse_args()
    OUT = Path(args.out) if args.out else None
    DEADLINE = args.deadline or float("inf")
    DROP_CACHE = args.drop_page_cache
    {"make-artifact": make_artifact, "engine": engine_bench, "service": service_bench}[args.step](
        args
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
