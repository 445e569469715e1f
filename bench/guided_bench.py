"""The throughput cost of structured output (`response_format`), printing figures (not a test).

Two parts:

1. `micro`: the per-token CPU cost of the grammar in isolation, for each tokenizer found
   (the dev model's 32000-token Mistral vocabulary; SmolLM2's 49152 tokens when
   `.cache/smollm2` exists): grammar compile time (first and cached), `GuidedMatcher.mask`
   and `accept` per token (and the parts of `mask`: filling the bitmask, and applying it
   with xgrammar's own CPU kernel for comparison), and the sampler's step for 16 rows with
   and without a mask (guided rows leave the batched greedy argmax for the per-row path).
   `device`: `mask` on `--device` (e.g. cuda) for float32 and bf16 rows, against the way
   it was done before (the row through the host and xgrammar's CPU kernel).
2. `server`: the real Truss server with the dev model, streamed chat completions at each
   concurrency, for plain requests (`ignore_eos`, fixed length), `json_object` and a bounded
   `json_schema`. A grammar ends the output when the JSON is complete, so lengths differ:
   compare the per-token figures (TPOT, output tokens/s, the server's CPU time per token:
   the steadiest on a shared machine), not per-request ones. Each point runs `--rounds`
   times, formats interleaved, and the medians are printed.

`python bench/guided_bench.py --help`; its figures: docs/perf/history/structured-output.md
(`bash bench/run_gpu.sh structured` runs the `device` part on a GPU).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import requests
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "mistral-trt-truss" / "packages")]

from client.hostinfo import process_cpu_seconds  # noqa: E402
from client.metrics import percentile  # noqa: E402
from mistral_build.dev_model import build_dev_model  # noqa: E402
from mistral_build.local_server import (  # noqa: E402
    LocalServer,
    dev_settings,
    prepare_app_dir,
    render_build_context,
)
from mistral_build.paths import CACHE_DIR, DEV_MODEL_DIR  # noqa: E402
from mistral_serving.engines.base import SamplingOptions  # noqa: E402
from mistral_serving.engines.pytorch.guided import GuidedDecoder, GuidedMatcher  # noqa: E402
from mistral_serving.engines.sampling import sample_next_tokens  # noqa: E402
from mistral_serving.structured.constraint import GuidedDecoding  # noqa: E402
from mistral_serving.text.tokenizer import load_tokenizer  # noqa: E402

# Bounded: every string and array has a maximum, so even a random-weight model ends the
# JSON within max_tokens; long enough (tens of tokens) for a per-token figure.
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "tags": {
            "type": "array",
            "items": {"type": "string", "enum": ["red", "green", "blue", "none"]},
            "maxItems": 4,
        },
        "score": {"type": "integer", "minimum": 0, "maximum": 1000},
        "ok": {"type": "boolean"},
    },
    "required": ["name", "tags", "score", "ok"],
    "additionalProperties": False,
}
FORMATS: dict[str, dict | None] = {
    "plain": None,
    "json_object": {"type": "json_object"},
    "json_schema": {"type": "json_schema", "json_schema": {"name": "item", "schema": SCHEMA}},
}
GUIDED = {
    "json_object": GuidedDecoding("json_object"),
    "json_schema": GuidedDecoding("json_schema", json.dumps(SCHEMA)),
}


def load_average() -> str:
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


def pct(values: list[float], q: float) -> float:
    """client.metrics.percentile, NaN for no values."""
    return percentile(values, q) if values else float("nan")


# ---- 1. the grammar in isolation ----


@dataclass
class _Row:
    """What the sampler reads of a sequence (`sampling.Row`)."""

    sampling: SamplingOptions
    mask_fn: Callable[[torch.Tensor], None] | None
    prompt: list[int] = field(default_factory=lambda: [1])
    generated: list[int] = field(default_factory=list)
    generator: torch.Generator = field(default_factory=torch.Generator)
    stop_ids: tuple[int, ...] = (2,)


def micro_tokenizer(artifact: Path, steps: int) -> dict:
    import xgrammar as xgr

    tok = load_tokenizer(artifact)
    vocab = json.loads((artifact / "config.json").read_text())["vocab_size"]
    started = time.perf_counter()
    decoder = GuidedDecoder(tok, vocab)
    out: dict = {"vocab": vocab, "decoder_init_ms": (time.perf_counter() - started) * 1e3}
    for kind, guided in GUIDED.items():
        t0 = time.perf_counter()
        decoder.matcher(guided)
        t1 = time.perf_counter()
        decoder.matcher(guided)  # xgrammar's compiler cache: same schema, no new compile
        t2 = time.perf_counter()
        out[f"{kind}_compile_first_ms"] = (t1 - t0) * 1e3
        out[f"{kind}_matcher_cached_ms"] = (t2 - t1) * 1e3

        walk = walk_grammar(decoder, guided, vocab, steps, xgr.apply_token_bitmask_inplace)
        out |= {f"{kind}_{name}": value for name, value in walk.items()}

    for name, per_row in sampler_step(decoder, vocab, 16, "cpu", max(20, steps // 20)).items():
        out[f"sampler_step16_{name}_us_per_row"] = per_row
    return out


def walk_grammar(
    decoder: GuidedDecoder,
    guided: GuidedDecoding,
    vocab: int,
    steps: int,
    cpu_kernel: Callable[..., None],
) -> dict[str, float]:
    """A walk through the grammar: random logits, the best allowed token each step
    (a fresh matcher when the JSON is complete), timing mask and accept alone; and the
    parts of a mask, its bitmask fill and xgrammar's own CPU kernel (`cpu_kernel`)."""
    gen = torch.Generator().manual_seed(0)
    pool = torch.randn(64, vocab, generator=gen)
    work, other = torch.empty(vocab), torch.empty(vocab)
    matcher = decoder.matcher(guided)
    mask_ns: list[int] = []
    accept_ns: list[int] = []
    fill_ns: list[int] = []
    kernel_ns: list[int] = []
    documents = 0
    for i in range(steps):
        work.copy_(pool[i % len(pool)])
        a = time.perf_counter_ns()
        matcher.mask(work)
        b = time.perf_counter_ns()
        token = int(work.argmax())
        c = time.perf_counter_ns()
        matcher.accept(token)
        d = time.perf_counter_ns()
        mask_ns.append(b - a)
        accept_ns.append(d - c)
        if matcher.done:
            documents += 1
            matcher = decoder.matcher(guided)
        # The parts, at the next state: filling the bitmask alone, and applying it
        # with xgrammar's own CPU kernel (what `mask` used before) for comparison.
        other.copy_(pool[i % len(pool)])
        e = time.perf_counter_ns()
        matcher._matcher.fill_next_token_bitmask(matcher._bitmask)
        f = time.perf_counter_ns()
        cpu_kernel(other.view(1, -1), matcher._bitmask, vocab_size=vocab)
        g = time.perf_counter_ns()
        fill_ns.append(f - e)
        kernel_ns.append(g - f)
    return {
        "mask_us_p50": pct(mask_ns, 50) / 1e3,
        "mask_us_mean": statistics.fmean(mask_ns) / 1e3,
        "accept_us_p50": pct(accept_ns, 50) / 1e3,
        "fill_us_p50": pct(fill_ns, 50) / 1e3,
        "xgrammar_cpu_kernel_apply_us_p50": pct(kernel_ns, 50) / 1e3,
        "xgrammar_cpu_kernel_apply_us_mean": statistics.fmean(kernel_ns) / 1e3,
        "accept_us_mean": statistics.fmean(accept_ns) / 1e3,
        "documents": documents,
    }


def sampler_step(
    decoder: GuidedDecoder, vocab: int, batch: int, device: str, steps: int
) -> dict[str, float]:
    """The sampler's step (us per row, p50) for `batch` greedy rows on `device`: without
    masks all rows take one batched argmax; with a mask each row takes the per-row path
    (`sample_row`, one host read per row) and its own mask."""
    logits = torch.randn(batch, vocab).to(device)
    matchers = [decoder.matcher(GUIDED["json_schema"]) for _ in range(batch)]
    rows = {
        "plain": [_Row(SamplingOptions(64, top_k=1), None) for _ in range(batch)],
        "json_schema": [_Row(SamplingOptions(64, top_k=1), m.mask) for m in matchers],
    }
    out = {}
    for name, seqs in rows.items():
        times = []
        for _ in range(steps):
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            t0 = time.perf_counter_ns()
            picks = sample_next_tokens(logits, seqs)
            times.append(time.perf_counter_ns() - t0)
            if name != "plain":  # keep the grammars moving (and fresh when complete)
                for i, (m, p) in enumerate(zip(matchers, picks)):
                    m.accept(p.token)
                    if m.done:
                        matchers[i] = decoder.matcher(GUIDED["json_schema"])
                        seqs[i].mask_fn = matchers[i].mask
        out[name] = pct(times, 50) / 1e3 / batch
    return out


def run_micro(steps: int) -> dict:
    found = {"mistral (dev model)": DEV_MODEL_DIR, "smollm2": CACHE_DIR / "smollm2"}
    results = {}
    for label, artifact in found.items():
        if not (artifact / "config.json").exists():
            print(f"micro: {label}: {artifact} not found, skipped")
            continue
        results[label] = micro_tokenizer(artifact, steps)
        print(f"micro: {label}: {json.dumps(results[label], default=_round)}", flush=True)
    return results


def _mask_via_host(matcher: GuidedMatcher, logits: torch.Tensor) -> None:
    """What `GuidedMatcher.mask` did before: xgrammar's CPU kernel, the row copied to
    the host and back when it is not float32 on the CPU (the A/B's other side)."""
    import xgrammar as xgr

    matcher._matcher.fill_next_token_bitmask(matcher._bitmask)
    row = logits.view(1, -1)
    if row.device.type == "cpu" and row.dtype == torch.float32:
        xgr.apply_token_bitmask_inplace(row, matcher._bitmask, vocab_size=matcher._vocab_size)
        return
    work = row.float().cpu()
    xgr.apply_token_bitmask_inplace(work, matcher._bitmask, vocab_size=matcher._vocab_size)
    row.copy_(work.to(row.device, row.dtype))


def run_device_mask(device: str, steps: int) -> dict:
    """`mask` per token on `device` (float32 and bf16 rows), now and as before, with the
    host read that the sampler does after it (one per row), checked to block the same
    tokens; and the sampler's step for 16 and 64 rows there, with and without masks."""
    tok = load_tokenizer(DEV_MODEL_DIR)
    decoder = GuidedDecoder(tok, 32000)
    out: dict = {"device": device}
    for dtype in (torch.float32, torch.bfloat16):
        pool = torch.randn(64, 32000, generator=torch.Generator().manual_seed(0))
        pool = pool.to(device, dtype)
        for name in ("now", "before"):
            # `twin` walks the same path, masked the old way: the reference.
            matcher, twin = (
                decoder.matcher(GUIDED["json_schema"]),
                decoder.matcher(GUIDED["json_schema"]),
            )
            times = []
            for i in range(steps):
                row = pool[i % len(pool)].clone()
                if device.startswith("cuda"):
                    torch.cuda.synchronize()
                t0 = time.perf_counter_ns()
                if name == "now":
                    matcher.mask(row)
                else:
                    _mask_via_host(matcher, row)
                token = int(row.argmax())  # the sampler's host read
                times.append(time.perf_counter_ns() - t0)
                check = pool[i % len(pool)].clone()
                _mask_via_host(twin, check)
                if not torch.equal(torch.isinf(row), torch.isinf(check)):
                    raise AssertionError(f"{name} {dtype}: the masks differ at step {i}")
                for m in (matcher, twin):
                    m.accept(token)
                if matcher.done:
                    matcher = decoder.matcher(GUIDED["json_schema"])
                    twin = decoder.matcher(GUIDED["json_schema"])
            out[f"{str(dtype).split('.')[1]}_{name}_us_p50"] = pct(times, 50) / 1e3
    for batch in (16, 64):
        for name, per_row in sampler_step(decoder, 32000, batch, device, 50).items():
            out[f"sampler_step{batch}_{name}_us_per_row"] = per_row
    print(f"device mask: {json.dumps(out, default=_round)}", flush=True)
    return out


def _round(v: float) -> float:
    return round(v, 2)


# ---- 2. the real Truss server ----


def _summary(fmt: str, concurrency: int, timings: list[Timing], wall: float) -> dict:
    complete = [t for t in timings if t.finish_reason == "stop"]
    if fmt != "plain":  # the point of the grammar: every answer the grammar ended parses
        for t in complete:
            if t.text:
                json.loads(t.text)
    tokens = sum(t.tokens for t in timings)
    return {
        "format": fmt,
        "concurrency": concurrency,
        "requests": len(timings),
        "tokens": tokens,
        "output_tok_s": tokens / wall,
        "tokens_per_request_mean": tokens / len(timings),
        "ended_by_grammar": len(complete) if fmt != "plain" else None,
        "ttft_ms_p50": pct([t.ttft for t in timings], 50) * 1e3,
        "tpot_ms_p50": pct([t.tpot for t in timings if t.tpot is not None], 50) * 1e3,
        "wall_s": wall,
    }


@dataclass
class Timing:
    ttft: float
    tpot: float | None
    tokens: int
    text: str
    finish_reason: str | None


def chat_stream(url: str, fmt: str, i: int, max_tokens: int) -> Timing:
    body: dict = {
        "model": "model",
        "messages": [{"role": "user", "content": f"Describe item {i} as JSON."}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if FORMATS[fmt] is None:
        body["ignore_eos"] = True  # fixed length for the plain requests
    else:
        body["response_format"] = FORMATS[fmt]
    sent = time.perf_counter()
    first = last = None
    tokens = 0
    text = []
    finish = None
    with requests.post(url + "/v1/chat/completions", json=body, stream=True, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            event = json.loads(line[6:])
            if event.get("usage"):
                tokens = event["usage"]["completion_tokens"]
            for choice in event.get("choices", []):
                finish = choice.get("finish_reason") or finish
                content = (choice.get("delta") or {}).get("content")
                if content:
                    now = time.perf_counter()
                    first = first or now
                    last = now
                    text.append(content)
    if first is None or last is None:
        raise RuntimeError(f"{fmt}: no content streamed")
    tpot = (last - first) / (tokens - 1) if tokens > 1 else None
    return Timing(first - sent, tpot, tokens, "".join(text), finish)


def run_point(server: LocalServer, fmt: str, concurrency: int, n: int, max_tokens: int) -> dict:
    def send(i: int) -> Timing:
        return chat_stream(server.url, fmt, i, max_tokens)

    with ThreadPoolExecutor(concurrency) as pool:  # warm-up at this batch size
        list(pool.map(send, range(10_000, 10_000 + concurrency)))
    cpu = process_cpu_seconds(server.process.pid) or 0.0
    started = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        timings = list(pool.map(send, range(n)))
    point = _summary(fmt, concurrency, timings, time.perf_counter() - started)
    # CPU time per token: steadier than wall time when other work shares the cores.
    point["server_cpu_ms_per_token"] = (
        ((process_cpu_seconds(server.process.pid) or 0.0) - cpu) / point["tokens"] * 1e3
    )
    return point


def run_server(
    concurrencies: list[int], n: int, max_tokens: int, rounds: int, guided_py: Path | None
) -> list[dict]:
    build_dev_model()
    context = render_build_context(Path(tempfile.mkdtemp()) / "context")
    if guided_py is not None:  # an A/B of a change: serve another version of guided.py
        shutil.copyfile(guided_py, context / "packages" / "mistral_serving" / "guided.py")
    prepare_app_dir(context)
    server = LocalServer.start(context, dev_settings())
    results = []
    try:
        for concurrency in concurrencies:
            for r in range(rounds):  # formats interleaved: drifts in load hit all of them
                for fmt in FORMATS:
                    point = run_point(server, fmt, concurrency, max(n, concurrency), max_tokens)
                    point["round"] = r
                    results.append(point)
                    print(f"server: {json.dumps(point, default=_round)}", flush=True)
    finally:
        server.stop()
    return results


def medians(points: list[dict]) -> list[dict]:
    """Per (format, concurrency): the median of each figure over the rounds."""
    keys = (
        "output_tok_s",
        "ttft_ms_p50",
        "tpot_ms_p50",
        "tokens_per_request_mean",
        "server_cpu_ms_per_token",
    )
    groups: dict[tuple[str, int], list[dict]] = {}
    for point in points:
        groups.setdefault((point["format"], point["concurrency"]), []).append(point)
    return [
        {"format": f, "concurrency": c, "rounds": len(g)}
        | {k: statistics.median(p[k] for p in g) for k in keys}
        for (f, c), g in groups.items()
    ]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--part", choices=["all", "micro", "device", "server"], default="all")
    p.add_argument("--device", default="cpu", help="torch device of the `device` part")
    p.add_argument("--steps", type=int, default=2000, help="grammar steps per micro case")
    p.add_argument("--requests", type=int, default=32, help="requests per point")
    p.add_argument("--concurrency", default="1,16", help="comma list")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3, help="repeats of each point (median kept)")
    p.add_argument("--json", help="write all figures to this file")
    p.add_argument(
        "--guided-py",
        type=Path,
        help="serve this guided.py instead of the tree's (e.g. `git show HEAD:...` for an A/B)",
    )
    args = p.parse_args()
    torch.set_num_threads(1)  # like one engine thread; also steadier on a shared machine
    figures: dict = {"load_average_before": load_average()}
    print(f"load average before: {figures['load_average_before']}", flush=True)
    levels = [int(c) for c in args.concurrency.split(",")]
    if args.part in ("all", "micro"):
        figures["micro"] = run_micro(args.steps)
    if args.part in ("all", "device"):
        figures["device_mask"] = run_device_mask(args.device, min(args.steps, 500))
    if args.part in ("all", "server"):
        figures["server"] = run_server(
            levels, args.requests, args.max_tokens, args.rounds, args.guided_py
        )
        figures["server_medians"] = medians(figures["server"])
        print(f"server medians over {args.rounds} rounds:")
        for row in figures["server_medians"]:
            print("  " + json.dumps(row, default=_round), flush=True)
    figures["load_average_after"] = load_average()
    print(f"load average after: {figures['load_average_after']}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
