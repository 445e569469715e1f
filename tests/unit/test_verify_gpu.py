"""The pure parts of `build.py verify-gpu`: argument parsing, nvidia-smi parsing, check
bookkeeping and the report. The checks themselves run against real servers in
tests/e2e/test_verify_gpu.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mistral_build.cli import build_parser, main
from mistral_build.verify import artifact, cli, config, report
from mistral_build.verify.cli import kinds_for, parse_set
from mistral_build.verify.report import parse_gpu_query, render_markdown
from mistral_build.verify.results import CheckFailed, CheckResult, KindReport, run_check


def test_set_pairs_become_lowercase_settings():
    assert parse_set(["MAX_INFLIGHT=4", "engine=trtllm_pytorch", "x=a=b"]) == {
        "max_inflight": "4",
        "engine": "trtllm_pytorch",
        "x": "a=b",
    }
    assert parse_set(None) == {}


@pytest.mark.parametrize("bad", ["novalue", "=1", "a b=1", "k-ey=1", "ключ=1"])
def test_malformed_set_pairs_are_refused_by_name(bad):
    with pytest.raises(ValueError, match="KEY=VALUE"):
        parse_set([bad])


@given(st.lists(st.text(max_size=30), max_size=4))
def test_set_parsing_never_raises_anything_but_value_error(items):
    try:
        parsed = parse_set(items)
    except ValueError as exc:
        assert "--set" in str(exc)
    else:
        assert all(k.replace("_", "").isalnum() and k.isascii() for k in parsed)


def test_gpu_query_lines_become_dicts():
    text = "NVIDIA H200, 570.124.06, 9.0, 143771 MiB\nNVIDIA H200, 570.124.06, 9.0, 143771 MiB\n"
    gpus = parse_gpu_query(text)
    assert len(gpus) == 2
    assert gpus[0] == {
        "name": "NVIDIA H200",
        "driver_version": "570.124.06",
        "compute_cap": "9.0",
        "memory_total": "143771 MiB",
    }


@given(st.text(max_size=300))
def test_gpu_query_parsing_takes_any_text(text):
    for gpu in parse_gpu_query(text):
        assert gpu["name"] and set(gpu) == {"name", "driver_version", "compute_cap", "memory_total"}


def test_kind_all_means_both_tensorrt_llm_kinds():
    assert kinds_for("all") == ["tensorrt_llm", "trtllm_pytorch"]
    assert kinds_for("pytorch") == ["pytorch"]


def test_a_check_passes_with_its_detail_and_fails_with_the_reason(capsys):
    ok = run_check("a", lambda: "fine")
    assert ok.passed and ok.detail == "fine"

    def expectation() -> str:
        raise CheckFailed("got 500")

    def crash() -> str:
        raise KeyError("choices")

    bad = run_check("b", expectation)
    assert not bad.passed and bad.detail == "got 500"
    crashed = run_check("c", crash)
    assert not crashed.passed and crashed.detail == "KeyError: 'choices'"
    printed = capsys.readouterr().out
    assert "[PASS] a: fine" in printed and "[FAIL] b: got 500" in printed


def test_a_kind_passes_only_with_checks_all_passing():
    assert not KindReport("pytorch").passed  # nothing ran: not a pass
    report = KindReport("pytorch", checks=[CheckResult("a", True, ""), CheckResult("b", True, "")])
    assert report.passed
    report.checks.append(CheckResult("c", False, "no"))
    assert not report.passed


def sample_report(passed: bool) -> dict:
    return {
        "passed": passed,
        "created": "2026-01-01T00:00:00Z",
        "command": "build.py verify-gpu",
        "gpu": [
            {
                "name": "NVIDIA H200",
                "driver_version": "570",
                "compute_cap": "9.0",
                "memory_total": "143771 MiB",
            }
        ],  # fmt: skip
        "versions": {"tensorrt_llm": "1.2.1", "torch": None},
        "kinds": [
            {
                "kind": "tensorrt_llm",
                "passed": passed,
                "artifact": "/x/engine",
                "build": {"status": "built"},
                "server": {"log": "/x/server.log"},
                "checks": [
                    {"name": "stop_strings", "passed": True, "detail": "a|b", "seconds": 1.0},
                    {"name": "penalties", "passed": passed, "detail": "x\ny", "seconds": 2.0},
                ],
                "bench": {"tool": "t", "points": [{"concurrency": 1, "output_throughput": 1.5}]},
            }
        ],
    }


def test_markdown_summary_shows_verdicts_versions_gpu_and_figures():
    md = render_markdown(sample_report(passed=False))
    assert md.startswith("# verify-gpu: FAILED")
    assert "## tensorrt_llm: FAILED" in md
    assert "| penalties | **FAIL** | 2.0 | x / y |" in md  # one table row per check
    assert "| stop_strings | pass | 1.0 | a\\|b |" in md
    assert "GPU: NVIDIA H200, driver 570, sm 9.0, 143771 MiB" in md
    assert "torch absent" in md and "tensorrt_llm 1.2.1" in md
    assert "| 1 | 1.50 |" in md
    assert render_markdown(sample_report(passed=True)).startswith("# verify-gpu: PASSED")


def test_the_exit_code_follows_the_checks(monkeypatch, tmp_path):
    def fake_kind(kind, opts, context):
        return KindReport(kind, checks=[CheckResult("x", kind != "trtllm_pytorch", "")])

    monkeypatch.setattr(cli, "verify_kind", fake_kind)
    monkeypatch.setattr(report, "gpu_facts", lambda: "no nvidia-smi on PATH")
    assert main(["verify-gpu", "--kind", "tensorrt_llm", "--out", str(tmp_path / "a")]) == 0
    assert main(["verify-gpu", "--kind", "all", "--out", str(tmp_path / "b")]) == 1
    data = json.loads((tmp_path / "b" / "report.json").read_text())
    assert [k["passed"] for k in data["kinds"]] == [True, False] and data["passed"] is False
    assert (tmp_path / "b" / "report.md").read_text().startswith("# verify-gpu: FAILED")


def test_bad_arguments_are_refused_before_any_work(tmp_path, capsys):
    assert main(["verify-gpu", "--set", "oops", "--out", str(tmp_path)]) == 2
    assert "refused: --set 'oops'" in capsys.readouterr().err
    assert main(["verify-gpu", "--engine-dir", str(tmp_path / "none")]) == 2
    assert "no config.json there" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        build_parser().parse_args(["verify-gpu", "--kind", "vllm"])


def test_engine_dir_and_the_pytorch_backend_skip_the_build(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(artifact, "build_checkpoint", lambda out: out / "checkpoint")

    def no_build(*args):
        raise AssertionError("the engine must not be built")

    monkeypatch.setattr(artifact, "build_engine", no_build)
    opts = config.VerifyOptions(kinds=["tensorrt_llm"], out=tmp_path, engine_dir=Path("/e"))
    assert artifact.prepare_artifact("tensorrt_llm", opts) == (
        "/e",
        {"status": "skipped", "reason": "--engine-dir /e given"},
    )
    path, record = artifact.prepare_artifact("trtllm_pytorch", opts)
    assert path == str(tmp_path / "checkpoint") and record["status"] == "skipped"
    printed = capsys.readouterr().out
    assert "[tensorrt_llm] engine build skipped: --engine-dir /e given" in printed
    assert "[trtllm_pytorch] engine build skipped: trtllm_pytorch serves the checkpoint" in printed


def test_server_settings_per_kind():
    s = artifact.server_settings("tensorrt_llm", "/e", {"max_inflight": "4"})
    assert s["engine"] == "tensorrt_llm" and s["artifact"] == "/e" and s["max_inflight"] == "4"
    assert s["kv_cache_free_gpu_memory_fraction"] == "0.2"
    dev = artifact.server_settings("pytorch", "/dev", {})
    assert dev["engine"] == "pytorch" and dev["device"] == "cpu"
    assert dev["max_waiting"] == str(config.MAX_WAITING)


# -- the package's shape ----------------------------------------------------------------

VERIFY_DIR = Path(__file__).resolve().parents[2] / "mistral_build" / "verify"
MAX_FUNCTION_LINES = 60


def long_functions(source: str) -> list[str]:
    """Functions longer than MAX_FUNCTION_LINES whose `def` line is not preceded by a
    `# long: <why>` comment."""
    import ast

    lines = source.splitlines()
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            justified = first >= 2 and lines[first - 2].strip().startswith("# long:")
            if length > MAX_FUNCTION_LINES and not justified:
                found.append(f"{node.name} ({length} lines)")
    return found


def test_every_verify_function_is_short_or_says_why():
    modules = sorted(VERIFY_DIR.glob("*.py"))
    assert len(modules) >= 8  # the package by concern, not one file
    offenders = {p.name: long_functions(p.read_text()) for p in modules}
    assert not {k: v for k, v in offenders.items() if v}


def test_a_planted_long_function_is_found():
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    assert long_functions(f"def f():\n{body}\n") == [f"f ({MAX_FUNCTION_LINES + 1} lines)"]
    assert long_functions(f"# long: one table\ndef f():\n{body}\n") == []


# -- where the server's packages are missing (a bare release container) -----------------


def test_build_py_names_a_missing_package_in_one_line():
    import subprocess
    import sys

    repo = VERIFY_DIR.parents[1]
    # -S: no site-packages, as bare as a Python gets (a release container lacks ours).
    proc = subprocess.run(
        [sys.executable, "-S", str(repo / "build.py"), "verify-gpu", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("error: ") and "is not installed here" in line
    assert "IMAGE:TAG-verify" in line


def test_verify_gpu_refuses_without_the_servers_packages(monkeypatch, tmp_path, capsys):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "fastapi" else real(name, *a)
    )
    assert main(["verify-gpu", "--kind", "pytorch", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "refused: the server's packages are not installed here (fastapi)" in err
    assert "verify image" in err and not (tmp_path / "report.json").exists()
