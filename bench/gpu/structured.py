"""Structured output through the server: N concurrent chat streams constrained by a
nested-object json_schema against N plain ones (`gpu_bench.py service --guided N`)."""

from __future__ import annotations

import json
import time

from bench.gpu.common import emit, time_left

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
