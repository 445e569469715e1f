"""A short benchmark run against the REAL Truss server with the dev model: the JSON has
every metric, and its token counts agree with what the server itself reports."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from client import Client
from client.bench import main
from client.metrics import METRICS

pytestmark = pytest.mark.e2e

STATS = ("mean", "median", "std", "p50", "p90", "p99")


def run_bench(server_url: str, out: Path, *extra: str) -> dict:
    code = main(
        [
            "--url",
            server_url,
            "--num-prompts",
            "6",
            "--concurrency",
            "2",
            "--input-len",
            "32",
            "--output-len",
            "8",
            "--warmup",
            "1",
            "--seed",
            "0",
            "--slo",
            "ttft:60000",
            "tpot:60000",
            "--out",
            str(out),
            "--no-progress",
            *extra,
        ]
    )
    assert code == 0
    return json.loads((out / "results.json").read_text())


def check_metrics(data: dict) -> dict:
    (run,) = data["runs"]
    m = run["metrics"]
    assert m["completed"] == 6 and m["failed"] == 0
    for name in METRICS:
        for stat in STATS:
            value = m[f"{stat}_{name}_ms"]
            if name == "tpot" and value is None:  # every request stopped after one token
                continue
            assert isinstance(value, float) and value >= 0, f"{stat}_{name}_ms"
    for key in (
        "request_throughput",
        "output_throughput",
        "total_token_throughput",
        "request_goodput",
        "duration_s",
    ):
        assert m[key] > 0, key
    assert m["total_output_tokens"] == sum(r["output_tokens"] for r in run["requests"])
    assert m["total_input_tokens"] == sum(r["prompt_tokens"] for r in run["requests"])
    return run


def test_predict_bench_counts_agree_with_server_usage(server_url: str, tmp_path: Path) -> None:
    data = run_bench(server_url, tmp_path)
    run = check_metrics(data)
    assert (tmp_path / "latency_vs_throughput.png").read_bytes()[:4] == b"\x89PNG"
    with Client(server_url, timeout=120) as client:
        for r in run["requests"]:
            assert r["output_tokens_source"] == "replay", r["error"]
            # Independently of the benchmark: ask the server for the same greedy request.
            done = client.predict(r["prompt"], max_new_tokens=8, top_k=1, seed=0)
            assert done.usage is not None
            assert r["output_tokens"] == done.usage.completion_tokens
            assert r["prompt_tokens"] == done.usage.prompt_tokens
            assert r["generated_text"] == done.output
            assert 1 <= r["chunks"] <= max(1, r["output_tokens"])
            assert len(r["itl"]) == r["chunks"] - 1
            # Synthetic prompts are sized with the server's own counts.
            assert abs(r["prompt_tokens"] - 32) <= 6


def test_openai_bench_counts_agree_with_server_usage(server_url: str, tmp_path: Path) -> None:
    data = run_bench(server_url, tmp_path, "--backend", "openai")
    run = check_metrics(data)
    with Client(server_url, timeout=120, api="openai") as client:
        for r in run["requests"]:
            assert r["output_tokens_source"] == "usage"
            done = client.predict(r["prompt"], max_new_tokens=8, temperature=0.0, seed=0)
            assert done.usage is not None
            assert r["output_tokens"] == done.usage.completion_tokens
            assert r["prompt_tokens"] == done.usage.prompt_tokens
            assert r["generated_text"] == done.output


def test_one_at_a_time_mode(server_url: str, tmp_path: Path) -> None:
    code = main(
        [
            "--url",
            server_url,
            "--num-prompts",
            "3",
            "--one-at-a-time",
            "--input-len",
            "16",
            "--output-len",
            "4",
            "--warmup",
            "0",
            "--out",
            str(tmp_path),
            "--no-progress",
        ]
    )
    assert code == 0
    (run,) = json.loads((tmp_path / "results.json").read_text())["runs"]
    assert run["mode"] == "sequential" and run["metrics"]["completed"] == 3
    reqs = sorted(run["requests"], key=lambda r: r["start"])
    for a, b in zip(reqs, reqs[1:], strict=False):
        assert b["start"] >= a["start"] + a["latency"]  # never overlapping


def test_raw_transport_agrees_with_server_usage(server_url: str, tmp_path: Path) -> None:
    """The GPU benchmark's fast path against the real server: HTTP/1.1 keep-alive, chunked
    SSE, exact-length token-id prompts; counts match the server's own usage."""
    code = main(
        ["--url", server_url, "--backend", "openai", "--transport", "raw", "--prompt-ids",
         "--num-prompts", "4", "--concurrency", "2", "--input-len", "16", "--output-len", "6",
         "--warmup", "1", "--out", str(tmp_path), "--no-progress"]
    )  # fmt: skip
    assert code == 0
    data = json.loads((tmp_path / "results.json").read_text())
    (run,) = data["runs"]
    assert run["metrics"]["completed"] == 4 and run["metrics"]["failed"] == 0
    assert data["host"]["cpus"] >= 1 and "load_before" in data["host"]
    with Client(server_url, timeout=120, api="openai") as client:
        for r in run["requests"]:
            assert r["prompt_tokens"] == 16 and r["output_tokens_source"] == "usage"
            done = client.predict(r["prompt"], max_new_tokens=6, temperature=0.0, seed=0)
            assert done.usage is not None
            assert r["output_tokens"] == done.usage.completion_tokens
            assert 1 <= r["chunks"] <= r["output_tokens"]
