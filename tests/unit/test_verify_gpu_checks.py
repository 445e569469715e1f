"""verify-gpu's verdicts: PASS on a correct stack by construction, WARN on near ties, FAIL
on each injected fault. The checks run here against stand-ins of the HTTP helpers they
call (the real servers are in tests/e2e/test_verify_gpu.py): a correct server, one whose
batched answers flip a near tie late in the sequence, one that returns garbage, a frozen
KV gauge, a drain that cuts everything, an executor that dies after an abort."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mistral_build.verify import checks, cli, lifecycle, report, wire
from mistral_build.verify.checks import Context
from mistral_build.verify.driver import driver_from_proc, judge_driver
from mistral_build.verify.judges import (
    MIN_AGREE_TOKENS,
    Drain,
    agreement,
    batch_pairs,
    judge_agreement,
    judge_drain,
    judge_logprobs,
)
from mistral_build.verify.results import (
    CheckFailed,
    CheckResult,
    CheckWarned,
    KindReport,
    run_check,
)

WORDS = [
    "the",
    "sea",
    "is",
    "wide",
    "and",
    "the",
    "waves",
    "are",
    "long",
    "and",
    "grey",
    "under",
    "a",
    "pale",
    "sky",
]


def tokenize(text: str) -> list[int]:
    """One token per word: the tests build answers word by word."""
    return [hash(w) % 32000 for w in text.split()]


def answer(prompt: str, n: int = 24) -> str:
    """The 'greedy answer' of a correct server: a function of the prompt only."""
    rng = random.Random(prompt)
    return " ".join(rng.choice(WORDS) for _ in range(n))


def flipped(text: str, at: int) -> str:
    """The same answer with a near tie flipped at token `at`: different from there on."""
    words = text.split()
    return " ".join(words[:at] + ["FLIP"] + [w.upper() for w in words[at + 1 :]])


def garbage(_: str) -> str:
    return " ".join(random.choice(["zq", "##", "xx", "\ufffd"]) for _ in range(24))


def ctx(**kw: Any) -> Context:
    return Context(url="http://stand-in", expected_engine="x", tokenize=tokenize, **kw)


def verdict(name: str, fn: Callable[[], str]) -> str:
    return run_check(name, fn).verdict


@pytest.fixture(autouse=True)
def instant_polls(monkeypatch: pytest.MonkeyPatch) -> None:
    """wait_until polls a few times without sleeping: state changes are scripted."""

    def poll(check: Callable[[], bool], timeout: float, interval: float = 0.1) -> bool:
        return any(check() for _ in range(5))

    monkeypatch.setattr(wire, "wait_until", poll)


# -- token-prefix agreement --------------------------------------------------------------


def test_agreement_counts_the_common_prefix_in_tokens():
    assert agreement([1, 2, 3], [1, 2, 3]).same
    a = agreement([1, 2, 3, 4, 5], [1, 2, 9, 9])
    assert (a.common, a.same, a.early) == (2, False, True)
    late = agreement(list(range(10)), [*range(6), 99])
    assert not late.same and not late.early
    # One answer ended (EOS) where the other went on: they agree as far as the shorter.
    assert not agreement([1, 2], [1, 2, 3, 4]).early


def test_equal_answers_pass():
    pairs = [(answer(str(i)), answer(str(i))) for i in range(8)]
    assert judge_agreement("x", pairs, tokenize) == "x: 8 of 8 equal"


def test_late_near_ties_warn_and_say_where():
    pairs = [(answer(str(i)), answer(str(i))) for i in range(8)]
    pairs[3] = (pairs[3][0], flipped(pairs[3][0], 17))
    pairs[5] = (pairs[5][0], flipped(pairs[5][0], 2))  # one early flip in 8: still a tie
    with pytest.raises(CheckWarned, match=r"2 of 8 differ .*#3: first 17 of 24 tokens agree"):
        judge_agreement("x", pairs, tokenize)


def test_garbage_fails():
    pairs = [(answer(str(i)), garbage(str(i))) for i in range(8)]
    with pytest.raises(CheckFailed, match=f"within their first {MIN_AGREE_TOKENS} tokens"):
        judge_agreement("x", pairs, tokenize)


def test_many_late_differences_warn_however_many():
    # 5 of 8 flipped late (a 1-2% per-token flip rate over long answers does this): near ties.
    pairs = [(answer(str(i)), flipped(answer(str(i)), 10)) for i in range(5)]
    pairs += [(answer("same"), answer("same"))] * 3
    with pytest.raises(CheckWarned, match="5 of 8 differ"):
        judge_agreement("x", pairs, tokenize)
    every = [(answer(str(i)), flipped(answer(str(i)), 5)) for i in range(8)]
    with pytest.raises(CheckWarned, match="8 of 8 differ"):
        judge_agreement("x", every, tokenize)


def test_more_than_a_quarter_differing_early_fails():
    pairs = [(answer(str(i)), answer(str(i))) for i in range(8)]
    for i in (1, 4, 6):
        pairs[i] = (pairs[i][0], flipped(pairs[i][0], 1))
    with pytest.raises(CheckFailed, match="3 differ within their first"):
        judge_agreement("x", pairs, tokenize)


def test_batch_pairs_compare_mates_with_each_other_and_with_their_reference():
    assert batch_pairs(["r0", "r1"], ["s0", "s1"]) == [
        ("s0", "s1"),
        ("r0", "r1"),
        ("r0", "s0"),
        ("r1", "s1"),
    ]
    with pytest.raises(ValueError):
        batch_pairs(["r0"], ["s0", "s1"])


def test_a_single_pair_that_differs_at_once_fails_and_late_warns():
    a = answer("one")
    with pytest.raises(CheckFailed):
        judge_agreement("x", [(a, flipped(a, 0))], tokenize)
    with pytest.raises(CheckWarned):
        judge_agreement("x", [(a, flipped(a, 20))], tokenize)


@given(
    st.lists(
        st.tuples(
            st.lists(st.integers(0, 3), max_size=12), st.lists(st.integers(0, 3), max_size=12)
        ),
        min_size=1,
        max_size=10,
    )
)
def test_agreement_verdicts_are_only_pass_warn_fail(pairs):
    as_text = [(" ".join(map(str, a)), " ".join(map(str, b))) for a, b in pairs]
    with contextlib.suppress(CheckWarned, CheckFailed):
        judge_agreement("x", as_text, lambda t: t.split())


# -- concurrency and streaming equality against stand-in servers -------------------------


def serve(monkeypatch: pytest.MonkeyPatch, streamed: Callable[[str], str]) -> None:
    """Non-streamed answers are correct; streamed (and concurrent) ones come from `streamed`."""

    def predict(url: str, prompt: str, **body: Any) -> dict[str, Any]:
        return {"output": answer(prompt), "usage": {"completion_tokens": 24}}

    def post_json(url: str, path: str, body: dict[str, Any], timeout: float = 300) -> dict:
        text = answer(body["messages"][0]["content"])
        return {"choices": [{"message": {"content": text}}]}

    monkeypatch.setattr(wire, "predict", predict)
    monkeypatch.setattr(wire, "post_json", post_json)
    monkeypatch.setattr(wire, "predict_stream", lambda url, prompt, **b: streamed(prompt))
    monkeypatch.setattr(
        wire, "chat_stream", lambda url, body: streamed(body["messages"][0]["content"])
    )


def near_tie_on(victim: str) -> Callable[[str], str]:
    """A correct batched server: the request `victim` flips a near tie late."""
    return lambda p: flipped(answer(p), 19) if victim in p else answer(p)


def test_concurrency_passes_on_a_correct_server(monkeypatch):
    serve(monkeypatch, answer)
    assert verdict("concurrency", lambda: checks.check_concurrency(ctx())) == "PASS"


def test_concurrency_warns_on_a_late_near_tie(monkeypatch):
    serve(monkeypatch, near_tie_on("number 3:"))
    result = run_check("concurrency", lambda: checks.check_concurrency(ctx()))
    assert result.verdict == "WARN" and result.passed and "near-tie" in result.detail


def test_concurrency_fails_on_garbage(monkeypatch):
    serve(monkeypatch, garbage)
    assert verdict("concurrency", lambda: checks.check_concurrency(ctx())) == "FAIL"


def test_streaming_equality_warns_on_a_near_tie_and_fails_on_garbage(monkeypatch):
    serve(monkeypatch, answer)
    assert verdict("s", lambda: checks.check_streaming_equals_non_streaming(ctx())) == "PASS"
    serve(monkeypatch, near_tie_on("sea"))
    assert verdict("s", lambda: checks.check_streaming_equals_non_streaming(ctx())) == "WARN"
    serve(monkeypatch, garbage)
    assert verdict("s", lambda: checks.check_streaming_equals_non_streaming(ctx())) == "FAIL"


# -- the long prompt ------------------------------------------------------------------------


def long_prompt_server(monkeypatch: pytest.MonkeyPatch, counted: Callable[[int], int]) -> None:
    def post_json(url: str, path: str, body: dict[str, Any], timeout: float = 300) -> dict:
        n = len(tokenize(body["prompt"]))
        return {
            "choices": [{"text": answer(str(n), 16)}],
            "usage": {"prompt_tokens": counted(n), "completion_tokens": 16},
        }

    monkeypatch.setattr(wire, "post_json", post_json)


def test_long_prompt_goes_past_max_num_tokens(monkeypatch):
    long_prompt_server(monkeypatch, lambda n: n)
    result = run_check("long", lambda: checks.check_long_prompt(ctx(max_num_tokens=64)))
    assert result.verdict == "PASS" and "(max_num_tokens 64) answered" in result.detail


def test_long_prompt_fails_when_the_server_truncates_it(monkeypatch):
    long_prompt_server(monkeypatch, lambda n: min(n, 64))  # a silent cut at max_num_tokens
    assert verdict("long", lambda: checks.check_long_prompt(ctx(max_num_tokens=64))) == "FAIL"


# -- logprobs ------------------------------------------------------------------------------


def entry(lp: float, top: list[float]) -> dict[str, Any]:
    return {
        "token": "a",
        "logprob": lp,
        "top_logprobs": [{"token": "b", "logprob": t} for t in top],
    }


def test_consistent_logprobs_pass():
    judge_logprobs([entry(-0.1, [-0.1, -2.0]), entry(-0.5, [-0.5, -0.9])], 2, 2)
    judge_logprobs([entry(-0.1, [])], 1, 0)  # top_logprobs 0: the chosen token only


def test_top_logprobs_zero_lists_none():
    with pytest.raises(CheckFailed, match="1 top_logprobs, asked for 0"):
        judge_logprobs([entry(-0.1, [-0.1])], 1, 0)


@pytest.mark.parametrize(
    ("content", "tokens", "why"),
    [
        ([entry(-0.1, [-0.1])], 2, "1 logprob entries for 2 tokens"),
        ([entry(0.5, [0.5])], 1, "not all finite and <= 0"),
        ([entry(float("nan"), [-1.0])], 1, "not all finite"),
        ([entry(-0.1, [-2.0, -0.1])], 1, "not best first"),
        ([entry(-3.0, [-0.2, -3.0])], 1, "below the best listed"),  # not the greedy token
        ([entry(-0.1, [])], 1, "0 top_logprobs"),
    ],
)
def test_inconsistent_logprobs_fail(content, tokens, why):
    with pytest.raises(CheckFailed, match=why):
        judge_logprobs(content, tokens, 2)


# -- the KV gauge --------------------------------------------------------------------------


class Stream:
    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True


def gauge_server(monkeypatch: pytest.MonkeyPatch, value: Callable[[list[Stream]], float]) -> None:
    streams: list[Stream] = []

    def open_long_stream(ctx: Context, prompt: str) -> tuple[Stream, Iterator[bytes]]:
        streams.append(Stream())
        return streams[-1], iter([b"x"])

    monkeypatch.setattr(lifecycle, "open_long_stream", open_long_stream)
    monkeypatch.setattr(wire, "kv_usage", lambda url: value(streams))


def open_count(streams: list[Stream]) -> int:
    return sum(not s.closed for s in streams)


def test_kv_gauge_rises_under_load_and_returns_to_zero(monkeypatch):
    gauge_server(monkeypatch, lambda streams: 0.01 * open_count(streams))
    result = run_check("kv", lambda: lifecycle.check_kv_gauge(ctx()))
    assert result.verdict == "PASS" and "0.0400 under 4 streams" in result.detail


def test_a_gauge_that_never_moves_fails(monkeypatch):
    gauge_server(monkeypatch, lambda streams: 0.0)
    result = run_check("kv", lambda: lifecycle.check_kv_gauge(ctx()))
    assert result.verdict == "FAIL" and "frozen gauge" in result.detail


def test_a_gauge_that_never_comes_back_fails(monkeypatch):
    gauge_server(monkeypatch, lambda streams: 0.02 if streams else 0.0)
    result = run_check("kv", lambda: lifecycle.check_kv_gauge(ctx()))
    assert result.verdict == "FAIL" and "after the streams ended" in result.detail


# -- the drain -----------------------------------------------------------------------------


REF = answer("Drain me", 48)


def drain(**kw: Any) -> Drain:
    base = {
        "in_flight": 2,
        "outcomes": [("completed", REF), ("completed", REF)],
        "references": [REF, REF],
        "drain_s": 3.0,
        "shutdown_s": 2.0,
        "grace": 20.0,
        "code": 0,
        "closed": True,
    }
    return Drain(**(base | kw))


def test_a_clean_drain_passes_with_its_times():
    detail = judge_drain(drain(), tokenize)
    assert "drained in 3.0 s, shutdown + exit 2.0 s" in detail and "4 of 4 equal" in detail


def test_a_drained_stream_with_a_late_near_tie_warns():
    with pytest.raises(CheckWarned, match="drained in 3.0 s"):
        judge_drain(drain(outcomes=[("completed", REF), ("completed", flipped(REF, 30))]), tokenize)


def test_identical_batch_mates_with_one_late_flip_warn_not_fail():
    # The two drained streams share a batch and flip the same near tie; the reference pair
    # (the same two requests at once, non-streamed) did not: every pair differs, late.
    late = flipped(REF, 30)
    both = [("completed", late), ("completed", late)]
    with pytest.raises(CheckWarned, match="2 of 4 differ"):
        judge_drain(drain(outcomes=both), tokenize)
    with pytest.raises(CheckWarned, match="3 of 4 differ"):
        judge_drain(drain(outcomes=both, references=[REF, flipped(REF, 12)]), tokenize)


@pytest.mark.parametrize(
    ("fault", "why"),
    [
        ({"outcomes": [("cut", REF[:5]), ("cut", REF[:3])], "drain_s": 0.2}, "does not let"),
        ({"outcomes": [("cut", REF[:50]), ("completed", REF)], "drain_s": 20.5}, "outlast"),
        ({"in_flight": 1}, "ended before SIGTERM"),
        ({"code": 1}, "exit 1"),
        ({"closed": False}, "still accepting"),
        ({"shutdown_s": 45.0}, "llm.shutdown"),
        ({"outcomes": [("completed", garbage("")), ("completed", REF)]}, "first 4 tokens"),
    ],
)
def test_drain_faults_fail(fault, why):
    with pytest.raises(CheckFailed, match=why):
        judge_drain(drain(**fault), tokenize)


# -- aborting a streamed request with logprobs --------------------------------------------


class Response:
    def __init__(
        self, status: int, body: dict[str, Any] | None = None, first: bytes = b"data: {}\n\n"
    ) -> None:
        self.status_code = status
        self.body = body or {}
        self.text = str(self.body)
        self.first = first

    def json(self) -> dict[str, Any]:
        return self.body

    def iter_content(self, chunk_size: int | None = None) -> Iterator[bytes]:
        yield self.first

    def close(self) -> None:
        pass


class Executor:
    """A stand-in server: `refuse_streamed` and `no_logprobs` say what it refuses,
    `dies_on_abort` makes the abort of a streamed-logprobs request kill it (upstream's
    crash with gather_generation_logits)."""

    def __init__(
        self,
        dies_on_abort=False,
        refuse_streamed=False,
        no_logprobs=False,
        refuse_in_stream=False,
        message="logprobs are refused here",
    ) -> None:
        self.refuse_in_stream = refuse_in_stream
        self.message = message
        self.dies_on_abort, self.refuse_streamed, self.no_logprobs = (
            dies_on_abort,
            refuse_streamed,
            no_logprobs,
        )
        self.aborts = 0
        self.dead = False

    def post(self, url: str, json: dict[str, Any], stream: bool = False, timeout: float = 0):
        if self.dead:
            raise ConnectionError("connection refused")
        if stream and self.refuse_in_stream:  # the engine refuses once the stream began
            return Response(200, first=b'data: {"error": {"message": "no logprobs here"}}\n\n')
        if json.get("logprobs") is not None and (
            self.no_logprobs or (stream and self.refuse_streamed)
        ):
            return Response(400, {"error": {"message": self.message}})
        if stream:
            self.aborts += 1  # the check drops it after the first chunk
            self.dead = self.dies_on_abort
            return Response(200)
        choice = {
            "text": "ok",
            "logprobs": {"tokens": ["ok"]} if json.get("logprobs") is not None else None,
        }
        return Response(200, {"choices": [choice], "usage": {"completion_tokens": 1}})

    def get(self, url: str, timeout: float = 0) -> Response:
        if self.dead:
            raise ConnectionError("connection refused")
        return Response(200)


def abort_check(monkeypatch: pytest.MonkeyPatch, executor: Executor) -> CheckResult:
    monkeypatch.setattr(wire, "_requests", lambda: executor)
    monkeypatch.setattr(wire, "aborted", lambda url: executor.aborts)
    return run_check(
        "abort_streamed_logprobs", lambda: lifecycle.check_abort_streamed_logprobs(ctx())
    )


def test_surviving_the_abort_passes_and_says_the_setting_may_be_turned_on(monkeypatch):
    result = abort_check(monkeypatch, Executor())
    assert result.verdict == "PASS" and "trtllm_logprobs_abort_safe" in result.detail
    assert "may be turned on" in result.detail


def test_a_crash_after_the_abort_fails(monkeypatch):
    result = abort_check(monkeypatch, Executor(dies_on_abort=True))
    assert result.verdict == "FAIL" and "stopped answering" in result.detail


def test_refused_streamed_logprobs_warn_with_how_to_test(monkeypatch):
    result = abort_check(monkeypatch, Executor(refuse_streamed=True))
    assert result.verdict == "WARN" and "served by engine=trtllm_pytorch" in result.detail
    setting = "logprobs need engine=trtllm_pytorch ...; trtllm_logprobs_abort_safe=true serves them"
    result = abort_check(monkeypatch, Executor(refuse_streamed=True, message=setting))
    assert result.verdict == "WARN" and "--set trtllm_logprobs_abort_safe=true" in result.detail


def test_a_kind_without_logprobs_has_nothing_to_abort(monkeypatch):
    # engine=tensorrt_llm on an engine from build.py engine: no setting can help there, so
    # the detail names the kind that serves logprobs, not the setting.
    refusal = (
        "logprobs need engine=trtllm_pytorch (serve the checkpoint): engines from build.py "
        "engine do not gather generation logits"
    )
    result = abort_check(monkeypatch, Executor(no_logprobs=True, message=refusal))
    assert result.verdict == "PASS" and "not applicable" in result.detail
    assert "served by engine=trtllm_pytorch" in result.detail and "--set" not in result.detail


# -- the driver against the image's CUDA --------------------------------------------------


def test_driver_version_is_read_from_proc():
    text = (
        "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.65.06  Release Build  "
        "(dvs-builder@U16-I3-B03-4-3)  Sun Jul 27 06:54:38 UTC 2025\nGCC version:  gcc 12\n"
    )
    assert driver_from_proc(text) == "580.65.06"
    older = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.161.08  Tue Mar  5 22:42:15 UTC"
    assert driver_from_proc(older) == "535.161.08"
    assert driver_from_proc("nothing here") is None


@pytest.mark.parametrize(
    ("driver", "cuda", "compat", "expected"),
    [
        ("580.65.06", "13.0.1", False, "PASS"),
        ("590.10", "13.0", False, "PASS"),
        ("570.124.06", "12.8.1", False, "PASS"),
        ("550.54.15", "12.8", False, "WARN"),  # minor version compatibility
        ("570.124.06", "13.0.1", True, "WARN"),  # forward-compatibility libraries
        ("570.124.06", "13.0.1", False, "FAIL"),  # the 1.2 image on an R570 node
        ("470.82", "12.4", False, "FAIL"),
        (None, "13.0", False, "WARN"),
        ("580.65.06", None, False, "WARN"),
        ("580.65.06", "14.1", False, "WARN"),  # not in the table: not judged
    ],
)
def test_driver_against_cuda(driver, cuda, compat, expected):
    assert verdict("driver", lambda: judge_driver(driver, cuda, compat)) == expected


@given(st.one_of(st.none(), st.text(max_size=20)), st.one_of(st.none(), st.text(max_size=12)))
def test_driver_judgement_takes_any_text(driver, cuda):
    with contextlib.suppress(CheckWarned, CheckFailed):
        judge_driver(driver, cuda, False)


@given(st.text(max_size=200))
def test_proc_parsing_takes_any_text(text):
    found = driver_from_proc(text)
    assert found is None or found[0].isdigit()


# -- the report ----------------------------------------------------------------------------


def test_a_warning_passes_the_run_and_shows_in_the_report(monkeypatch, tmp_path):
    from mistral_build.cli import main

    def fake_kind(kind, opts, context):
        return KindReport(
            kind,
            checks=[CheckResult("a", True, "ok"), CheckResult("b", True, "tie", warned=True)],
        )

    monkeypatch.setattr(cli, "verify_kind", fake_kind)
    monkeypatch.setattr(report, "gpu_facts", lambda: "no nvidia-smi on PATH")
    assert main(["verify-gpu", "--kind", "pytorch", "--out", str(tmp_path)]) == 0
    md = (tmp_path / "report.md").read_text()
    assert md.startswith("# verify-gpu: PASSED with 1 WARN") and "| b | WARN |" in md
    assert "| a | pass |" in md


def test_a_refusal_inside_the_stream_is_a_refusal_not_a_missing_abort(monkeypatch):
    result = abort_check(monkeypatch, Executor(refuse_in_stream=True, no_logprobs=True))
    assert result.verdict == "PASS" and "not applicable" in result.detail
    result = abort_check(monkeypatch, Executor(refuse_in_stream=True))
    assert result.verdict == "WARN" and "no logprobs here" in result.detail


# -- one budget, one driver table ---------------------------------------------------------


def test_the_shutdown_budget_is_what_the_deployment_leaves_after_the_drain():
    from mistral_build.deploy_settings import DeploySettings
    from mistral_build.verify import config

    margin = DeploySettings().shutdown_margin_seconds
    assert margin == config.SHUTDOWN_BUDGET_S
    # An exit that fits a looser budget but not the Deployment's margin fails.
    with pytest.raises(CheckFailed, match="shutdown_margin_seconds"):
        judge_drain(drain(shutdown_s=margin + 5.0), tokenize)
    judge_drain(drain(shutdown_s=margin - 1.0), tokenize)


def test_the_minimum_driver_is_the_servers_own(monkeypatch):
    from mistral_build.verify import driver as verify_driver
    from mistral_serving.ops import driver

    assert verify_driver.CUDA_MAJOR_DRIVER is driver.MIN_DRIVER
    # A change to the server's table is what the check judges by.
    monkeypatch.setitem(driver.MIN_DRIVER, 13, "575.00")
    assert verdict("driver", lambda: judge_driver("576.10", "13.0", False)) == "WARN"
    monkeypatch.setitem(driver.MIN_DRIVER, 13, "580.65.06")
    assert verdict("driver", lambda: judge_driver("576.10", "13.0", False)) == "FAIL"


# -- tensorrt_llm on this GPU (the image build only reads its metadata) -------------------


def fake_trtllm(tmp_path, monkeypatch, init: str) -> None:
    package = tmp_path / "tensorrt_llm"
    package.mkdir()
    (package / "__init__.py").write_text(init)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))


def test_tensorrt_llm_must_import_here(tmp_path, monkeypatch):
    from mistral_build.verify.driver import check_trtllm_import

    fake_trtllm(tmp_path, monkeypatch, "raise RuntimeError('CUDA driver version is insufficient')")
    result = run_check("tensorrt_llm_import", check_trtllm_import)
    assert result.verdict == "FAIL" and "CUDA driver version is insufficient" in result.detail


@pytest.mark.parametrize(("version", "expected"), [("1.2.1", "PASS"), ("1.3.0rc14", "WARN")])
def test_tensorrt_llm_import_names_its_version(tmp_path, monkeypatch, version, expected):
    from mistral_build.verify.driver import check_trtllm_import

    fake_trtllm(tmp_path, monkeypatch, f"print('[TensorRT-LLM] banner')\n__version__ = {version!r}")
    result = run_check("tensorrt_llm_import", check_trtllm_import)
    assert result.verdict == expected and f"tensorrt_llm {version} imports" in result.detail
