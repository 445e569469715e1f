"""The engine in-process, no HTTP: what the server's share of it is taken against (goal 3,
and the denominator of goal 1). Cold load, sweeps at each concurrency level driven by
asyncio tasks, the GPU time of one captured decode step, and (without --skip-variants) the
engines it replaced."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

from bench.gpu import common
from bench.gpu.common import drop_page_cache, emit, id_prompts, level_row, levels_for, time_left
from bench.gpu.correctness import correctness_check, hf_copy
from client.metrics import RequestTiming, compute_metrics

WARM_UP_LEVELS = (1, 2, 4, 8, 16, 32, 64, 128, 256)  # the CUDA-graph buckets the sweeps use


async def drive(
    engine, concurrency: int, in_len: int, out_len: int, per_worker: int, seed: int = 0
):
    """A closed loop of `concurrency` workers, `per_worker` greedy requests each; the
    requests' timings and the wall time."""
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
            end = time.perf_counter()
            records.append(
                RequestTiming.from_times(
                    len(records), start, arrivals, end, n, run_start=t0, prompt_tokens=len(prompt)
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


def timed_first_request(engine) -> None:
    asyncio.run(drive(engine, 1, 8, 2, 1))  # first token out: the engine works


def engine_settings(artifact: Path, args):
    from mistral_serving.settings import Settings

    # pytorch_kv_cache left at its default (auto): the static path on a GPU.
    return Settings(
        artifact=str(artifact),
        engine="pytorch",
        max_batch_size=args.max_batch_size,
        max_seq_len=args.max_seq_len,
        verify_hashes=False,
        **dict(item.partition("=")[::2] for item in args.set or []),
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


def compare_loaders(artifact: Path, args) -> None:
    """Cold load with transformers' `from_pretrained` (the previous loader), for the
    side-by-side with the direct loader that follows."""
    from mistral_gpu_fallback.static.engine import StaticTorchEngine
    from mistral_serving.engines.pytorch.dynamic import load_model

    settings = engine_settings(artifact, args)
    cold = drop_page_cache()
    t = time.perf_counter()
    loaded = load_model(artifact, settings)
    load_s = time.perf_counter() - t
    engine = StaticTorchEngine.for_model(loaded, settings, 2)
    timed_first_request(engine)
    emit(
        figure="cold_load",
        loader="transformers from_pretrained",
        seconds=round(time.perf_counter() - t, 1),
        load_s=round(load_s, 1),
        page_cache_dropped=cold,
        what="load_model + StaticTorchEngine + first 2-token request",
    )
    release(engine)
    del engine, loaded


def cold_load(artifact: Path, args):
    """The engine the factory picks by default, loaded from a cold page cache (with
    --drop-page-cache) and warmed up: every CUDA-graph bucket the sweeps use captured."""
    from mistral_gpu_fallback.static.engine import StaticTorchEngine
    from mistral_serving.engines.factory import start_torch_engine

    settings = engine_settings(artifact, args)
    cold = drop_page_cache()
    t = time.perf_counter()
    engine = start_torch_engine(artifact, settings, 2)
    timed_first_request(engine)
    static = isinstance(engine, StaticTorchEngine)
    emit(
        figure="cold_load",
        loader="direct safetensors" if static else "transformers from_pretrained",
        seconds=round(time.perf_counter() - t, 1),
        page_cache_dropped=cold,
        engine=type(engine).__name__,
        pytorch_kv_cache=settings.pytorch_kv_cache,
        what="start_torch_engine (default settings) + first 2-token request",
    )
    t = time.perf_counter()
    for c in WARM_UP_LEVELS:
        if c <= args.max_batch_size:
            asyncio.run(drive(engine, c, 128, 4, 1))
    emit(figure="warmup", seconds=round(time.perf_counter() - t, 1), details=engine.info.details)
    return engine


def engine_bench(args) -> None:
    """`gpu_bench.py engine`: load, sweeps (128/128 --repeat times, then --long's 1024/256),
    the captured step, and the optional checks and older engines."""
    artifact = Path(args.dir)
    if args.disk_test:
        disk_read_test(artifact)
    if args.compare_loaders:
        compare_loaders(artifact, args)
    engine = cold_load(artifact, args)
    model = engine._model
    levels = [c for c in args.concurrency if c <= args.max_batch_size]
    name = f"default {' '.join(args.set or [])}".strip()
    for _ in range(args.repeat):
        sweep(engine, name, levels, 128, 128, 2, 20)
    if getattr(engine, "_graphs", None):
        graph_floor(engine)  # the engine thread is idle now (no requests): replaying is safe
    if args.gil_ab:
        interval = sys.getswitchinterval()  # from_pretrained set gil_switch_interval_ms
        sys.setswitchinterval(0.005)  # Python's default: does the GIL hand-off cost step time?
        sweep(engine, "default, GIL switch 5 ms", [1, 256], 128, 128, 1, 20)
        sys.setswitchinterval(interval)
    if not args.skip_variants:
        hf_generate_serial(hf_copy(model), args)
    if args.correctness:
        correctness_check(engine, model, args)
    if args.long:
        long_levels = [c for c in levels_for(args, common.LONG_INPUT) if c <= args.max_batch_size]
        sweep(engine, name, long_levels, common.LONG_INPUT, 256, 1, 60)
    release(engine)
    del engine
    if not args.skip_variants:
        older_engines(model, args)


def hf_generate_serial(model, args) -> None:
    """HF `generate`, one request at a time, as the original Truss example serves (so any
    concurrency gets this rate; requests queue). In-process, so no HTTP cost: an upper
    bound for that way of serving."""
    import torch

    dev = next(model.parameters()).device
    reps = 2 if args.quick else 3
    prompts = id_prompts(reps + 1, 128, seed=7)

    def generate(prompt: list[int], tokens: int) -> None:
        ids = torch.tensor([prompt], device=dev)
        model.generate(
            ids, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False, pad_token_id=0
        )
        if torch.cuda.is_available():
            torch.cuda.synchronize()

    generate(prompts[0], 8)
    t = time.perf_counter()
    for p in prompts[1:]:
        generate(p, 128)
    wall = time.perf_counter() - t
    emit(
        figure="article_hf_generate_serial",  # the name the earlier results use
        requests=reps,
        output_tok_s=round(reps * 128 / wall, 1),
        e2e_s=round(wall / reps, 2),
    )


def older_engines(model, args) -> None:
    """The same fast path without CUDA graphs, and the engine it replaced (a record of what
    each change gave; run only without --skip-variants)."""
    from mistral_gpu_fallback.static.engine import StaticOptions, StaticTorchEngine
    from mistral_serving.engines.base import EngineLimits
    from mistral_serving.engines.pytorch.dynamic import TorchEngine, TorchOptions

    limits = EngineLimits(args.max_seq_len - 1, args.max_seq_len, args.max_batch_size)
    if time_left() > 60:
        eager = StaticTorchEngine(model, 2, limits, StaticOptions(8192, cuda_graphs=False))
        sweep(eager, "static eager", [1, 256][: 1 if args.quick else 2], 128, 128, 1, 40)
        release(eager)
        del eager
    if time_left() > 60:
        dynamic = TorchEngine(hf_copy(model), 2, limits, TorchOptions(8192))
        sweep(dynamic, "dynamic (before)", [1, 64, 256][: 1 if args.quick else 3], 128, 128, 1, 40)
        release(dynamic)
        del dynamic
