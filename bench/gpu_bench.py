"""GPU benchmark of the PyTorch engine and the service, one step per subcommand;
`bench/run_gpu.sh` runs them all in one device call. Prints one JSON line per figure
(and appends it to --out).

  make-artifact DIR   a Mistral-7B-shaped bf16 checkpoint with random weights (no download),
                      saved as safetensors with the dev tokenizer files beside it
  prepare-verify DIR  a build manifest for DIR (sha256 of every file), then the artifact
                      check twice with verify_hashes on: hashing (first start after a
                      download) and the verified marker (every later start)
  engine DIR          in-process: cold load (the direct safetensors loader, and with
                      --compare-loaders transformers' loader first), the engine the factory
                      picks by default at several concurrency levels, the GPU time of one
                      captured step, and with --correctness the static engine's greedy
                      tokens teacher-forced through an fp32 reference vs plain HF bf16
  service DIR APP     the real Truss server on DIR: start-to-ready, then the load of
                      `python -m client bench` (client/bench.py) at several concurrency levels
  peer DIR            `transformers serve --continuous-batching` on DIR (bench/
                      peer_serve.py), the same client with text prompts

`engine --set KEY=VALUE` runs the sweep with those settings (e.g. prefill_chunk_tokens);
`service --guidellm` runs guidellm (from the package index, an independent load generator)
at the same levels after the project's client, `service --aiperf` NVIDIA's AIPerf the same
way (128 in / 128 out, 2 requests per stream, streamed /v1/completions, `figure="aiperf"`
rows with guidellm's keys; GUIDELLM_PY / AIPERF_PY name their pythons); `service --guided N`
times N concurrent chat streams with a nested-object json_schema against N plain ones,
`--guided-rounds` times.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "mistral-trt-truss/packages"), str(ROOT)]

# One benchmark client and one set of metric definitions for every figure.
from client.bench import BenchConfig, closed_loop_level, run_bench  # noqa: E402
from client.datasets import token_id_prompts  # noqa: E402
from client.metrics import RequestTiming, compute_metrics, summary_row  # noqa: E402

OUT: Path | None = None
DEADLINE = float("inf")
DROP_CACHE: bool | str = False  # True: the whole page cache; "artifact": its files only
ARTIFACT = ""


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
        if DROP_CACHE == "artifact":  # only the artifact's pages: libraries stay cached
            for path in Path(ARTIFACT).iterdir():
                if path.is_file():
                    fd = os.open(path, os.O_RDONLY)
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                    os.close(fd)
            return True
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


def engine_bench(args) -> None:
    from mistral_gpu_fallback.static.engine import StaticTorchEngine
    from mistral_serving.engines.base import EngineLimits
    from mistral_serving.engines.factory import start_torch_engine
    from mistral_serving.engines.pytorch.dynamic import TorchEngine, TorchOptions

    artifact = Path(args.dir)
    if args.disk_test:
        disk_read_test(artifact)
    if args.compare_loaders:
        compare_loaders(artifact, args)
    settings = engine_settings(artifact, args)
    cold = drop_page_cache()
    t = time.perf_counter()
    engine = start_torch_engine(artifact, settings, 2)  # the factory's default choice
    timed_first_request(engine)
    emit(
        figure="cold_load",
        loader="direct safetensors"
        if isinstance(engine, StaticTorchEngine)
        else "transformers from_pretrained",
        seconds=round(time.perf_counter() - t, 1),
        page_cache_dropped=cold,
        engine=type(engine).__name__,
        pytorch_kv_cache=settings.pytorch_kv_cache,
        what="start_torch_engine (default settings) + first 2-token request",
    )
    model = engine._model

    # Warm-up: capture the graphs the sweeps use (bucket x width), outside the timings.
    t = time.perf_counter()
    for c in (1, 2, 4, 8, 16, 32, 64, 128, 256):
        if c <= args.max_batch_size:
            asyncio.run(drive(engine, c, 128, 4, 1))
    emit(figure="warmup", seconds=round(time.perf_counter() - t, 1), details=engine.info.details)

    levels = [c for c in args.concurrency if c <= args.max_batch_size]
    name = f"default {' '.join(args.set or [])}".strip()
    for _ in range(args.repeat):
        sweep(engine, name, levels, 128, 128, 2, 20)
    if getattr(engine, "_graphs", None):
        # The engine thread is idle now (no requests), so replaying here is safe.
        graph_floor(engine)
    if args.gil_ab:
        interval = sys.getswitchinterval()  # from_pretrained set gil_switch_interval_ms
        sys.setswitchinterval(0.005)  # Python's default: does the GIL hand-off cost step time?
        sweep(engine, "default, GIL switch 5 ms", [1, 256], 128, 128, 1, 20)
        sys.setswitchinterval(interval)
    if not args.skip_variants:
        article_way(hf_copy(model), args)
    if args.correctness:
        correctness_check(engine, model, args)
    if args.long:
        long_levels = [c for c in levels_for(args, 1024) if c <= args.max_batch_size]
        sweep(engine, name, long_levels, 1024, 256, 1, 60)
    release(engine)
    del engine

    # Attempt record: the same fast path without CUDA graphs, and the original engine.
    limits = EngineLimits(args.max_seq_len - 1, args.max_seq_len, args.max_batch_size)
    if args.skip_variants:
        return
    if time_left() > 60:
        eager = StaticTorchEngine(model, 2, limits, TorchOptions(8192, cuda_graphs=False))
        sweep(eager, "static eager", [1, 256][: 1 if args.quick else 2], 128, 128, 1, 40)
        release(eager)
        del eager
    if time_left() > 60:
        dynamic = TorchEngine(hf_copy(model), 2, limits, TorchOptions(8192))
        sweep(dynamic, "dynamic (before)", [1, 64, 256][: 1 if args.quick else 3], 128, 128, 1, 40)
        release(dynamic)
        del dynamic


def greedy_sequences(engine, prompts: list[list[int]], out_len: int) -> list[list[int]]:
    """Each prompt's greedy continuation from the engine, all submitted at once (so the
    batched, graph-replayed decode path makes them)."""
    from mistral_serving.engines.base import SamplingOptions

    async def one(i: int, prompt: list[int]) -> list[int]:
        tokens: list[int] = []
        options = SamplingOptions(max_new_tokens=out_len, top_k=1)
        async for delta in engine.generate(f"check{i}", prompt, options):
            tokens += delta.token_ids
        return tokens

    async def every():
        return await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))

    return asyncio.run(every())


def hf_copy(model, dtype=None):
    """The engine's weights in transformers' own model class (the static engine's modules
    have no forward pass of their own), on the same device, in `dtype` (default: the
    weights' own; bf16 -> fp32 is exact)."""
    import copy

    import torch
    from transformers import AutoModelForCausalLM

    config = copy.deepcopy(model.config)
    dtype = dtype or next(model.parameters()).dtype
    with torch.device("meta"):
        ref = AutoModelForCausalLM.from_config(config, dtype=dtype)
    device = next(model.parameters()).device
    ref.to_empty(device=device)
    ref.load_state_dict(model.state_dict())
    ref.model.rotary_emb = type(ref.model.rotary_emb)(ref.config).to(device)
    return ref.eval()


def teacher_forced_logits(model, seqs: list[list[int]], batch: int = 8):
    """Logits [n, T, V] (float32) of each sequence fed whole; right-padded, causal, so
    every real position sees only its own prefix."""
    import torch

    device = next(model.parameters()).device
    width = max(len(s) for s in seqs)
    out = []
    with torch.no_grad():
        for i in range(0, len(seqs), batch):
            ids = torch.zeros((len(seqs[i : i + batch]), width), dtype=torch.long)
            for r, s in enumerate(seqs[i : i + batch]):
                ids[r, : len(s)] = torch.tensor(s)
            out.append(model(ids.to(device)).logits.float())
    return torch.cat(out)


def correctness_check(engine, model, args) -> None:
    """Greedy sequences from the engine, teacher-forced through an fp32 reference: at
    each generated position, is the engine's token the fp32 argmax, and how far below
    the fp32 maximum is its fp32 logit (regret)? Plain HF bf16 (the model's own forward
    over the same sequences, its argmax as the choice) is the calibration: random
    weights make near-ties common, so neither is exact; the engine must be no worse."""
    import gc

    import torch

    torch.backends.cuda.matmul.allow_tf32 = False  # a true fp32 reference
    torch.backends.cudnn.allow_tf32 = False
    n, in_len, out_len = (4, 32, 16) if args.quick else (32, 128, 128)
    prompts = id_prompts(n, in_len, seed=11)
    outs = greedy_sequences(engine, prompts, out_len)
    engine_name = type(engine).__name__
    # The engine stays (idle): bf16 weights + KV cache + an fp32 copy fit on an H200.
    seqs = [p + o[:-1] for p, o in zip(prompts, outs) if o]  # the last token is not fed back
    hf_model = hf_copy(model)
    bf16 = teacher_forced_logits(hf_model, seqs)
    del hf_model
    ref_model = hf_copy(model, torch.float32)
    ref = teacher_forced_logits(ref_model, seqs)
    del ref_model
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    picks, rows = [], []
    kept = [(p, o) for p, o in zip(prompts, outs) if o]
    for i, (p, o) in enumerate(kept):
        for j, token in enumerate(o):
            rows.append((i, len(p) - 1 + j))  # the logits that chose token j
            picks.append(token)
    idx_i = torch.tensor([r[0] for r in rows])
    idx_t = torch.tensor([r[1] for r in rows])
    ref_rows = ref[idx_i, idx_t]  # [positions, V]
    hf_rows = bf16[idx_i, idx_t]
    chosen = torch.tensor(picks, device=ref_rows.device)
    hf_chosen = hf_rows.argmax(-1)
    best = ref_rows.max(-1)
    regret = best.values - ref_rows.gather(1, chosen[:, None])[:, 0]
    hf_regret = best.values - ref_rows.gather(1, hf_chosen[:, None])[:, 0]

    def q(x, p):
        return round(float(torch.quantile(x.float().cpu(), p)), 4)

    exact = float((chosen == best.indices).float().mean()) * 100
    hf_exact = float((hf_chosen == best.indices).float().mean()) * 100
    emit(
        figure="correctness",
        engine=engine_name,
        sequences=len(seqs),
        positions=len(picks),
        engine_exact_argmax_pct=round(exact, 1),
        hf_bf16_exact_argmax_pct=round(hf_exact, 1),
        engine_regret_p50=q(regret, 0.5),
        engine_regret_p99=q(regret, 0.99),
        engine_regret_max=round(float(regret.max()), 4),
        hf_bf16_regret_p50=q(hf_regret, 0.5),
        hf_bf16_regret_p99=q(hf_regret, 0.99),
        hf_bf16_regret_max=round(float(hf_regret.max()), 4),
        engine_equals_hf_bf16_pct=round(float((chosen == hf_chosen).float().mean()) * 100, 1),
        ref_logit_spread_p50=q(best.values - ref_rows.mean(-1), 0.5),
        no_worse_than_hf_bf16=bool(
            exact >= hf_exact - 1.0 and q(regret, 0.99) <= q(hf_regret, 0.99) * 1.1 + 1e-3
        ),
    )


# ---- the real Truss server ----


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
    app: Path, settings: dict[str, str], log: str | None, packages: str | None = None
) -> tuple:
    """The launcher (`python -m mistral_serving.http.server`, as the image runs it) on a prepared
    app folder, through `local_server.LocalServer`, importing the serving code from
    `packages` (default: this repo's); (the server, seconds from launch to ready)."""
    from mistral_build.local_server import LocalServer

    packages = packages or str(Path(__file__).resolve().parents[1] / "mistral-trt-truss/packages")
    path = os.pathsep.join(p for p in (packages, os.environ.get("PYTHONPATH", "")) if p)
    log_path = Path(log) if log else None
    started = time.perf_counter()
    server = LocalServer.start(app.parent, settings, {"PYTHONPATH": path}, log_path)
    return server, time.perf_counter() - started


def warm_up(url: str, max_batch_size: int) -> None:
    """Capture the CUDA-graph buckets the levels use, outside the timings (the engine
    benchmark's warm-up, through the server)."""
    for c in (1, 2, 4, 8, 16, 32, 64, 128, 256):
        if c <= max_batch_size:
            service_level(url, c, 128, 4, 1, transport="httpx")


def service_bench(args) -> None:
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
    settings |= dict(item.partition("=")[::2] for item in args.set or [])
    cold = drop_page_cache()
    server, ready = start_server(Path(args.app).resolve(), settings, args.log, args.packages)
    url = server.url
    try:
        emit(
            figure="server_start_to_ready",
            seconds=round(ready, 1),
            page_cache_dropped=cold,
            evicted="artifact only" if DROP_CACHE == "artifact" else "all",
            verify_hashes=bool(args.verify),
            engine=args.engine,
            set=args.set,
        )
        if args.start_only:
            return
        warm_up(url, args.max_batch_size)
        gc_at_ready = gc_histogram(url)  # the run's pauses: from here to the end
        shapes = [(128, 128, 2, 20)] + ([(1024, 256, 1, 60)] if args.long else [])
        for in_len, out_len, per_worker, budget in shapes:
            for c in levels_for(args, in_len):
                if time_left() < budget:
                    emit(figure="skipped", variant="service", concurrency=c, why="out of time")
                    continue
                row = service_level(
                    url, c, in_len, out_len, per_worker, args.client, args.client_procs,
                    args.temperature,
                )  # fmt: skip
                emit(figure="service", set=args.set, client=args.client, **row)
        if args.guidellm:
            for c in args.concurrency:
                if time_left() < 30:
                    emit(figure="skipped", variant="guidellm", concurrency=c, why="out of time")
                    continue
                guidellm_level(url, args, c)
        if args.aiperf:
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
        if args.guided:
            guided_rounds(url, args)
        if args.text_levels:
            from mistral_serving.settings import Settings

            name = Settings.load(settings).served_model_name  # with any MTT_* of this process
            text_sweep(url, name, f"ours {args.set}", args.text_levels)
        emit(figure="server_gc", set=args.set, **gc_pauses(gc_at_ready, gc_histogram(url)))
    finally:
        server.stop(timeout=30)


LONG_INPUT = 1024  # --long's shape: 1024 in / 256 out


def levels_for(args: argparse.Namespace, in_len: int) -> list[int]:
    """The concurrency levels of a shape: --long-concurrency for --long's, if given."""
    if in_len == LONG_INPUT and args.long_concurrency:
        return list(args.long_concurrency)
    return list(args.concurrency)


# ---- second clients, unchanged, from the package index: guidellm and AIPerf ----


def second_client_level(
    variant: str,
    command: list[str],
    env: dict[str, str],
    report: Path,
    figures,
    concurrency: int,
    in_len: int,
    out_len: int,
    **extra,
) -> dict:
    """Run one level of a second load client (`command` writes its JSON `report`); emit and
    return its row (`figure=variant`, `figures(report)`'s keys), or a `failed` row."""
    t = time.perf_counter()
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, env=env, timeout=min(600, max(30, time_left()))
        )
        ok = done.returncode == 0 and report.exists()
        error = done.stderr or done.stdout or f"exit status {done.returncode}, no report"
    except subprocess.TimeoutExpired as exc:
        ok, error = False, f"timed out after {exc.timeout:.0f} s"
    wall = time.perf_counter() - t
    if not ok:
        row = {"figure": "failed", "variant": variant, "concurrency": concurrency,
               "error": error[-600:]}  # fmt: skip
    else:
        row = {"figure": variant, "concurrency": concurrency, "input_len": in_len,
               "output_len": out_len, **extra, "wall_s": round(wall, 1),
               **figures(json.loads(report.read_text()))}  # fmt: skip
    emit(**row)
    return row


def client_logs() -> Path:
    # Beside the logs (tarred into $OUT by the scripts): $OUT brings back 8 files at most.
    logs = Path(os.environ.get("LOGS", "/tmp/bench-logs"))
    logs.mkdir(parents=True, exist_ok=True)
    return logs


def guidellm_level(url: str, args, concurrency: int, in_len: int = 128, out_len: int = 128) -> None:
    """One level through `guidellm run` (streamed /v1/completions, synthetic text of exactly
    `in_len` tokens by the served tokenizer, `ignore_eos` with `out_len` tokens, as guidellm
    itself sends them); its JSON report is kept under $OUT and its figures emitted."""
    report = client_logs() / f"guidellm-c{concurrency}-{int(time.time())}.json"
    command = [
        os.environ.get("GUIDELLM_PY", sys.executable), "-m", "guidellm", "run",
        "--backend", f"kind=openai_http,target={url},request_format=/v1/completions,model=model",
        "--profile", f"kind=concurrent,streams={concurrency}",
        "--constraint", f"kind=max_requests,count={2 * concurrency}",
        "--data", f"kind=synthetic_text,prompt_tokens={in_len},output_tokens={out_len}",
        "--tokenizer", f"kind=huggingface_auto,model={Path(args.dir).resolve()}",
        "--output", f"kind=json,path={report}",
        "--disable-console-interactive",
    ]  # fmt: skip
    env = os.environ | {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    second_client_level("guidellm", command, env, report, guidellm_figures,
                        concurrency, in_len, out_len, set=args.set)  # fmt: skip


def guidellm_figures(report: dict) -> dict:
    """Output tok/s, TTFT and ITL (p50/p99) and the request counts from guidellm's JSON
    report (its own statistics of the successful requests)."""
    bench = report["benchmarks"][0]
    metrics = bench["metrics"]

    def stat(name: str, *keys: str) -> float | None:
        node = metrics.get(name, {}).get("successful", {})
        for key in keys:
            node = node.get(key, {}) if isinstance(node, dict) else {}
        return round(node, 3) if isinstance(node, (int, float)) else None

    totals = bench.get("scheduler_metrics", {}).get("requests_made", {}) or {}
    return {
        "output_tok_s": stat("output_tokens_per_second", "mean"),
        "output_tokens": stat("output_token_count", "total_sum"),
        "prompt_tokens_p50": stat("prompt_token_count", "median"),
        "ttft_ms_p50": stat("time_to_first_token_ms", "median"),
        "ttft_ms_p99": stat("time_to_first_token_ms", "percentiles", "p99"),
        "itl_ms_p50": stat("inter_token_latency_ms", "median"),
        "itl_ms_p99": stat("inter_token_latency_ms", "percentiles", "p99"),
        "tpot_ms_p50": stat("time_per_output_token_ms", "median"),
        "requests": totals,
        "duration_s": round(bench.get("duration") or 0, 2),
    }


# AIPerf's offline mode (HF_HUB_OFFLINE) loads tokenizers from the Hub's cache only, not from
# a folder, so it runs online with every proxy pointed at a closed loopback port: nothing
# leaves the machine, and the server (loopback) is reached directly.
AIPERF_NO_NETWORK = {
    "HTTP_PROXY": "http://127.0.0.1:9",
    "HTTPS_PROXY": "http://127.0.0.1:9",
    "NO_PROXY": "127.0.0.1,localhost",
    "HF_DATASETS_OFFLINE": "1",
}


def aiperf_command(
    url: str,
    model: str,
    tokenizer: str,
    concurrency: int,
    in_len: int,
    out_len: int,
    out: Path,
    temperature: float = 0.0,
    payloads: Path | None = None,
) -> list[str]:
    """`aiperf profile` for one closed-loop level as our client runs it: streamed
    /v1/completions, synthetic prompts of exactly `in_len` tokens, `out_len` tokens with
    ignore_eos, 2 x concurrency requests, the temperature our client sends (AIPerf sends
    none, so the server's default, 1.0, would sample where ours is greedy: other work).
    Output is counted by the server's usage (AIPerf re-tokenising every answer is client
    work, not the server's); one warm-up request per
    stream first, so the timed requests find AIPerf's connection pool open (without it
    AIPerf's TTFT was 2.8x our client's on the CPU check); worker processes: every core but
    two (AIPerf's default, 0.75 of them less one, left it short of streams on 2 cores).
    With `payloads` (aiperf_token_id_payloads), AIPerf sends those bodies as they are
    (token-id prompts, as our client's) instead of synthetic text."""
    workers = min(concurrency, max(2, (os.cpu_count() or 2) - 2))
    if payloads is None:
        inputs = [
            "--synthetic-input-tokens-mean", str(in_len), "--synthetic-input-tokens-stddev", "0",
            "--output-tokens-mean", str(out_len), "--output-tokens-stddev", "0",
            "--extra-inputs", "ignore_eos:true", "--extra-inputs", f"min_tokens:{out_len}",
            "--extra-inputs", f"temperature:{temperature:g}",
        ]  # fmt: skip
    else:
        inputs = ["--input-file", str(payloads), "--custom-dataset-type", "inputs_json"]
    return [
        os.environ.get("AIPERF_PY", sys.executable), "-m", "aiperf", "profile",
        "--model", model, "--url", url, "--endpoint-type", "completions", "--streaming",
        "--concurrency", str(concurrency), "--request-count", str(2 * concurrency),
        *inputs,
        "--warmup-request-count", str(concurrency), "--use-server-token-count",
        "--tokenizer", tokenizer,
        "--workers-max", str(workers), "--ui", "none", "--artifact-dir", str(out),
    ]  # fmt: skip


def aiperf_token_id_payloads(
    path: Path, model: str, concurrency: int, in_len: int, out_len: int, temperature: float = 0.0
) -> Path:
    """AIPerf's inputs_json file of the bodies our client sends with token-id prompts
    (client.datasets.token_id_prompts: BOS then random ids, streamed, ignore_eos), one per
    request of aiperf_command's warm-up and timed requests (3 x concurrency)."""
    from client.datasets import token_id_prompts

    body = {"model": model, "max_tokens": out_len, "min_tokens": out_len, "ignore_eos": True,
            "temperature": temperature, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    items = token_id_prompts(3 * concurrency, in_len, out_len, seed=7)
    sessions = [
        {"session_id": f"s{i}", "payloads": [body | {"prompt": item.prompt}]}
        for i, item in enumerate(items)
    ]
    path.write_text(json.dumps({"data": sessions}))
    return path


def aiperf_level(
    url: str,
    model: str,
    tokenizer: str,
    concurrency: int,
    in_len: int,
    out_len: int,
    temperature: float = 0.0,
    token_ids: bool = False,
    **extra,
) -> dict:
    """One level through `aiperf profile` (aiperf_command); its artifacts are kept beside
    the logs and its figures emitted as `figure="aiperf"`. `token_ids`: our client's
    token-id bodies (aiperf_token_id_payloads) instead of AIPerf's synthetic text."""
    out = client_logs() / f"aiperf-c{concurrency}-{int(time.time())}"
    payloads = None
    if token_ids:
        out.mkdir(parents=True, exist_ok=True)
        payloads = aiperf_token_id_payloads(
            out / "inputs.json", model, concurrency, in_len, out_len, temperature
        )
    command = aiperf_command(
        url, model, tokenizer, concurrency, in_len, out_len, out, temperature, payloads
    )
    env = {
        k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    }
    return second_client_level("aiperf", command, env | AIPERF_NO_NETWORK,
                               out / "profile_export_aiperf.json", aiperf_figures,
                               concurrency, in_len, out_len, temperature=temperature,
                               prompts="token ids" if token_ids else "text", **extra)  # fmt: skip


def aiperf_figures(report: dict) -> dict:
    """guidellm_figures' keys from AIPerf's summary export (profile_export_aiperf.json):
    each metric a {unit, avg, p50, p99, ...} record over the successful requests. AIPerf's
    inter_token_latency is per request, (e2e - TTFT) / (tokens - 1): client.metrics' TPOT;
    its inter_chunk_latency, the gaps between streamed chunks, is client.metrics' ITL."""

    def stat(name: str, key: str) -> float | None:
        node = report.get(name)
        value = node.get(key) if isinstance(node, dict) else None
        return round(value, 3) if isinstance(value, (int, float)) else None

    ok = int(stat("request_count", "avg") or 0)
    errored = int(stat("error_request_count", "avg") or 0)
    return {
        "output_tok_s": stat("output_token_throughput", "avg"),
        "output_tokens": stat("total_output_tokens", "avg"),
        "prompt_tokens_p50": stat("input_sequence_length", "p50"),
        "ttft_ms_p50": stat("time_to_first_token", "p50"),
        "ttft_ms_p99": stat("time_to_first_token", "p99"),
        "itl_ms_p50": stat("inter_chunk_latency", "p50"),
        "itl_ms_p99": stat("inter_chunk_latency", "p99"),
        "tpot_ms_p50": stat("inter_token_latency", "p50"),
        "requests": {"successful": ok, "errored": errored, "total": ok + errored},
        "duration_s": stat("benchmark_duration", "avg"),
    }


# ---- structured output at batch speed: constrained vs plain chat streams ----

NESTED_SCHEMA = {
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "name": {"type": "string", "maxLength": 40},
        "owner": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "maxLength": 30},
                "address": {
                    "type": "object",
                    "properties": {
                        "city": {"type": "string", "maxLength": 30},
                        "zip": {"type": "string", "maxLength": 10},
                    },
                    "required": ["city", "zip"],
                },
            },
            "required": ["name", "address"],
        },
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 8},
    },
    "required": ["id", "name", "owner", "tags"],
}


def chat_timing(url: str, i: int, constrained: bool, max_tokens: int) -> dict:
    import requests

    body: dict = {
        "model": "model",
        "messages": [{"role": "user", "content": f"Describe item {i} as JSON."}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if constrained:
        body["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "item", "schema": NESTED_SCHEMA},
        }
    else:
        body["ignore_eos"] = True
    sent = time.perf_counter()
    first = last = None
    tokens, events = 0, 0
    with requests.post(url + "/v1/chat/completions", json=body, stream=True, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            event = json.loads(line[6:])
            if event.get("usage"):
                tokens = event["usage"]["completion_tokens"]
            if any((c.get("delta") or {}).get("content") for c in event.get("choices", [])):
                now = time.perf_counter()
                first = first or now
                last = now
                events += 1
    assert first is not None and last is not None, "no content streamed"
    return {"ttft": first - sent, "span": last - first, "tokens": tokens, "end": last}


def guided_level(url: str, n: int, constrained: bool, max_tokens: int) -> dict:
    from concurrent.futures import ThreadPoolExecutor

    t0 = time.perf_counter()
    with ThreadPoolExecutor(n) as pool:
        rows = list(pool.map(lambda i: chat_timing(url, i, constrained, max_tokens), range(n)))
    wall = time.perf_counter() - t0
    tpots = sorted(r["span"] / (r["tokens"] - 1) * 1000 for r in rows if r["tokens"] > 1)
    tokens = sum(r["tokens"] for r in rows)
    return {
        "tpot_ms_p50": round(tpots[len(tpots) // 2], 2),
        "tpot_ms_mean": round(sum(tpots) / len(tpots), 2),
        "tokens": tokens,
        "tokens_per_request_p50": sorted(r["tokens"] for r in rows)[n // 2],
        "ttft_ms_p50": round(sorted(r["ttft"] for r in rows)[n // 2] * 1000, 1),
        "output_tok_s": round(tokens / wall, 1),
        "wall_s": round(wall, 2),
    }


def guided_rounds(url: str, args) -> None:
    n = args.guided
    guided_level(url, n, True, 16)  # warm-up: the schema's compile, the graph buckets
    for r in range(args.guided_rounds):
        for constrained in (False, True):
            if time_left() < 20:
                emit(figure="skipped", variant="guided", why="out of time")
                return
            row = guided_level(url, n, constrained, args.guided_max_tokens)
            emit(figure="guided", round=r, streams=n, set=args.set,
                 format="json_schema (nested)" if constrained else "plain (ignore_eos)", **row)  # fmt: skip


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


# ---- a peer: transformers serve with continuous batching ----


def peer_bench(args) -> None:
    artifact = str(Path(args.dir).resolve())
    command = [
        sys.executable,
        str(Path(__file__).with_name("peer_serve.py")),
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


# ---- hashes: first start after a download vs later starts ----


def prepare_verify(args) -> None:
    """Write DIR's build manifest (hashing the shards in parallel), then check the
    artifact as the server does, twice, with verify_hashes on."""
    import hashlib
    from concurrent.futures import ThreadPoolExecutor

    from mistral_serving.artifacts.artifact import open_artifact
    from mistral_serving.artifacts.manifest import MANIFEST_NAME, BuildManifest, FileRecord
    from mistral_serving.settings import Settings

    artifact = Path(args.dir)

    def digest(path: Path) -> tuple[str, FileRecord]:
        h = hashlib.sha256()
        with path.open("rb") as f:
            while chunk := f.read(16 * 2**20):
                h.update(chunk)
        return path.name, FileRecord(size=path.stat().st_size, sha256=h.hexdigest())

    files = sorted(f for f in artifact.iterdir() if f.is_file() and f.name != MANIFEST_NAME)
    with ThreadPoolExecutor(8) as pool:
        records = dict(pool.map(digest, files))
    manifest = BuildManifest(kind="hf_checkpoint", source_model="random-weights", files=records)
    (artifact / MANIFEST_NAME).write_text(json.dumps(manifest.model_dump(mode="json"), indent=2))
    settings = Settings(artifact=str(artifact), verify_hashes=True, cache_dir=args.verify)
    for start in ("first (hashes every file, writes the marker)", "second (marker)"):
        cold = drop_page_cache()
        t = time.perf_counter()
        open_artifact(artifact, settings)
        emit(
            figure="artifact_check",
            start=start,
            seconds=round(time.perf_counter() - t, 2),
            page_cache_dropped=cold,
        )


def main() -> int:
    global OUT, DEADLINE, DROP_CACHE, ARTIFACT
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "step", choices=["make-artifact", "prepare-verify", "engine", "service", "peer"]
    )
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
    ap.add_argument("--long", action="store_true", help="also 1024 in / 256 out")
    ap.add_argument(
        "--long-concurrency", type=int, nargs="+", help="--long's levels (default: --concurrency)"
    )
    ap.add_argument("--repeat", type=int, default=1, help="engine: sweeps of the same engine")
    ap.add_argument("--guidellm", action="store_true", help="service: guidellm at each level too")
    ap.add_argument("--aiperf", action="store_true", help="service: AIPerf at each level too")
    ap.add_argument(
        "--aiperf-token-ids",
        action="store_true",
        help="service: AIPerf sends our client's token-id bodies, not its synthetic text",
    )
    ap.add_argument(
        "--packages",
        help="service: the serving packages the server imports (default: this repo's; "
        "another checkout's to compare two versions under one benchmark)",
    )
    ap.add_argument(
        "--temperature",
        type=float,
        help="service: sample at this temperature, both clients (unset: greedy)",
    )
    ap.add_argument("--guided", type=int, default=0, help="service: N constrained vs N plain")
    ap.add_argument("--guided-rounds", type=int, default=2)
    ap.add_argument("--guided-max-tokens", type=int, default=128)
    ap.add_argument("--gil-ab", action="store_true", help="engine: GIL switch 5 ms vs setting")
    ap.add_argument("--compare-loaders", action="store_true", help="engine: HF loader first")
    ap.add_argument("--correctness", action="store_true", help="engine: the fp32 check")
    ap.add_argument(
        "--verify",
        metavar="CACHE_DIR",
        help="prepare-verify/service: verify_hashes on, markers under CACHE_DIR",
    )
    ap.add_argument(
        "--text-levels",
        type=int,
        nargs="+",
        help="service/peer: concurrency levels with text prompts (the peer comparison)",
    )
    ap.add_argument(
        "--peer-flags", default="", help="peer: more `transformers serve` flags, one string"
    )
    ap.add_argument("--disk-test", action="store_true", help="time cold disk reads first")
    ap.add_argument("--start-only", action="store_true", help="service: time the start, stop")
    ap.add_argument(
        "--drop-page-cache",
        action="store_true",
        help="drop the OS page cache before a cold load (the device VM only)",
    )
    ap.add_argument(
        "--evict-artifact",
        action="store_true",
        help="before a cold load, evict only the artifact's pages (libraries stay cached)",
    )
    ap.add_argument("--deadline", type=float, help="unix time after which sweeps are skipped")
    args = ap.parse_args()
    OUT = Path(args.out) if args.out else None
    DEADLINE = args.deadline or float("inf")
    DROP_CACHE = "artifact" if args.evict_artifact else args.drop_page_cache
    ARTIFACT = args.dir
    steps = {
        "make-artifact": make_artifact,
        "prepare-verify": prepare_verify,
        "engine": engine_bench,
        "service": service_bench,
        "peer": peer_bench,
    }
    steps[args.step](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
