"""`python -m client bench`: load the server, measure it with vLLM's definitions.

Modes (one sweep per run):

* concurrency sweep (``--concurrency 1,4,16``): all requests are released at once and at
  most N are in flight (vLLM's ``--max-concurrency`` with an infinite request rate);
* request-rate sweep (``--request-rate 1,2,4``): arrivals are a gamma process with shape
  ``--burstiness`` (1 = Poisson), exactly vLLM's ``get_request``; ``--max-concurrency``
  optionally caps what is in flight;
* ``--one-at-a-time``: strictly sequential requests, the way the original article served.

Every request streams. Token counts: the OpenAI routes are asked for
``stream_options.include_usage`` and give exact ``prompt_tokens``/``completion_tokens``.
The predict route's stream is text only, so after each sweep point (off the clock) every
request is replayed once without streaming, with the same greedy sampling and seed; when
the replay's text equals the streamed text its ``usage`` is the request's exact count
(``output_tokens_source: "replay"``), otherwise the number of text chunks is used and the
record says ``"chunks"``. The predict route is driven with ``streaming_interval=1`` so
each chunk is one step of generation and ITL is per token.

Transports: ``httpx`` (default; full parsing, keeps the text) or ``raw`` (OpenAI routes
only: HTTP/1.1 over asyncio streams, no text kept, optionally spread over
``--client-procs`` processes), for servers that stream faster than one httpx process reads.

Results go to ``--out`` (default ``bench/results/<time>``): results.json (with the host's CPUs,
load average before and after, versions and git commit) and a plot. Overlay runs with
``python -m client bench plot RUN.json OTHER.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import random
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from client.client import DEFAULT_URL, AsyncClient
from client.datasets import (
    PromptItem,
    fit_length,
    load_prompts,
    synthetic_prompts,
    token_id_prompts,
)
from client.errors import ClientError, unreachable_hint
from client.helpformat import HelpFormatter
from client.hostinfo import HostMonitor
from client.metrics import RequestTiming, compute_metrics, parse_slos
from client.protocol import build_request
from client.rawhttp import RawPool
from client.types import Api, SamplingParams

DEFAULT_OUT_ROOT = Path("bench") / "results"


@dataclass
class BenchConfig:
    url: str = DEFAULT_URL
    backend: Api = "predict"
    model: str | None = None
    label: str | None = None
    chat: bool = False
    dataset: str | None = None
    prompt_ids: bool = False
    num_prompts: int = 50
    input_len: int = 128
    output_len: int = 128
    concurrency: list[int] = field(default_factory=lambda: [1])
    request_rate: list[float] | None = None
    burstiness: float = 1.0
    max_concurrency: int | None = None
    one_at_a_time: bool = False
    warmup: int = 2
    seed: int = 0
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    streaming_interval: int = 1
    slos: dict[str, float] = field(default_factory=dict)
    percentiles: list[float] = field(default_factory=lambda: [50.0, 90.0, 99.0])
    token_count: str = "replay"
    transport: str = "httpx"
    client_procs: int = 1
    timeout: float = 600.0
    retries: int = 0
    ready_timeout: float = 0.0
    server_pid: int | None = None
    out: str | None = None
    progress: bool = True
    report: bool = True  # print each point's table on stdout
    # Added to every request's JSON body (OpenAI routes): response_format, tools, ignore_eos.
    extra_body: dict[str, Any] | None = None

    def validate(self) -> None:
        """Refuse combinations that cannot work, with the reason (before any request)."""
        if self.burstiness <= 0:
            raise ValueError("--burstiness must be positive")
        if self.num_prompts < 1:
            raise ValueError("--num-prompts must be at least 1")
        if any(c < 1 for c in self.concurrency):
            raise ValueError("--concurrency levels must be at least 1")
        if self.transport not in ("httpx", "raw"):
            raise ValueError("--transport must be httpx or raw")
        if self.transport == "raw" and self.backend != "openai":
            raise ValueError(
                "--transport raw reads usage from the OpenAI routes' SSE: use --backend openai"
            )
        if self.client_procs < 1:
            raise ValueError("--client-procs must be at least 1")
        if self.client_procs > 1 and (self.transport != "raw" or self.request_rate):
            raise ValueError("--client-procs needs --transport raw and a concurrency sweep")
        if self.extra_body is not None and self.backend != "openai":
            raise ValueError("--extra-body is for the OpenAI routes: use --backend openai")
        if self.prompt_ids and (self.backend != "openai" or self.chat or self.dataset):
            raise ValueError(
                "--prompt-ids sends token ids to /v1/completions: needs --backend openai, "
                "no --chat, no --dataset"
            )


@dataclass
class Point:
    label: str
    mode: str
    concurrency: int | None
    request_rate: float | None
    burstiness: float | None


def sampling_for(cfg: BenchConfig, item: PromptItem) -> SamplingParams:
    """Deterministic by default: greedy (top_k=1 on predict, temperature 0 on OpenAI
    servers, as vLLM's benchmark sends) with a fixed seed."""
    out_len = item.output_len or cfg.output_len
    if cfg.backend == "predict":
        return SamplingParams(
            max_new_tokens=out_len,
            temperature=cfg.temperature,
            top_k=cfg.top_k if cfg.top_k is not None else 1,
            top_p=cfg.top_p,
            seed=cfg.seed,
            streaming_interval=cfg.streaming_interval,
        )
    return SamplingParams(
        max_new_tokens=out_len,
        temperature=cfg.temperature if cfg.temperature is not None else 0.0,
        top_k=cfg.top_k,
        top_p=cfg.top_p,
        seed=cfg.seed,
    )


def arrival_gaps(n: int, rate: float, burstiness: float, rng: random.Random) -> list[float]:
    """Seconds to wait before each of n requests: vLLM's ``get_request``. The first goes
    at once; each gap after it is Gamma(shape=burstiness, scale=1/(rate*burstiness)), so
    the mean rate is ``rate`` and burstiness 1 is a Poisson process."""
    if rate <= 0 or burstiness <= 0:
        raise ValueError("rate and burstiness must be positive")
    if rate == float("inf"):
        return [0.0] * n
    theta = 1.0 / (rate * burstiness)
    return [0.0] + [rng.gammavariate(burstiness, theta) for _ in range(max(0, n - 1))]


def _what_was_sent(item: PromptItem) -> Any:
    return item.prompt if item.prompt is not None else item.messages


def _failed(record: RequestTiming, start: float, exc: Exception) -> RequestTiming:
    record.latency = time.perf_counter() - start
    record.error = f"{type(exc).__name__}: {exc}"
    return record


async def timed_request(
    client: AsyncClient, cfg: BenchConfig, item: PromptItem, index: int, run_start: float
) -> RequestTiming:
    """One streamed request over httpx, timed the way vLLM's request functions time it."""
    record = RequestTiming(index=index, prompt=_what_was_sent(item))
    sampling = sampling_for(cfg, item)
    start = time.perf_counter()
    record.start = start - run_start
    pieces: list[str] = []
    try:
        stream = await client.stream(
            item.prompt, messages=item.messages, sampling=sampling, extra=cfg.extra_body
        )
        last = start
        async for piece in stream:
            now = time.perf_counter()
            if not pieces:
                record.ttft = now - start
            else:
                record.itl.append(now - last)
            last = now
            pieces.append(piece)
        record.latency = time.perf_counter() - start
        if not pieces:
            record.ttft = record.latency  # nothing streamed: the answer's end is its first byte
        record.generated_text = "".join(pieces)
        record.chunks = len(pieces)
        record.finish_reason = stream.finish_reason
        if stream.usage is not None:
            record.prompt_tokens = stream.usage.prompt_tokens
            record.output_tokens = stream.usage.completion_tokens
            record.output_tokens_source = "usage"
        else:
            record.output_tokens = len(pieces)
            record.output_tokens_source = "chunks"
        record.success = True
    except Exception as exc:  # noqa: BLE001 - a benchmark records every failure and goes on
        return _failed(record, start, exc)
    return record


async def timed_raw_request(
    pool: RawPool, cfg: BenchConfig, item: PromptItem, index: int, run_start: float, model: str
) -> RequestTiming:
    """One streamed request over the raw transport: arrival times and usage, no text."""
    spec = build_request(
        "openai",
        prompt=item.prompt,
        messages=item.messages,
        sampling=sampling_for(cfg, item),
        stream=True,
        model=model,
        extra=cfg.extra_body,
    )
    start = time.perf_counter()
    try:
        res = await pool.post_stream(spec.path, spec.body)
    except Exception as exc:  # noqa: BLE001 - recorded, as above
        record = RequestTiming(index=index, prompt=_what_was_sent(item), start=start - run_start)
        return _failed(record, start, exc)
    record = RequestTiming.from_times(
        index,
        res.start,
        res.arrivals,
        res.end,
        res.completion_tokens,
        run_start=run_start,
        prompt_tokens=res.prompt_tokens,
    )
    record.finish_reason = res.finish_reason
    record.prompt = _what_was_sent(item)
    return record


Send = Callable[[PromptItem, int, float], Awaitable[RequestTiming]]


async def run_point(
    send: Send,
    cfg: BenchConfig,
    items: Sequence[PromptItem],
    point: Point,
    indices: Sequence[int] | None = None,
    run_start: float | None = None,
) -> tuple[list[RequestTiming], float]:
    """Send every item under the point's load; return the records and the run's duration."""
    progress = tqdm(
        total=len(items),
        desc=point.label,
        disable=not cfg.progress,
        file=sys.stderr,
        mininterval=0.5,
        leave=True,
    )
    limit = point.concurrency if point.mode != "rate" else cfg.max_concurrency
    sem = asyncio.Semaphore(limit) if limit else None
    numbers = list(indices) if indices is not None else list(range(len(items)))

    async def one(i: int, item: PromptItem, start: float) -> RequestTiming:
        if sem is None:
            record = await send(item, i, start)
        else:
            async with sem:
                record = await send(item, i, start)
        progress.update(1)
        return record

    start = time.perf_counter() if run_start is None else run_start
    try:
        if point.mode == "sequential":
            records = [await one(i, item, start) for i, item in zip(numbers, items, strict=True)]
        else:
            gaps = (
                arrival_gaps(
                    len(items), point.request_rate, cfg.burstiness, random.Random(cfg.seed)
                )
                if point.mode == "rate" and point.request_rate
                else [0.0] * len(items)
            )
            tasks: list[asyncio.Task[RequestTiming]] = []
            for gap, i, item in zip(gaps, numbers, items, strict=True):
                if gap > 0:
                    await asyncio.sleep(gap)
                tasks.append(asyncio.create_task(one(i, item, start)))
            records = list(await asyncio.gather(*tasks))
    finally:
        progress.close()
    return records, time.perf_counter() - start


def _raw_process(job: tuple[Any, ...]) -> list[RequestTiming]:
    """One client process of a multi-process raw run (runs after fork)."""
    cfg, model, point, pairs, run_start = job
    # perf_counter is CLOCK_MONOTONIC, shared by every process, so all share one start.
    time.sleep(max(0.0, run_start - time.perf_counter()))

    async def go() -> list[RequestTiming]:
        pool = RawPool(cfg.url)
        try:

            async def send(item: PromptItem, i: int, start: float) -> RequestTiming:
                return await timed_raw_request(pool, cfg, item, i, start, model)

            indices = [i for i, _ in pairs]
            records, _ = await run_point(
                send, cfg, [it for _, it in pairs], point, indices, run_start
            )
            return records
        finally:
            pool.close()

    return asyncio.run(go())


def run_point_in_processes(
    cfg: BenchConfig, model: str, items: Sequence[PromptItem], point: Point
) -> tuple[list[RequestTiming], float]:
    """The point's concurrency spread over ``cfg.client_procs`` raw-transport processes."""
    procs = max(1, min(cfg.client_procs, point.concurrency or 1, len(items)))
    total = point.concurrency or 1
    quiet = BenchConfig(**{**asdict(cfg), "progress": False})
    run_start = time.perf_counter() + 1.0  # time for the processes to start
    jobs = []
    for p in range(procs):
        share = total // procs + (p < total % procs)
        pairs = [(i, items[i]) for i in range(p, len(items), procs)]
        sub = Point(point.label, point.mode, share, None, None)
        jobs.append((quiet, model, sub, pairs, run_start))
    with multiprocessing.get_context("fork").Pool(procs) as pool:
        parts = pool.map(_raw_process, jobs)
    records = sorted((r for part in parts for r in part), key=lambda r: r.index)
    duration = max(r.start + r.latency for r in records)
    return records, duration


async def replay_counts(
    client: AsyncClient,
    cfg: BenchConfig,
    items: Sequence[PromptItem],
    records: list[RequestTiming],
    parallel: int,
) -> None:
    """Predict route: exact token counts from a non-streaming replay of each request."""
    sem = asyncio.Semaphore(max(1, parallel))

    async def one(item: PromptItem, record: RequestTiming) -> None:
        if not record.success:
            return
        sampling = sampling_for(cfg, item)
        async with sem:
            try:
                done = await client.predict(item.prompt, messages=item.messages, sampling=sampling)
            except ClientError as exc:
                record.error = f"replay failed ({exc}); output_tokens counted from chunks"
                return
        if done.usage is None:
            return
        record.prompt_tokens = done.usage.prompt_tokens
        if done.output == record.generated_text:
            record.output_tokens = done.usage.completion_tokens
            record.output_tokens_source = "replay"
            record.finish_reason = record.finish_reason or done.finish_reason
        else:
            record.error = "replay text differs from the stream; output_tokens counted from chunks"

    await asyncio.gather(*(one(i, r) for i, r in zip(items, records, strict=True)))


def sweep_points(cfg: BenchConfig) -> list[Point]:
    if cfg.one_at_a_time:
        return [Point("one-at-a-time", "sequential", 1, None, None)]
    if cfg.request_rate:
        return [
            Point(f"rate={r:g}/s", "rate", cfg.max_concurrency, r, cfg.burstiness)
            for r in cfg.request_rate
        ]
    return [Point(f"concurrency={c}", "concurrency", c, None, None) for c in cfg.concurrency]


async def prepare_prompts(
    client: AsyncClient, cfg: BenchConfig
) -> tuple[list[PromptItem], dict[str, Any]]:
    rng = random.Random(cfg.seed)
    if cfg.prompt_ids:
        items = token_id_prompts(cfg.num_prompts, cfg.input_len, cfg.output_len, cfg.seed)
        return items, {"source": "token ids", "input_len": cfg.input_len}
    if cfg.dataset:
        pool = load_prompts(cfg.dataset, chat=cfg.chat)
        items = [pool[i % len(pool)] for i in range(cfg.num_prompts)]
        return items, {"source": cfg.dataset}

    async def count_tokens(text: str) -> int:
        kw: dict[str, Any] = (
            {"messages": [{"role": "user", "content": text}]} if cfg.chat else {"prompt": text}
        )
        done = await client.predict(**kw, sampling=SamplingParams(max_new_tokens=1, seed=cfg.seed))
        if done.usage is None:
            raise ClientError("the server sent no usage; cannot size synthetic prompts")
        return done.usage.prompt_tokens

    fit = await fit_length(count_tokens, cfg.input_len, rng)
    items = synthetic_prompts(cfg.num_prompts, fit, cfg.input_len, cfg.output_len, rng, cfg.chat)
    return items, {
        "source": "synthetic",
        "words": fit.words_for(cfg.input_len),
        "fit_overhead_tokens": fit.overhead,
        "fit_tokens_per_word": fit.per_word,
    }


def format_report(label: str, m: dict[str, Any]) -> str:
    """A text table in the layout of vLLM's benchmark_serving output."""

    def f(v: Any, spec: str = ".2f") -> str:
        return "n/a" if v is None else format(v, spec)

    lines = [
        f"{' ' + label + ' ':=^56}",
        f"{'Successful requests:':<40} {m['completed']}",
        f"{'Failed requests:':<40} {m['failed']}",
        f"{'Benchmark duration (s):':<40} {f(m['duration_s'])}",
        f"{'Total input tokens:':<40} {m['total_input_tokens']}",
        f"{'Total generated tokens:':<40} {m['total_output_tokens']}",
        f"{'Request throughput (req/s):':<40} {f(m['request_throughput'])}",
        f"{'Output token throughput (tok/s):':<40} {f(m['output_throughput'])}",
        f"{'Total token throughput (tok/s):':<40} {f(m['total_token_throughput'])}",
    ]
    if m.get("request_goodput") is not None:
        lines.append(f"{'Request goodput (req/s):':<40} {f(m['request_goodput'])}")
    titles = {
        "ttft": "Time to First Token",
        "tpot": "Time per Output Token (excl. 1st token)",
        "itl": "Inter-token Latency",
        "e2el": "End-to-end Latency",
    }
    for key, title in titles.items():
        lines.append(f"{' ' + title + ' ':-^56}")
        for stat in ("mean", "median", "p90", "p99"):
            name = f"{stat}_{key}_ms"
            if name in m:
                shown = stat.capitalize() if stat in ("mean", "median") else stat.upper()
                lines.append(f"{shown + ' ' + key.upper() + ' (ms):':<40} {f(m[name])}")
    lines.append("=" * 56)
    return "\n".join(lines)


def default_label(cfg: BenchConfig, model: str | None) -> str:
    """What the plot legend calls this run: the server (route and model) and its URL."""
    name = cfg.backend if cfg.backend == "predict" else f"openai {model or '?'}"
    return f"{name} @ {cfg.url}"


Checkpoint = Callable[[dict[str, Any]], None]


def estimate_seconds(points: Sequence[Point], num_prompts: int, per_request_s: float) -> float:
    """Rough duration of a sweep from one request's time: each concurrency level runs its
    prompts in ceil(n / concurrency) waves (batching makes a wave cost more than one
    request, rate levels are paced: both make this a lower bound)."""
    total = 0.0
    for p in points:
        if p.mode == "rate" and p.request_rate:
            total += num_prompts / p.request_rate + per_request_s
        else:
            total += -(-num_prompts // max(1, p.concurrency or 1)) * per_request_s
    return total


async def run_bench(cfg: BenchConfig, checkpoint: Checkpoint | None = None) -> dict[str, Any]:
    """The whole sweep; ``checkpoint`` gets the results so far after every level (with
    ``complete`` false until the last one), so an interrupted run keeps what it measured."""
    cfg.validate()
    monitor = HostMonitor(cfg.server_pid)
    points = sweep_points(cfg)
    max_in_flight = max([p.concurrency or 0 for p in points] + [cfg.max_concurrency or 0, 1])
    raw = RawPool(cfg.url) if cfg.transport == "raw" else None
    async with AsyncClient(
        cfg.url,
        timeout=cfg.timeout,
        retries=cfg.retries,
        api=cfg.backend,
        model=cfg.model,
        max_connections=max(64, max_in_flight * 2),
    ) as client:
        if cfg.ready_timeout > 0:
            await client.wait_until_ready(cfg.ready_timeout)
        await client.resolve_model()
        model = client.model or "model"

        async def send(item: PromptItem, i: int, start: float) -> RequestTiming:
            if raw is not None:
                return await timed_raw_request(raw, cfg, item, i, start, model)
            return await timed_request(client, cfg, item, i, start)

        try:
            items, prompt_info = await prepare_prompts(client, cfg)
            if cfg.warmup > 0:
                await _warm_up(send, cfg, items, points, max_in_flight)
            runs: list[dict[str, Any]] = []
            for point in points:
                if raw is not None and cfg.client_procs > 1 and point.mode != "rate":
                    records, duration = run_point_in_processes(cfg, model, items, point)
                else:
                    records, duration = await run_point(send, cfg, items, point)
                if cfg.backend == "predict" and cfg.token_count == "replay":
                    await replay_counts(client, cfg, items, records, point.concurrency or 16)
                runs.append(_level_results(cfg, point, records, duration))
                if cfg.report:
                    print(format_report(point.label, runs[-1]["metrics"]), flush=True)
                if checkpoint is not None:
                    checkpoint(_results(cfg, client.model, prompt_info, monitor, runs, False))
        finally:
            if raw is not None:
                raw.close()
    return _results(cfg, client.model, prompt_info, monitor, runs, True)


async def _warm_up(
    send: Send,
    cfg: BenchConfig,
    items: Sequence[PromptItem],
    points: Sequence[Point],
    max_in_flight: int,
) -> None:
    """The unmeasured warm-up requests: a ClientError if every one failed; with progress
    on, the sweep's estimated duration from the slowest."""
    warm = Point("warmup", "concurrency", min(cfg.warmup, max_in_flight), None, None)
    warm_records, _ = await run_point(send, cfg, items[: cfg.warmup] or items[:1], warm)
    failed = [r.error for r in warm_records if not r.success]
    if len(failed) == len(warm_records):
        raise ClientError(f"every warm-up request failed: {failed[0]}")
    took = [r.latency for r in warm_records if r.success and r.latency]
    if took and cfg.progress:
        guess = estimate_seconds(points, cfg.num_prompts, max(took))
        print(
            f"{len(points)} level(s) x {cfg.num_prompts} requests; estimate: at "
            f"least {_duration(guess)} (a warm-up request took {max(took):.1f} s)",
            file=sys.stderr,
            flush=True,
        )


def _level_results(
    cfg: BenchConfig, point: Point, records: list[RequestTiming], duration: float
) -> dict[str, Any]:
    """One level's entry of `runs`: the point, its metrics (with where each successful
    request's output token count came from) and every request."""
    metrics = compute_metrics(records, duration, cfg.slos, cfg.percentiles)
    sources: dict[str, int] = {}
    for r in records:
        if r.success:
            key = r.output_tokens_source
            sources[key] = sources.get(key, 0) + 1
    metrics["output_tokens_sources"] = sources
    return {**asdict(point), "metrics": metrics, "requests": [r.to_dict() for r in records]}


def _results(
    cfg: BenchConfig,
    model: str | None,
    prompt_info: dict[str, Any],
    monitor: HostMonitor,
    runs: list[dict[str, Any]],
    complete: bool,
) -> dict[str, Any]:
    return {
        "label": cfg.label or default_label(cfg, model),
        "config": asdict(cfg),
        "model": model,
        "prompts": prompt_info,
        "host": monitor.finish().to_dict(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "complete": complete,
        "levels_planned": len(sweep_points(cfg)),
        "runs": list(runs),
    }


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def closed_loop_level(
    url: str,
    concurrency: int,
    input_len: int,
    output_len: int,
    per_worker: int,
    transport: str = "raw",
    client_procs: int = 1,
    temperature: float | None = None,
) -> dict[str, Any]:
    """One closed-loop level as the GPU and replay benchmarks run it: streamed
    /v1/completions with exact-length token-id prompts, greedy unless `temperature`,
    `per_worker` requests per worker; `run_bench`'s results (one run)."""
    cfg = BenchConfig(
        url=url,
        backend="openai",
        prompt_ids=True,
        num_prompts=concurrency * per_worker,
        input_len=input_len,
        output_len=output_len,
        concurrency=[concurrency],
        warmup=0,
        temperature=temperature,
        transport=transport,
        client_procs=client_procs if transport == "raw" else 1,
        progress=False,
        report=False,
    )
    return asyncio.run(run_bench(cfg))


def default_out_dir(root: Path = DEFAULT_OUT_ROOT) -> Path:
    """bench/results/<UTC time>: every run keeps its results (ignored by git)."""
    return root / time.strftime("%Y%m%d-%H%M%S", time.gmtime())


def write_results(results: dict[str, Any], out_dir: str | Path, plot: bool = True) -> list[Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "results.json"
    tmp = path.with_suffix(".json.tmp")  # never a half-written results.json
    tmp.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    tmp.replace(path)
    if not plot or not results["runs"]:
        return [path]
    from client.plots import plot_runs

    return [path, plot_runs([results], out / "latency_vs_throughput.png")]


def _csv(kind: type, text: str) -> list[Any]:
    try:
        return [kind(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError as exc:
        raise ValueError(f"bad list {text!r}: {exc}") from exc


def add_arguments(p: argparse.ArgumentParser) -> None:
    # Kept whole: one flat list of option registrations, in the order --help shows them.
    p.add_argument("--url", default=DEFAULT_URL, help="server base URL")
    p.add_argument(
        "--backend",
        choices=["predict", "openai"],
        default="predict",
        help="predict: our Truss route; openai: /v1/completions (or chat) of any "
        "OpenAI-compatible server (ours, trtllm-serve, vLLM)",
    )
    p.add_argument("--model", help="model name for OpenAI servers (unset: first of GET /v1/models)")
    p.add_argument("--label", help="the run's name in plot legends (unset: route, model and URL)")
    p.add_argument("--chat", action="store_true", help="send prompts as chat messages")
    prompts = p.add_mutually_exclusive_group()
    prompts.add_argument(
        "--dataset", help="prompt file: one prompt per line, or JSONL with prompt/messages"
    )
    prompts.add_argument(
        "--prompt-ids",
        action="store_true",
        help="prompts of exactly --input-len random token ids (OpenAI completions only)",
    )
    p.add_argument("--num-prompts", type=int, default=50, help="requests per sweep point")
    p.add_argument(
        "--input-len", type=int, default=128, help="synthetic prompt length in server tokens"
    )
    p.add_argument("--output-len", type=int, default=128, help="max new tokens per request")
    load = p.add_mutually_exclusive_group()
    load.add_argument("--concurrency", default="1", help="comma list of in-flight limits")
    load.add_argument("--request-rate", help="comma list of requests/s (gamma/Poisson arrivals)")
    load.add_argument(
        "--one-at-a-time",
        action="store_true",
        help="strictly sequential requests (the article's way of serving)",
    )
    p.add_argument(
        "--burstiness",
        type=float,
        default=1.0,
        help="gamma shape of inter-arrival times: 1 Poisson, <1 burstier, >1 steadier",
    )
    p.add_argument("--max-concurrency", type=int, help="cap on in-flight requests in rate mode")
    p.add_argument("--warmup", type=int, default=2, help="warm-up requests before measuring")
    p.add_argument("--seed", type=int, default=0, help="sampling and prompt seed")
    p.add_argument("--temperature", type=float, help="unset: greedy")
    p.add_argument("--top-k", type=int, help="unset: 1 on the predict route")
    p.add_argument("--top-p", type=float, help="unset: the server's default")
    p.add_argument(
        "--streaming-interval", type=int, default=1, help="tokens per chunk (predict route)"
    )
    p.add_argument(
        "--slo",
        nargs="*",
        default=[],
        metavar="NAME:MS",
        help="goodput SLOs, also drawn on the plot: --slo ttft:500 tpot:50 (ttft, tpot, e2el)",
    )
    p.add_argument("--percentiles", default="50,90,99", help="comma list of percentiles")
    p.add_argument(
        "--token-count",
        choices=["replay", "chunks"],
        default="replay",
        help="predict route: exact counts from a non-streaming replay, "
        "or the number of streamed chunks",
    )
    p.add_argument(
        "--transport",
        choices=["httpx", "raw"],
        default="httpx",
        help="raw: lean HTTP/1.1 client for fast servers (OpenAI routes, no text kept)",
    )
    p.add_argument(
        "--client-procs",
        type=int,
        default=1,
        help="raw transport: client processes sharing each concurrency level",
    )
    p.add_argument(
        "--extra-body",
        metavar="JSON",
        help="a JSON object (or @FILE holding one) added to every request's body, e.g. "
        "response_format or tools and tool_choice (OpenAI routes; the raw transport also "
        "times streamed tool-call arguments)",
    )
    p.add_argument("--timeout", type=float, default=600.0, help="seconds of silence allowed")
    p.add_argument("--retries", type=int, default=0, help="retries per request")
    p.add_argument(
        "--wait-ready",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="first wait up to this long for GET /v1/models/model to answer 200",
    )
    p.add_argument(
        "--server-pid",
        type=int,
        help="a server on this machine: its CPU use is not taken for competing load",
    )
    p.add_argument(
        "--out", help="directory for results.json and the plot (unset: bench/results/<time>)"
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")


def _extra_body(text: str | None) -> dict[str, Any] | None:
    if text is None:
        return None
    if text.startswith("@"):
        text = Path(text[1:]).read_text(encoding="utf-8")
    try:
        body = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"--extra-body: not JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise ValueError("--extra-body: need a JSON object")
    return body


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    cfg = BenchConfig(
        url=args.url,
        backend=args.backend,
        model=args.model,
        label=args.label,
        chat=args.chat,
        dataset=args.dataset,
        prompt_ids=args.prompt_ids,
        num_prompts=args.num_prompts,
        input_len=args.input_len,
        output_len=args.output_len,
        concurrency=_csv(int, args.concurrency or "1"),
        request_rate=_csv(float, args.request_rate) if args.request_rate else None,
        burstiness=args.burstiness,
        max_concurrency=args.max_concurrency,
        one_at_a_time=args.one_at_a_time,
        warmup=args.warmup,
        seed=args.seed,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        streaming_interval=args.streaming_interval,
        slos=parse_slos(args.slo),
        percentiles=_csv(float, args.percentiles),
        token_count=args.token_count,
        transport=args.transport,
        client_procs=args.client_procs,
        timeout=args.timeout,
        retries=args.retries,
        ready_timeout=args.wait_ready,
        server_pid=args.server_pid,
        out=args.out,
        progress=not args.no_progress,
        extra_body=_extra_body(args.extra_body),
    )
    cfg.validate()
    return cfg


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "plot":
        from client.plots import main as plot_main

        return plot_main(argv[1:])
    p = argparse.ArgumentParser(
        prog="python -m client bench",
        description=__doc__,
        formatter_class=HelpFormatter,
        epilog="python -m client bench plot --help: overlay the plots of several runs",
    )
    add_arguments(p)
    args = p.parse_args(argv)
    try:
        cfg = config_from_args(args)
    except ValueError as exc:
        p.error(str(exc))
    if cfg.dataset:
        try:  # read before any request: a bad line is one line, not a traceback mid-run
            load_prompts(cfg.dataset, chat=cfg.chat)
        except (OSError, ValueError) as exc:
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            if not why.startswith(cfg.dataset):  # load_prompts' own words name file and line
                why = f"{cfg.dataset}: {why}"
            print(f"error: --dataset {why.splitlines()[0]}", file=sys.stderr)
            return 2
    out = Path(cfg.out) if cfg.out else default_out_dir()
    so_far: list[dict[str, Any]] = []

    def checkpoint(partial: dict[str, Any]) -> None:
        so_far[:] = [partial]
        write_results(partial, out, plot=False)

    try:
        results = asyncio.run(run_bench(cfg, checkpoint))
    except (ClientError, KeyboardInterrupt) as exc:
        if so_far:
            done = len(so_far[0]["runs"])
            for path in write_results(so_far[0], out):
                print(
                    f"wrote {path} ({done} of {so_far[0]['levels_planned']} levels)",
                    file=sys.stderr,
                )
        if isinstance(exc, KeyboardInterrupt):
            print("interrupted", file=sys.stderr)
            return 130
        print(f"error: {exc}{unreachable_hint(exc)}", file=sys.stderr)
        return 1
    for path in write_results(results, out):
        print(f"wrote {path}", file=sys.stderr)
    warning = results["host"].get("warning")
    if warning:
        print(f"WARNING: {warning}", file=sys.stderr)
    return 0
