"""Structured output through the server: N concurrent chat streams constrained by a
nested-object json_schema against N plain ones (`gpu_bench.py service --guided N`)."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

from bench.gpu.common import emit, time_left

# The engine's timers (mistral_gpu_fallback/static/guided_profile.py): the server is
# started with this variable set when the suite runs.
PROFILE_ENV = "GUIDED_PROFILE_OUT"

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


# ---- the schema suite (bench/schemas/, `gpu_bench.py service --suite`) ----

SUITE_MODES = ("plain", "schema", "tool")
TEXT = re.compile(rb'"(?:content|arguments)": ?"[^"]')  # a streamed chunk with text
PROMPT = "Record {i}: answer with one JSON document, nothing else."


def suite_body(mode: str, schema: dict | None, max_tokens: int) -> dict:
    """The body fields of one suite mode: plain (ignore_eos: the full max_tokens), the
    schema as `response_format`, or as the parameters of one function with
    tool_choice=required (the server constrains the call list: grammar.tool_call_schema)."""
    if mode == "plain":
        return {"ignore_eos": True}
    assert schema is not None
    if mode == "schema":
        return {"response_format": {"type": "json_schema",
                                    "json_schema": {"name": "record", "schema": schema}}}  # fmt: skip
    tool = {"type": "function", "function": {"name": "record", "description": "Store the record.",
                                             "parameters": schema}}  # fmt: skip
    return {"tools": [tool], "tool_choice": "required"}


def read_profile(path: Path | None) -> dict:
    """The engine's GUIDED_PROFILE_OUT totals (guided_profile.py), or empty."""
    try:
        return json.loads(path.read_text()) if path else {}
    except (OSError, ValueError):
        return {}


def profile_figures(before: dict, after: dict) -> dict:
    """Where the time of the steps between two reads went, per decode step (ms) of a
    constrained batch, beside the plain steps' wall time in the same window."""
    if not after:
        return {}

    def delta(kind: str, name: str) -> float:
        return after.get(kind, {}).get(name, 0) - before.get(kind, {}).get(name, 0)

    out: dict = {}
    for kind in ("constrained", "plain"):
        steps = delta("counts", f"step_{kind}")
        if steps:
            out[f"step_{kind}_ms"] = round(delta("seconds", f"step_{kind}") / steps * 1e3, 3)
            out[f"rows_{kind}_mean"] = round(delta("counts", f"rows_{kind}") / steps, 1)
            out[f"steps_{kind}"] = int(steps)
    steps = delta("counts", "step_constrained")
    if steps:
        for part in ("fill", "h2d", "apply", "accept", "rowmask", "sample"):
            out[f"{part}_ms_per_step"] = round(delta("seconds", part) / steps * 1e3, 3)
        out["fallback_rows"] = int(delta("counts", "fallback_rows"))
        out["steps_overlap_lost"] = int(delta("counts", "steps_overlap_lost"))
    return out


def suite_point(url: str, args, level: int, mode: str, name: str, schema: dict | None,
                profile: Path | None, figure: str = "suite") -> dict:  # fmt: skip
    """One point through `python -m client bench`'s code: `level` chat streams, 2
    requests each, the mode's body fields, the raw transport; its row with the engine's
    profile over it."""
    import asyncio

    from bench.gpu.common import level_row
    from client.bench import BenchConfig, run_bench

    n = 2 * level
    data = client_data() / f"suite-prompts-{n}.jsonl"
    if not data.exists():
        data.write_text("".join(json.dumps({"messages": [{"role": "user", "content":
                        PROMPT.format(i=i)}]}) + "\n" for i in range(n)))  # fmt: skip
    cfg = BenchConfig(url=url, backend="openai", chat=True, dataset=str(data), num_prompts=n,
                      output_len=args.suite_max_tokens, concurrency=[level], warmup=0,
                      transport="raw", client_procs=min(4, level), progress=False,
                      report=False, extra_body=suite_body(mode, schema, args.suite_max_tokens))  # fmt: skip
    before = read_profile(profile)
    results = asyncio.run(run_bench(cfg))
    time.sleep(0.5)  # the engine writes its totals when its batch empties
    run = results["runs"][0]
    metrics = run["metrics"]
    row = level_row("suite", level, 0, args.suite_max_tokens, metrics)
    # Per output token over whole requests (AIPerf's row: the same means): tool calls
    # stream their arguments as they parse, often at the end, so TPOT alone would miss them.
    done = [r for r in run["requests"] if r.get("success") and r.get("output_tokens")]
    tokens = sum(r["output_tokens"] for r in done)
    per_token = round(sum(r["latency"] for r in done) / tokens * 1e3, 2) if tokens else None
    row |= {"mode": mode, "schema": name, "client": "ours",
            "tokens_per_request": round(metrics["total_output_tokens"] / max(1, metrics["completed"]), 1),
            "e2e_ms_per_token_mean": per_token,
            "where": profile_figures(before, read_profile(profile))}  # fmt: skip
    emit(figure=figure, **row)
    return row


def suite_aiperf(url: str, args, model: str, level: int, mode: str, name: str,
                 schema: dict | None, profile: Path | None) -> None:  # fmt: skip
    """The same point through AIPerf (chat bodies sent as they are)."""
    from bench.gpu.clients import aiperf_bodies_level

    body = {"model": model, "max_tokens": args.suite_max_tokens, "temperature": 0.0,
            "stream": True, "stream_options": {"include_usage": True},
            **suite_body(mode, schema, args.suite_max_tokens)}  # fmt: skip
    bodies = [body | {"messages": [{"role": "user", "content": PROMPT.format(i=i)}]}
              for i in range(2 * level)]  # fmt: skip
    before = read_profile(profile)
    row = aiperf_bodies_level(url, model, str(Path(args.dir).resolve()), level, bodies,
                              mode=mode, schema=name, figure_of="suite")  # fmt: skip
    time.sleep(0.5)
    if row.get("figure") == "aiperf":
        emit(figure="suite_where", client="aiperf", mode=mode, schema=name, concurrency=level,
             **profile_figures(before, read_profile(profile)))  # fmt: skip


def client_data() -> Path:
    from bench.gpu.clients import client_logs

    return client_logs()


def suite_rounds(url: str, args, model: str) -> None:
    """The schema suite at each level: plain first (the denominator), then each accepted
    schema as response_format and as a forced tool's parameters, by our client and (for
    the first --suite-aiperf schemas) AIPerf, until the deadline. A schema's first request
    (its compile: the gate's and the engine's) is sent and timed apart, outside the points."""
    from bench.schema_suite import accepted

    profile = Path(os.environ[PROFILE_ENV]) if os.environ.get(PROFILE_ENV) else None
    schemas = accepted()[args.suite_skip :][: args.suite_schemas or None]
    for level in args.suite_levels:
        if time_left() < 20:
            emit(figure="skipped", variant="suite", concurrency=level, why="out of time")
            continue
        suite_point(url, args, level, "plain", "-", None, profile, "suite_warmup")
        suite_point(url, args, level, "plain", "-", None, profile)
        if args.aiperf:
            suite_aiperf(url, args, model, level, "plain", "-", None, profile)
        for k, (entry, text) in enumerate(schemas):
            schema = json.loads(text)
            for mode in args.suite_modes:
                if mode == "plain":
                    continue
                if mode == "tool" and entry.get("as_tool") != "accepted":
                    emit(figure="suite_refused", schema=entry["file"], mode=mode,
                         why=entry.get("as_tool"))  # fmt: skip
                    continue
                if time_left() < 15:
                    emit(figure="skipped", variant="suite", schema=entry["file"], mode=mode,
                         concurrency=level, why="out of time")  # fmt: skip
                    continue
                try:
                    first_request(url, model, mode, entry["file"], schema, args.suite_max_tokens)
                    suite_point(url, args, level, mode, entry["file"], schema, profile)
                    if args.aiperf and k < args.suite_aiperf and time_left() > 30:
                        suite_aiperf(url, args, model, level, mode, entry["file"], schema, profile)
                except Exception as exc:  # noqa: BLE001 - one schema's failure is reported
                    emit(figure="failed", variant="suite", schema=entry["file"], mode=mode,
                         concurrency=level, error=repr(exc)[:400])  # fmt: skip


def first_request(
    url: str, model: str, mode: str, name: str, schema: dict, max_tokens: int
) -> None:
    """One request with a schema new to the server (or not: the gate's verdict and
    xgrammar's cache answer a repeat): its time to the first token and to the end."""
    import requests

    body = {"model": model, "max_tokens": max_tokens, "temperature": 0.0, "stream": True,
            "messages": [{"role": "user", "content": PROMPT.format(i=-1)}],
            **suite_body(mode, schema, max_tokens)}  # fmt: skip
    sent = time.perf_counter()
    first = None
    with requests.post(url + "/v1/chat/completions", json=body, stream=True, timeout=120) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {r.text[:300]}")
        for line in r.iter_lines():
            if first is None and TEXT.search(line):
                first = time.perf_counter()
    emit(figure="suite_first_request", schema=name, mode=mode,
         ttft_ms=round(((first or time.perf_counter()) - sent) * 1e3, 1),
         total_ms=round((time.perf_counter() - sent) * 1e3, 1))  # fmt: skip
