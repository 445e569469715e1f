"""bench/gpu/clients.py's second-client rows: AIPerf's summary export read into guidellm's
row shape (a real export of `aiperf profile` against the replay server, trimmed to the
records the parser and a reader need), and the `failed` row of a client that fails."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from bench.gpu import clients, common

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "aiperf" / "profile_export_aiperf.json"


@pytest.fixture(autouse=True)
def no_results_file(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(common, "OUT", None)


def test_a_real_export_reads_into_the_rows_shape() -> None:
    report = json.loads(SAMPLE.read_text())
    figures = clients.aiperf_figures(report)
    # The same keys as guidellm's rows, so one table holds both clients.
    assert set(figures) == set(clients.guidellm_figures(guidellm_shaped()))
    assert figures["requests"] == {"successful": 128, "errored": 0, "total": 128}
    assert figures["output_tokens"] == 128 * 256
    assert figures["prompt_tokens_p50"] == 16
    assert figures["output_tok_s"] == round(report["output_token_throughput"]["avg"], 3)
    assert figures["ttft_ms_p50"] == round(report["time_to_first_token"]["p50"], 3)
    assert figures["itl_ms_p99"] == round(report["inter_chunk_latency"]["p99"], 3)
    assert figures["tpot_ms_p50"] == round(report["inter_token_latency"]["p50"], 3)
    assert figures["duration_s"] == round(report["benchmark_duration"]["avg"], 3)


def test_errored_requests_are_counted_and_missing_metrics_are_none() -> None:
    # Records AIPerf leaves out when no request succeeded (a run where every request
    # failed exits non-zero with no export: the failed row below).
    report = {"error_request_count": {"unit": "requests", "avg": 4.0}, "request_count": None}
    figures = clients.aiperf_figures(report)
    assert figures["requests"] == {"successful": 0, "errored": 4, "total": 4}
    assert figures["output_tok_s"] is None and figures["itl_ms_p50"] is None


def test_a_client_that_fails_gives_a_failed_row(tmp_path: Path) -> None:
    command = [sys.executable, "-c", "import sys; sys.exit('no server at that url')"]
    row = clients.second_client_level(
        "aiperf", command, {}, tmp_path / "never.json", clients.aiperf_figures, 64, 16, 256
    )
    assert row == {
        "figure": "failed",
        "variant": "aiperf",
        "concurrency": 64,
        "error": "no server at that url\n",
    }


def test_a_client_that_writes_its_report_gives_its_figures(tmp_path: Path) -> None:
    report = tmp_path / "profile_export_aiperf.json"
    command = [
        sys.executable,
        "-c",
        f"import shutil; shutil.copy({str(SAMPLE)!r}, {str(report)!r})",
    ]
    row = clients.second_client_level(
        "aiperf", command, {}, report, clients.aiperf_figures, 64, 16, 256, set=None
    )
    assert row["figure"] == "aiperf" and row["concurrency"] == 64 and row["set"] is None
    assert row["requests"]["successful"] == 128 and row["wall_s"] >= 0


def test_the_command_is_a_closed_loop_of_two_requests_per_stream(tmp_path: Path) -> None:
    argv = clients.aiperf_command("http://127.0.0.1:1", "m", "/tok", 256, 128, 64, tmp_path)
    assert argv[2:4] == ["aiperf", "profile"]
    assert "--streaming" in argv and "--use-server-token-count" in argv
    assert argv[argv.index("--request-count") + 1] == "512"
    assert argv[argv.index("--concurrency") + 1] == "256"
    assert argv[argv.index("--synthetic-input-tokens-mean") + 1] == "128"
    assert argv[argv.index("--output-tokens-mean") + 1] == "64"
    assert "ignore_eos:true" in argv
    assert int(argv[argv.index("--workers-max") + 1]) >= 2
    # Greedy, as our client: without a temperature the server would sample (other work).
    assert "temperature:0" in argv
    sampled = clients.aiperf_command("http://x", "m", "/t", 1, 8, 8, tmp_path, temperature=0.7)
    assert "temperature:0.7" in sampled


def guidellm_shaped() -> dict:
    """The least guidellm report guidellm_figures reads (for its key set)."""
    return {"benchmarks": [{"metrics": {}, "duration": 1.0}]}


def test_a_client_that_exits_zero_without_its_report_gives_a_failed_row(tmp_path: Path) -> None:
    command = [sys.executable, "-c", "pass"]
    row = clients.second_client_level(
        "aiperf", command, {}, tmp_path / "never.json", clients.aiperf_figures, 1, 16, 8
    )
    assert row["figure"] == "failed" and row["error"] == "exit status 0, no report"


def test_the_long_shape_takes_its_own_levels_only_when_given() -> None:
    import argparse

    given = argparse.Namespace(concurrency=[1, 16, 64, 256], long_concurrency=[16, 256])
    assert common.levels_for(given, 128) == [1, 16, 64, 256]
    assert common.levels_for(given, common.LONG_INPUT) == [16, 256]
    unset = argparse.Namespace(concurrency=[1, 4], long_concurrency=None)
    assert common.levels_for(unset, common.LONG_INPUT) == [1, 4]


def test_token_id_bodies_replace_the_synthetic_text(tmp_path: Path) -> None:
    """With payloads, AIPerf sends our client's token-id bodies as they are: no synthetic
    prompt or output options (the bodies carry max_tokens, min_tokens, ignore_eos)."""
    payloads = clients.aiperf_token_id_payloads(tmp_path / "in.json", "m", 4, 32, 8)
    sessions = json.loads(payloads.read_text())["data"]
    assert len(sessions) == 12 and len({s["session_id"] for s in sessions}) == 12
    bodies = [s["payloads"] for s in sessions]
    assert all(len(b) == 1 for b in bodies)
    first = bodies[0][0]
    assert first["model"] == "m" and first["stream"] and first["ignore_eos"]
    assert first["max_tokens"] == first["min_tokens"] == 8 and first["temperature"] == 0
    assert all(len(b[0]["prompt"]) == 32 and b[0]["prompt"][0] == 1 for b in bodies)
    assert len({tuple(b[0]["prompt"]) for b in bodies}) == 12  # no two alike (prefix caches)
    argv = clients.aiperf_command("http://x", "m", "/t", 4, 32, 8, tmp_path, payloads=payloads)
    assert argv[argv.index("--input-file") + 1] == str(payloads)
    assert argv[argv.index("--custom-dataset-type") + 1] == "inputs_json"
    assert not any(a.startswith("--synthetic") or a == "--extra-inputs" for a in argv)
    assert argv[argv.index("--request-count") + 1] == "8"
