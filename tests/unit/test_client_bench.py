"""The benchmark driven against the loopback fake: counts, modes, arrivals, outputs."""

from __future__ import annotations

import asyncio
import json
import random
import re
import statistics
from pathlib import Path

import pytest

from client.bench import (
    BenchConfig,
    arrival_gaps,
    format_report,
    main,
    run_bench,
    write_results,
)
from client.datasets import LengthFit, fit_length, load_prompts, random_text
from client.metrics import METRICS
from client.testing import FakeServer, FakeServerState


def run(cfg: BenchConfig) -> dict:
    return asyncio.run(run_bench(cfg))


@pytest.mark.parametrize("backend", ["predict", "openai"])
def test_token_counts_agree_with_server_usage(backend: str) -> None:
    with FakeServer() as fake:
        cfg = BenchConfig(
            url=fake.url,
            backend=backend,
            num_prompts=6,
            concurrency=[2],
            input_len=30,
            output_len=8,
            warmup=1,
            progress=False,
        )
        results = run(cfg)
    (run_,) = results["runs"]
    m = run_["metrics"]
    assert m["completed"] == 6 and m["failed"] == 0
    # The fake reports completion_tokens = max_new_tokens and prompt_tokens = words + 3.
    for r in run_["requests"]:
        assert r["output_tokens"] == 8
        assert r["output_tokens_source"] == ("replay" if backend == "predict" else "usage")
        assert r["prompt_tokens"] == 30  # the synthetic prompt hit input_len exactly
        assert r["ttft"] <= r["latency"]
        assert len(r["itl"]) == r["chunks"] - 1
    assert m["total_output_tokens"] == 48
    assert m["total_input_tokens"] == 180
    assert m["output_throughput"] == pytest.approx(48 / m["duration_s"])
    assert m["request_throughput"] == pytest.approx(6 / m["duration_s"])
    assert results["prompts"]["fit_tokens_per_word"] == pytest.approx(1.0)
    # TPOT per request is vLLM's (e2e - ttft) / (n - 1).
    r = run_["requests"][0]
    assert r["tpot"] == pytest.approx((r["latency"] - r["ttft"]) / 7)


def test_predict_bench_requests_are_greedy_seeded_and_token_by_token() -> None:
    with FakeServer() as fake:
        run(
            BenchConfig(
                url=fake.url,
                num_prompts=2,
                output_len=4,
                input_len=10,
                warmup=0,
                seed=5,
                progress=False,
            )
        )
        streamed = [b for b in fake.state.requests if b.get("streaming")]
    assert streamed and all(
        b["top_k"] == 1
        and b["seed"] == 5
        and b["streaming_interval"] == 1
        and b["max_new_tokens"] == 4
        for b in streamed
    )


def test_every_metric_in_json_and_plot_written(tmp_path: Path) -> None:
    with FakeServer() as fake:
        cfg = BenchConfig(
            url=fake.url,
            num_prompts=4,
            concurrency=[1, 2],
            output_len=5,
            input_len=12,
            warmup=0,
            slos={"ttft": 10_000, "tpot": 10_000},
            progress=False,
        )
        written = write_results(run(cfg), tmp_path)
    data = json.loads((tmp_path / "results.json").read_text())
    assert [r["concurrency"] for r in data["runs"]] == [1, 2]
    for r in data["runs"]:
        m = r["metrics"]
        for name in METRICS:
            for stat in ("mean", "median", "std", "p50", "p90", "p99"):
                assert isinstance(m[f"{stat}_{name}_ms"], float), f"{stat}_{name}_ms"
        for key in ("request_throughput", "output_throughput", "total_token_throughput"):
            assert m[key] > 0
        assert m["request_goodput"] == pytest.approx(m["request_throughput"])  # generous SLOs
        assert len(r["requests"]) == 4
    png = tmp_path / "latency_vs_throughput.png"
    assert png in written and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_tight_slo_gives_zero_goodput() -> None:
    with FakeServer(FakeServerState(first_token_delay=0.05)) as fake:
        m = run(
            BenchConfig(
                url=fake.url,
                num_prompts=3,
                output_len=3,
                input_len=8,
                warmup=0,
                slos={"ttft": 10},
                progress=False,
            )
        )["runs"][0]["metrics"]
    assert m["good_requests"] == 0 and m["request_goodput"] == 0
    assert m["median_ttft_ms"] >= 50


def test_one_at_a_time_never_overlaps_and_concurrency_does() -> None:
    with FakeServer(FakeServerState(token_delay=0.01)) as fake:
        run(
            BenchConfig(
                url=fake.url,
                num_prompts=6,
                output_len=5,
                input_len=8,
                warmup=0,
                one_at_a_time=True,
                progress=False,
            )
        )
        assert fake.state.max_in_flight == 1
    with FakeServer(FakeServerState(token_delay=0.01)) as fake:
        results = run(
            BenchConfig(
                url=fake.url,
                num_prompts=8,
                output_len=5,
                input_len=8,
                warmup=0,
                concurrency=[4],
                token_count="chunks",
                progress=False,
            )
        )
        assert 2 <= fake.state.max_in_flight <= 4
    assert results["runs"][0]["requests"][0]["output_tokens_source"] == "chunks"


def test_request_rate_mode_spaces_arrivals() -> None:
    with FakeServer() as fake:
        results = run(
            BenchConfig(
                url=fake.url,
                num_prompts=5,
                output_len=2,
                input_len=8,
                warmup=0,
                request_rate=[20.0],
                burstiness=1e6,
                progress=False,
            )
        )
    starts = sorted(r["start"] for r in results["runs"][0]["requests"])
    # burstiness -> infinity makes the gamma gaps constant: 1/20 s, so 4 gaps span 0.2 s
    # (a sleep never ends early; a loaded machine may only make it later, so no upper bound).
    assert starts[-1] - starts[0] >= 0.19
    assert results["runs"][0]["request_rate"] == 20.0


def test_arrival_gaps_follow_the_gamma_process() -> None:
    rng = random.Random(1)
    for burstiness in (1.0, 0.5, 4.0):
        gaps = arrival_gaps(20_001, 10.0, burstiness, rng)
        assert gaps[0] == 0.0
        rest = gaps[1:]
        mean = statistics.fmean(rest)
        cv2 = statistics.pvariance(rest) / mean**2
        assert mean == pytest.approx(0.1, rel=0.05)  # rate 10/s
        assert cv2 == pytest.approx(1 / burstiness, rel=0.1)  # gamma: CV^2 = 1/shape
    assert arrival_gaps(3, float("inf"), 1.0, rng) == [0.0, 0.0, 0.0]
    with pytest.raises(ValueError):
        arrival_gaps(3, 1.0, 0.0, rng)


def test_prompt_files(tmp_path: Path) -> None:
    plain = tmp_path / "p.txt"
    plain.write_text("first prompt\n\nsecond é prompt\n", encoding="utf-8")
    items = load_prompts(plain)
    assert [i.prompt for i in items] == ["first prompt", "second é prompt"]
    assert load_prompts(plain, chat=True)[0].messages == [
        {"role": "user", "content": "first prompt"}
    ]
    jl = tmp_path / "p.jsonl"
    jl.write_text(
        '{"prompt": "a", "output_len": 7}\n{"messages": [{"role": "user", "content": "b"}]}\n',
        encoding="utf-8",
    )
    items = load_prompts(jl)
    assert items[0].prompt == "a" and items[0].output_len == 7
    assert items[1].messages == [{"role": "user", "content": "b"}]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"nothing": 1}\n', encoding="utf-8")
    with pytest.raises(ValueError, match="prompt"):
        load_prompts(bad)


def test_dataset_prompts_are_sent_with_their_output_len(tmp_path: Path) -> None:
    jl = tmp_path / "p.jsonl"
    jl.write_text('{"prompt": "a b c", "output_len": 3}\n{"prompt": "d e", "output_len": 5}\n')
    with FakeServer() as fake:
        results = run(
            BenchConfig(url=fake.url, dataset=str(jl), num_prompts=4, warmup=0, progress=False)
        )
    outs = [r["output_tokens"] for r in results["runs"][0]["requests"]]
    assert outs == [3, 5, 3, 5]


def test_length_fit_recovers_overhead_and_rate() -> None:
    async def count(text: str) -> int:  # a "tokenizer": 2 tokens per word + 11 template tokens
        return 11 + 2 * len(text.split())

    fit = asyncio.run(fit_length(count, 200, random.Random(0)))
    assert fit.overhead == pytest.approx(11) and fit.per_word == pytest.approx(2)
    assert fit.words_for(211) == 100
    assert LengthFit(5, 1.0).words_for(2) == 1  # never an empty prompt
    assert len(random_text(17, random.Random(0)).split()) == 17


def test_cli_bench_writes_results(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with FakeServer() as fake:
        code = main(
            [
                "--url",
                fake.url,
                "--num-prompts",
                "3",
                "--concurrency",
                "1,3",
                "--input-len",
                "16",
                "--output-len",
                "4",
                "--warmup",
                "1",
                "--slo",
                "ttft:5000",
                "tpot:1000",
                "--out",
                str(tmp_path),
                "--no-progress",
            ]
        )
    assert code == 0
    out = capsys.readouterr().out
    assert "concurrency=3" in out and "Mean TTFT (ms)" in out and "Request goodput" in out
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["config"]["slos"] == {"ttft": 5000.0, "tpot": 1000.0}
    assert len(data["runs"]) == 2


def test_cli_bench_reports_unreachable_server(capsys: pytest.CaptureFixture[str]) -> None:
    from client.testing import closed_port

    code = main(
        ["--url", f"http://127.0.0.1:{closed_port()}", "--num-prompts", "1", "--no-progress"]
    )
    assert code == 1
    assert "cannot reach" in capsys.readouterr().err


# -- the raw transport (the GPU benchmark's fast path) ----------------------------------


@pytest.mark.parametrize("procs", [1, 2])
def test_raw_transport_counts_and_times_like_httpx(procs: int) -> None:
    with FakeServer(FakeServerState(chunked=True)) as fake:
        cfg = BenchConfig(
            url=fake.url,
            backend="openai",
            transport="raw",
            client_procs=procs,
            prompt_ids=True,
            num_prompts=6,
            concurrency=[2],
            input_len=12,
            output_len=5,
            warmup=1,
            progress=False,
        )
        results = run(cfg)
        bodies = fake.state.requests
    (run_,) = results["runs"]
    m = run_["metrics"]
    assert m["completed"] == 6 and m["failed"] == 0
    assert m["total_output_tokens"] == 30
    assert sorted(r["index"] for r in run_["requests"]) == list(range(6))
    for r in run_["requests"]:
        assert r["output_tokens"] == 5 and r["output_tokens_source"] == "usage"
        assert r["finish_reason"] == "length"
        assert 1 <= r["chunks"] <= 5 and len(r["itl"]) == r["chunks"] - 1
        assert 0 < r["ttft"] <= r["latency"]
        assert len(r["prompt"]) == 12  # exact-length token-id prompts
    sent = [b for b in bodies if b.get("stream")]
    assert all(b["stream_options"] == {"include_usage": True} for b in sent)
    assert all(b["temperature"] == 0.0 and b["max_tokens"] == 5 for b in sent)
    assert all(len(b["prompt"]) == 12 and b["prompt"][0] == 1 for b in sent)


@pytest.mark.parametrize("transport", ["raw", "httpx"])
def test_extra_body_is_in_every_request(transport: str) -> None:
    extra = {"response_format": {"type": "json_object"}, "ignore_eos": True}
    with FakeServer(FakeServerState(chunked=True)) as fake:
        cfg = BenchConfig(url=fake.url, backend="openai", transport=transport, prompt_ids=True,
                          num_prompts=3, input_len=4, output_len=3, warmup=1, progress=False,
                          extra_body=extra)  # fmt: skip
        (run_,) = run(cfg)["runs"]
        sent = [b for b in fake.state.requests if b.get("stream")]
    assert run_["metrics"]["completed"] == 3
    assert len(sent) == 4 and all(b.items() >= extra.items() for b in sent)


def test_raw_transport_times_streamed_tool_call_arguments() -> None:
    from client import rawhttp

    call = b'{"tool_calls": [{"index": 0, "function": {"arguments": "{\\"a"}}]}'
    assert rawhttp._TEXT.search(b'data: {"choices": [{"delta": ' + call + b"}]}")
    assert not rawhttp._TEXT.search(b'data: {"choices": [{"delta": {"content": ""}}]}')


def test_raw_transport_records_errors_and_broken_streams() -> None:
    with FakeServer(FakeServerState(chunked=True, truncate_after=2)) as fake:
        cfg = BenchConfig(
            url=fake.url,
            backend="openai",
            transport="raw",
            prompt_ids=True,
            num_prompts=2,
            input_len=4,
            output_len=5,
            warmup=0,
            progress=False,
        )
        (run_,) = run(cfg)["runs"]
    assert run_["metrics"]["failed"] == 2
    assert all("broke off" in r["error"] for r in run_["requests"])
    with FakeServer(FakeServerState(chunked=True)) as fake:
        cfg.url, cfg.temperature = fake.url, -1.0  # the fake answers 400
        (run_,) = run(cfg)["runs"]
    assert all("temperature must be >= 0" in r["error"] for r in run_["requests"])


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"transport": "raw"}, "use --backend openai"),
        ({"backend": "openai", "client_procs": 2}, "needs --transport raw"),
        ({"prompt_ids": True}, "--prompt-ids"),
        ({"backend": "openai", "prompt_ids": True, "chat": True}, "--prompt-ids"),
        ({"burstiness": 0}, "burstiness"),
        ({"concurrency": [0]}, "at least 1"),
        ({"extra_body": {"ignore_eos": True}}, "--extra-body"),
    ],
)
def test_impossible_configs_are_refused_before_any_request(change: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        BenchConfig(**change).validate()


def test_results_record_the_host_and_warn_when_busy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from client import hostinfo

    monkeypatch.setattr(hostinfo, "load_average", lambda: 64.0 * hostinfo.cpu_count())
    with FakeServer() as fake:
        code = main(["--url", fake.url, "--num-prompts", "2", "--input-len", "8",
                     "--output-len", "2", "--warmup", "0", "--no-progress",
                     "--out", str(tmp_path)])  # fmt: skip
    assert code == 0
    host = json.loads((tmp_path / "results.json").read_text())["host"]
    assert host["load_before"] == host["load_after"] == 64.0 * host["cpus"]
    assert {"python", "versions", "git_commit", "benchmark_cpu_s"} <= set(host)
    err = capsys.readouterr().err
    assert "WARNING: the machine was busy" in err
    assert f"wrote {tmp_path / 'results.json'}" in err


def test_results_go_under_bench_by_default(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with FakeServer() as fake:
        code = main(["--url", fake.url, "--num-prompts", "1", "--input-len", "8",
                     "--output-len", "2", "--warmup", "0", "--no-progress",
                     "--label", "mine"])  # fmt: skip
    assert code == 0
    (written,) = list((tmp_path / "bench" / "results").glob("*/results.json"))
    data = json.loads(written.read_text())
    assert data["label"] == "mine"
    assert (
        str(Path("bench") / "results" / written.parent.name / "results.json")
        in capsys.readouterr().err
    )


def test_bench_help_shows_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    out = " ".join(capsys.readouterr().out.split())  # argparse wraps lines anywhere
    for shown in ("(default: 50)", "(default: httpx)", "(default: http://127.0.0.1:8080)"):
        assert shown in out


def test_bad_lists_are_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--concurrency", "1,x"])
    assert info.value.code == 2 and "bad list" in capsys.readouterr().err


def test_an_interrupted_bench_keeps_the_levels_it_finished(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import client.bench as bench

    real = bench.run_point
    calls = []

    async def interrupted(*args, **kwargs):  # warm-up, level 1, then Ctrl-C in level 2
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return await real(*args, **kwargs)

    monkeypatch.setattr(bench, "run_point", interrupted)
    with FakeServer() as fake:
        code = main(
            ["--url", fake.url, "--num-prompts", "2", "--concurrency", "1,2,4",
             "--input-len", "8", "--output-len", "3", "--warmup", "1", "--out", str(tmp_path)]
        )  # fmt: skip
    assert code == 130
    err = capsys.readouterr().err
    assert "estimate: at least" in err and "(1 of 3 levels)" in err
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["complete"] is False and data["levels_planned"] == 3
    assert [r["concurrency"] for r in data["runs"]] == [1]


def test_the_estimate_counts_waves_per_level() -> None:
    from client.bench import Point, estimate_seconds

    points = [Point("c1", "concurrency", 1, None, None), Point("c4", "concurrency", 4, None, None)]
    assert estimate_seconds(points, 8, 2.0) == 8 * 2.0 + 2 * 2.0


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ('{"prompt": "a"}\n{"prompt": \n', "prompts.jsonl:2: not JSON: "),
        ('{"prompt": "a"}\n[1]\n', "prompts.jsonl:2: need an object with 'prompt' or 'messages'"),
        (None, "prompts.jsonl: No such file or directory"),
    ],
)
def test_a_bad_dataset_is_one_line_before_any_request(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str | None, said: str
) -> None:
    """A malformed line printed a traceback, after the server had been asked to count."""
    path = tmp_path / "prompts.jsonl"
    if text is not None:
        path.write_text(text)
    # Port 9 refuses connections: the file is refused before any is made.
    assert main(["--dataset", str(path), "--url", "http://127.0.0.1:9"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert err.startswith(f"error: --dataset {tmp_path}/{said}"), err


class _Shown(str):
    def __format__(self, spec: str) -> str:
        return str(self)


def test_the_example_report_in_the_docs_is_what_the_benchmark_prints() -> None:
    """docs/client.md's example run: its report in today's layout (format_report), its
    figures consistent with each other, with its command and with the sweep table."""
    docs = (Path(__file__).resolve().parents[2] / "docs" / "client.md").read_text()
    command = re.search(r"\$ python -m client bench --url \S+ (.*?)\n```", docs, re.S)
    assert command
    args = dict(re.findall(r"--(num-prompts|input-len|output-len) (\d+)", command[1]))
    block = re.search(r"```text\n(=+ (concurrency=\d+) =+\n.*?)\n```", docs, re.S)
    assert block
    keys = ["completed", "failed", "duration_s", "total_input_tokens", "total_output_tokens"]
    keys += ["request_throughput", "output_throughput", "total_token_throughput"]
    keys += ["request_goodput"] + [
        f"{stat}_{name}_ms"
        for name in ("ttft", "tpot", "itl", "e2el")
        for stat in ("mean", "median", "p90", "p99")
    ]
    layout = format_report(block[2], {k: _Shown(f"<{k}>") for k in keys}).splitlines()
    shown = block[1].splitlines()
    assert len(shown) == len(layout)
    m: dict[str, float] = {}
    for want, got in zip(layout, shown):
        if "<" in want:
            m[want[want.index("<") + 1 : want.index(">")]] = float(got[40:])
    typed = {k: int(v) if k in keys[:5] and k != "duration_s" else v for k, v in m.items()}
    assert format_report(block[2], typed) == block[1]  # the layout the benchmark prints
    n, i, o = (int(args[k]) for k in ("num-prompts", "input-len", "output-len"))
    assert (m["completed"], m["total_input_tokens"], m["total_output_tokens"]) == (n, n * i, n * o)
    duration = m["duration_s"]  # rounded to 0.01 s: the rates agree within that
    for rate, amount in [
        ("request_throughput", n),
        ("output_throughput", n * o),
        ("total_token_throughput", n * (i + o)),
    ]:
        low, high = amount / (duration + 0.005), amount / (duration - 0.005)
        assert low - 0.005 <= m[rate] <= high + 0.005, rate
    row = next(line for line in docs.splitlines() if line.startswith(f"| {block[2]} |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert float(cells[1]) == round(m["request_throughput"], 2)
    assert float(cells[2]) == round(m["output_throughput"], 1)
    assert cells[4] == f"{m['median_ttft_ms']:.0f} / {m['p99_ttft_ms']:.0f}"
    assert cells[7] == f"{m['median_e2el_ms']:.0f} / {m['p99_e2el_ms']:.0f}"
