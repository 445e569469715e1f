"""Closed-loop HTTP load on the service: N workers, each sending streamed requests back to
back, over the OpenAI completions route with token-id prompts (exact input length).

    python tests/bench/load.py --url http://127.0.0.1:8080 --concurrency 1 16 64 256 \
        --input-len 128 --output-len 128 [--requests-per-worker 2] [--json out.jsonl]

Prints one JSON line per concurrency level: output tok/s, requests, TTFT / TPOT / ITL /
E2E percentiles (ms). Greedy (temperature 0), no stop strings; the count of output
tokens comes from the server's own usage figures (stream_options.include_usage).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import statistics
import sys
import time

import httpx


def prompts(n: int, length: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[1] + [rng.randrange(100, 31000) for _ in range(length - 1)] for _ in range(n)]


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return round(values[min(len(values) - 1, int(q * len(values)))] * 1000, 1)


async def one_request(client: httpx.AsyncClient, url: str, prompt: list[int], out_len: int):
    body = {
        "prompt": prompt,
        "max_tokens": out_len,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start = time.perf_counter()
    arrivals: list[float] = []
    usage = None
    async with client.stream("POST", url + "/v1/completions", json=body) as resp:
        if resp.status_code != 200:
            raise RuntimeError(f"HTTP {resp.status_code}: {(await resp.aread())[:300]!r}")
        # Split on b"\n" ourselves: httpx's aiter_lines() also splits on U+2028, U+0085
        # and friends, which JSON leaves raw inside strings (random-weight text has them).
        buf = b""
        async for data in resp.aiter_bytes():
            buf += data
            *lines, buf = buf.split(b"\n")
            now = time.perf_counter()
            for line in lines:
                if not line.startswith(b"data: ") or line == b"data: [DONE]":
                    continue
                event = json.loads(line[6:])
                if event.get("usage"):
                    usage = event["usage"]
                if any(c.get("text") for c in event.get("choices", [])):
                    arrivals.append(now)
    end = time.perf_counter()
    tokens = usage["completion_tokens"] if usage else len(arrivals)
    return start, arrivals, end, tokens


async def run_level(
    url: str, concurrency: int, in_len: int, out_len: int, per_worker: int, seed: int = 0
) -> dict:
    todo = prompts(concurrency * per_worker, in_len, seed)
    queue: asyncio.Queue = asyncio.Queue()
    for p in todo:
        queue.put_nowait(p)
    results = []
    limits = httpx.Limits(
        max_connections=concurrency + 8, max_keepalive_connections=concurrency + 8
    )
    async with httpx.AsyncClient(timeout=httpx.Timeout(None), limits=limits) as client:

        async def worker():
            while not queue.empty():
                results.append(await one_request(client, url, queue.get_nowait(), out_len))

        t0 = time.perf_counter()
        await asyncio.gather(*[worker() for _ in range(concurrency)])
        wall = time.perf_counter() - t0
    return summarize("service", concurrency, in_len, out_len, results, wall)


USAGE = re.compile(rb'"completion_tokens": ?(\d+)')
TEXT = re.compile(rb'"text": "[^"]')


async def raw_requests(port: int, concurrency: int, todo: list[list[int]], out_len: int):
    """The lean client: raw HTTP/1.1 over asyncio streams, one keep-alive connection per
    worker, no SSE parsing beyond finding the end and the usage (httpx spends ~100 us of
    client CPU per event, which caps one client process near 5,000-9,000 events/s)."""
    results = []

    async def worker():
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            while todo:
                body = json.dumps(
                    {
                        "prompt": todo.pop(),
                        "max_tokens": out_len,
                        "temperature": 0.0,
                        "stream": True,
                        "stream_options": {"include_usage": True},
                    }
                ).encode()
                start, arrivals = time.perf_counter(), []
                writer.write(
                    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                    b"Content-Type: application/json\r\nContent-Length: "
                    + str(len(body)).encode()
                    + b"\r\n\r\n"
                    + body
                )
                buf = b""
                while b"data: [DONE]" not in buf[-64:]:
                    data = await reader.read(65536)
                    if not data:
                        raise RuntimeError("connection closed")
                    if TEXT.search(data):  # a read holding some output text
                        arrivals.append(time.perf_counter())
                    buf = buf[-4096:] + data
                while not buf.endswith(b"0\r\n\r\n"):  # the chunked body's last chunk
                    buf += await reader.read(65536)
                results.append((start, arrivals, time.perf_counter(), int(USAGE.findall(buf)[-1])))
        finally:
            writer.close()

    await asyncio.gather(*[worker() for _ in range(concurrency)])
    return results


def _raw_proc(job):
    port, concurrency, todo, out_len, start_at = job
    time.sleep(max(0.0, start_at - time.time()))
    return asyncio.run(raw_requests(port, concurrency, todo, out_len))


def run_level_raw(
    port: int,
    concurrency: int,
    in_len: int,
    out_len: int,
    per_worker: int,
    procs: int = 4,
    seed: int = 0,
) -> dict:
    """`concurrency` workers spread over `procs` client processes (perf_counter is
    CLOCK_MONOTONIC, shared across processes, so their times line up)."""
    import multiprocessing

    todo = prompts(concurrency * per_worker, in_len, seed)
    procs = max(1, min(procs, concurrency))
    shares = [concurrency // procs + (i < concurrency % procs) for i in range(procs)]
    jobs, at = [], 0
    start_at = time.time() + 1.0
    for share in shares:
        jobs.append((port, share, todo[at : at + share * per_worker], out_len, start_at))
        at += share * per_worker
    with multiprocessing.get_context("fork").Pool(procs) as pool:
        results = [r for part in pool.map(_raw_proc, jobs) for r in part]
    wall = max(e for _, _, e, _ in results) - min(s for s, _, _, _ in results)
    return summarize("service", concurrency, in_len, out_len, results, wall)


def summarize(kind: str, concurrency: int, in_len: int, out_len: int, results, wall: float) -> dict:
    """results: (start, [token arrival times], end, n_tokens) per request."""
    ttft = [a[0] - s for s, a, e, n in results if a]
    e2e = [e - s for s, a, e, n in results]
    tpot = [(a[-1] - a[0]) / (n - 1) for s, a, e, n in results if a and n > 1]
    itl = [y - x for s, a, e, n in results for x, y in zip(a, a[1:])]
    tokens = sum(n for *_, n in results)
    return {
        "kind": kind,
        "concurrency": concurrency,
        "input_len": in_len,
        "output_len": out_len,
        "requests": len(results),
        "output_tokens": tokens,
        "wall_s": round(wall, 2),
        "output_tok_s": round(tokens / wall, 1),
        "ttft_ms_p50": pct(ttft, 0.5),
        "ttft_ms_p99": pct(ttft, 0.99),
        "tpot_ms_p50": pct(tpot, 0.5),
        "itl_ms_p50": pct(itl, 0.5),
        "itl_ms_p99": pct(itl, 0.99),
        "e2e_ms_p50": pct(e2e, 0.5),
        "mean_tpot_ms": round(statistics.mean(tpot) * 1000, 2) if tpot else None,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64, 256])
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--requests-per-worker", type=int, default=2)
    ap.add_argument("--json", help="append the result lines to this file")
    ap.add_argument(
        "--client",
        choices=["raw", "httpx"],
        default="raw",
        help="raw: lean HTTP over asyncio streams in --procs processes",
    )
    ap.add_argument("--procs", type=int, default=4)
    args = ap.parse_args()
    for c in args.concurrency:
        if args.client == "raw":
            port = int(args.url.rsplit(":", 1)[1].split("/")[0])
            row = run_level_raw(
                port, c, args.input_len, args.output_len, args.requests_per_worker, args.procs
            )
        else:
            row = asyncio.run(
                run_level(args.url, c, args.input_len, args.output_len, args.requests_per_worker)
            )
        line = json.dumps(row)
        print(line, flush=True)
        if args.json:
            with open(args.json, "a") as f:
                f.write(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
