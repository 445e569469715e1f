"""The short benchmark at the end of a kind's checks: `client.bench.run_bench`, or a minimal
timed loop where the client package is missing."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from mistral_build.verify import wire
from mistral_build.verify.checks import Context

BENCH_KEYS = (
    "completed",
    "failed",
    "duration_s",
    "request_throughput",
    "output_throughput",
    "mean_ttft_ms",
    "median_ttft_ms",
    "p99_ttft_ms",
    "mean_tpot_ms",
    "median_tpot_ms",
    "p99_itl_ms",
    "mean_e2el_ms",
)


def run_benchmark(ctx: Context, prompts: int) -> dict[str, Any]:
    """`client.bench.run_bench` (OpenAI completions, greedy, 128 in / 64 out) at
    concurrency 1 and `ctx.concurrency`; a minimal timed loop if the client is missing."""
    levels = sorted({1, ctx.concurrency})
    try:
        from client.bench import BenchConfig, run_bench
    except ImportError as exc:
        return minimal_bench(ctx, prompts, levels) | {"note": f"client.bench unavailable: {exc}"}
    cfg = BenchConfig(
        url=ctx.url,
        backend="openai",
        model=ctx.model,
        num_prompts=prompts,
        input_len=128,
        output_len=64,
        concurrency=levels,
        warmup=1,
        timeout=300,
        progress=False,
        report=False,
    )
    result = asyncio.run(run_bench(cfg))
    return {
        "tool": "client.bench.run_bench (openai completions, greedy, 128 in / 64 out)",
        "points": [
            {"concurrency": run["concurrency"]} | {k: run["metrics"].get(k) for k in BENCH_KEYS}
            for run in result["runs"]
        ],
    }


def minimal_bench(ctx: Context, prompts: int, levels: list[int]) -> dict[str, Any]:
    """Fallback: non-streamed completions timed end to end (no TTFT/ITL)."""
    points = []
    for level in levels:
        body = {"model": ctx.model, "max_tokens": 64, "temperature": 0, "prompt": "Tell a story"}

        def one(_: int, body: dict[str, Any] = body) -> int:
            tokens: int = wire.post_json(ctx.url, "/v1/completions", body)["usage"][
                "completion_tokens"
            ]
            return tokens

        started = time.monotonic()
        with ThreadPoolExecutor(level) as pool:
            tokens = sum(pool.map(one, range(prompts)))
        took = time.monotonic() - started
        points.append(
            {
                "concurrency": level,
                "completed": prompts,
                "duration_s": took,
                "request_throughput": prompts / took,
                "output_throughput": tokens / took,
            }
        )
    return {"tool": "minimal timed loop (non-streamed completions, 64 tokens)", "points": points}
