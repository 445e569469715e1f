"""The second load clients, unchanged, from the package index: AIPerf and guidellm, run
after the project's client at the same levels against the same server start, each row in
one shape (`figure="aiperf"` / `"guidellm"`) so that one table holds every client."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from bench.gpu.common import emit, time_left


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
    endpoint: str = "completions",
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
    (token-id prompts, as our client's, or chat bodies with `endpoint` "chat") instead of
    synthetic text."""
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
        "--model", model, "--url", url, "--endpoint-type", endpoint, "--streaming",
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


def aiperf_bodies_level(
    url: str, model: str, tokenizer: str, concurrency: int, bodies: list[dict], **extra
) -> dict:
    """One level of AIPerf sending `bodies` as they are (chat bodies: response_format,
    tools), one per warm-up and timed request (3 x concurrency, cycled), at 2 requests a
    stream; its figures emitted as `figure="aiperf"` with `extra`."""
    out = client_logs() / f"aiperf-chat-c{concurrency}-{time.time_ns()}"
    out.mkdir(parents=True, exist_ok=True)
    sessions = [
        {"session_id": f"s{i}", "payloads": [bodies[i % len(bodies)]]}
        for i in range(3 * concurrency)
    ]
    payloads = out / "inputs.json"
    payloads.write_text(json.dumps({"data": sessions}))
    max_tokens = int(bodies[0].get("max_tokens", 0))
    command = aiperf_command(url, model, tokenizer, concurrency, 0, max_tokens, out,
                             payloads=payloads, endpoint="chat")  # fmt: skip
    env = {
        k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    }

    def figures(report: dict) -> dict:
        latency = (report.get("request_latency") or {}).get("avg")
        tokens = (report.get("output_sequence_length") or {}).get("avg")
        per_token = round(latency / tokens, 2) if latency and tokens else None
        return aiperf_figures(report) | {"e2e_ms_per_token_mean": per_token,
                                         "tokens_per_request": tokens}  # fmt: skip

    return second_client_level("aiperf", command, env | AIPERF_NO_NETWORK,
                               out / "profile_export_aiperf.json", figures,
                               concurrency, 0, max_tokens, **extra)  # fmt: skip


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
