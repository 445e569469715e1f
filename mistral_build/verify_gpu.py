"""`python build.py verify-gpu`: the whole serving path checked on this machine in one command.

For each engine kind asked for it
1. makes the artifact: a tiny Mistral-shaped checkpoint with random weights (the dev
   model's code, two layers, head_dim 64, float16) and, for `tensorrt_llm`, an engine built
   from it by the same code as `build.py engine` (checkpoint conversion + `trtllm-build`
   subprocesses; minutes, no download);
2. starts the real Truss server on it (`local_server.LocalServer`, as `make serve`'s
   launcher and the end-to-end tests do);
3. runs engine-agnostic end-to-end checks over HTTP, each a plain function returning
   pass, WARN or FAIL and a detail line (the NVIDIA driver against the image's CUDA,
   streaming equals non-streaming, stop strings, penalties, concurrency, a prompt longer
   than max_num_tokens, logprobs, the KV-cache gauge, abort on disconnect, abort of a
   streamed-logprobs request, 429 past the queue, /health and /v1/models), a short
   benchmark (`client.bench.run_bench`), and last the drain on SIGTERM, timed;
4. writes one report (report.json and report.md: checks, figures, versions, GPU) and exits
   1 if any check failed (a WARN does not fail it).

Random weights have near-tied logits: batch-size-dependent kernels flip a greedy choice now
and then on a correct stack, and the continuation then differs. So greedy answers are
compared by token-prefix agreement (`judge_agreement`): all equal is a pass; pairs that
differ are a WARN (near ties) unless more than a quarter of the pairs differ within their
first MIN_AGREE_TOKENS tokens, or more than half of them differ at all: then a FAIL. TensorRT-LLM's KV block reuse is turned off for the
run (`trtllm_kv_block_reuse=false`) so equal requests take the same kernels.

Kinds: `tensorrt_llm` (TensorRT engine), `trtllm_pytorch` (TensorRT-LLM's PyTorch backend
on the checkpoint; no build), `all` (both), and `pytorch` (the dev model on our own PyTorch
engine, CPU: how CI runs this script without a GPU).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import platform
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any, Literal

from mistral_build.local_server import LocalServer, raw_post, wait_ready
from mistral_build.paths import CACHE_DIR, DEV_MODEL_DIR

Kind = Literal["tensorrt_llm", "trtllm_pytorch", "pytorch"]
KIND_CHOICES = ("tensorrt_llm", "trtllm_pytorch", "all", "pytorch")
GPU_KINDS: tuple[Kind, ...] = ("tensorrt_llm", "trtllm_pytorch")
DEFAULT_OUT = CACHE_DIR / "verify-gpu"

# The tiny checkpoint: the dev model's vocabulary and tokenizer (Mistral's own), with
# shapes TensorRT-LLM's attention kernels take (head_dim 64; the dev model's 16 is not
# among them) and Mistral-7B's context, so long streams last long enough on a fast GPU.
TINY_SHAPE: dict[str, object] = {
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 32768,
}
TINY_DTYPE = "float16"
# Engine limits: what the checks need, small enough to build in a couple of minutes.
ENGINE_LIMITS = {
    "max_batch_size": 16,
    "max_input_len": 8192,
    "max_seq_len": 32768,
    # Below max_input_len: the long-prompt check sends a prompt longer than this, which
    # only chunked prefill serves.
    "max_num_tokens": 2048,
}

# Server settings every kind gets (model_metadata keys): small admission limits so the
# 429 check fills them with a handful of streams; a grace period the drain check can wait.
MAX_INFLIGHT = 8
MAX_WAITING = 2
DRAIN_GRACE_S = 20.0
COMMON_SETTINGS = {
    "max_inflight": str(MAX_INFLIGHT),
    "max_waiting": str(MAX_WAITING),
    "drain_grace_seconds": str(DRAIN_GRACE_S),
    "metrics_names": "mtt",
}
# The tiny model needs little KV cache; the default 0.9 of free GPU memory takes long to
# allocate on a large GPU for nothing.
# Block reuse off: a request whose prefix is cached runs other kernels than one that is
# not, which flips greedy near-ties between otherwise equal requests.
GPU_SETTINGS = {"kv_cache_free_gpu_memory_fraction": "0.2", "trtllm_kv_block_reuse": "false"}
# Prompt tokens per engine step, per kind (the server setting max_num_tokens; the
# tensorrt_llm kind's comes from the engine it serves): the long-prompt check goes past it.
MAX_NUM_TOKENS = {"tensorrt_llm": 2048, "trtllm_pytorch": 2048, "pytorch": 64}
# The near-tie tolerance (judge_agreement): a flip is rare per token (random weights: the
# top two logits of 32,000 are seldom closer than the kernels' rounding), so a few pairs
# that differ, late, are near ties; many, or early, are a broken server.
MIN_AGREE_TOKENS = 4
# After the drain, the engine's shutdown (llm.shutdown()) and the process exit must take
# no longer than this: Kubernetes' terminationGracePeriodSeconds must cover grace + this.
SHUTDOWN_BUDGET_S = 30.0

PREDICT = "/v1/models/model:predict"
# uvicorn re-raises the SIGTERM it handled after a graceful shutdown: -15 from Popen.
EXITED_ON_SIGTERM = (0, -signal.SIGTERM)


# ---------------------------------------------------------------------------------------
# Results


@dataclass
class CheckResult:
    name: str
    passed: bool
    detail: str
    seconds: float = 0.0
    # Passed, with a difference a correct stack can show (a near tie) or a part it could
    # not test here: the detail says which. Never fails the run.
    warned: bool = False

    @property
    def verdict(self) -> str:
        return "FAIL" if not self.passed else "WARN" if self.warned else "PASS"


@dataclass
class KindReport:
    kind: str
    artifact: str | None = None
    build: dict[str, Any] = field(default_factory=dict)
    server: dict[str, Any] = field(default_factory=dict)
    checks: list[CheckResult] = field(default_factory=list)
    bench: dict[str, Any] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return bool(self.checks) and all(c.passed for c in self.checks)

    @property
    def warnings(self) -> int:
        return sum(c.passed and c.warned for c in self.checks)


class CheckFailed(Exception):
    """A check's expectation did not hold; the message is the report's detail line."""


class CheckWarned(Exception):
    """The check passed with a reservation (near tie, untestable part); the message says it."""


def run_check(name: str, fn: Callable[[], str]) -> CheckResult:
    """Run one check: it returns its detail line when it passes, raises CheckWarned to pass
    with a warning and anything else to fail."""
    started = time.monotonic()
    warned = False
    try:
        detail, passed = fn(), True
    except CheckWarned as exc:
        detail, passed, warned = str(exc), True, True
    except Exception as exc:  # any failure is this check's result, never a traceback
        kind = "" if isinstance(exc, CheckFailed) else f"{type(exc).__name__}: "
        detail, passed = f"{kind}{exc}", False
    result = CheckResult(name, passed, detail, round(time.monotonic() - started, 2), warned)
    print(f"  [{result.verdict}] {name}: {detail}", flush=True)
    return result


# ---------------------------------------------------------------------------------------
# HTTP helpers (plain `requests`: the checks control connections themselves)


def _requests():
    import requests

    return requests


def post_json(url: str, path: str, body: dict[str, Any], timeout: float = 300) -> dict[str, Any]:
    r = _requests().post(url + path, json=body, timeout=timeout)
    if r.status_code != 200:
        raise CheckFailed(f"POST {path} -> {r.status_code}: {r.text[:300]}")
    return r.json()


def predict(url: str, **body: Any) -> dict[str, Any]:
    return post_json(url, PREDICT, body)


def predict_stream(url: str, **body: Any) -> str:
    with _requests().post(
        url + PREDICT, json=body | {"streaming": True}, stream=True, timeout=300
    ) as r:
        if r.status_code != 200:
            raise CheckFailed(f"streaming predict -> {r.status_code}: {r.text[:300]}")
        return b"".join(c for c in r.iter_content(chunk_size=None) if c).decode()


def chat_stream(url: str, body: dict[str, Any]) -> str:
    """The content deltas of a streamed /v1/chat/completions, joined."""
    parts: list[str] = []
    with _requests().post(
        url + "/v1/chat/completions", json=body | {"stream": True}, stream=True, timeout=300
    ) as r:
        if r.status_code != 200:
            raise CheckFailed(f"streaming chat -> {r.status_code}: {r.text[:300]}")
        for line in r.iter_lines():
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            for choice in json.loads(line[6:]).get("choices") or []:
                parts.append((choice.get("delta") or {}).get("content") or "")
    return "".join(parts)


def scrape(url: str) -> list[tuple[str, dict[str, str], float]]:
    from prometheus_client.parser import text_string_to_metric_families

    text = _requests().get(url + "/metrics", timeout=10).text
    return [
        (s.name, dict(s.labels), s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]


def metric_sum(url: str, name: str, **labels: str) -> float:
    """Sum of the samples of `name` whose labels include `labels` (e.g. every route)."""
    return sum(
        v
        for n, lab, v in scrape(url)
        if n == name and all(lab.get(k) == val for k, val in labels.items())
    )


def running(url: str) -> float:
    return metric_sum(url, "mtt:num_requests_running")


def waiting(url: str) -> float:
    return metric_sum(url, "mtt:num_requests_waiting")


def aborted(url: str) -> float:
    return metric_sum(url, "mtt:request_finished_total", finished_reason="abort")


def wait_until(check: Callable[[], bool], timeout: float, interval: float = 0.1) -> bool:
    """Poll `check` until it holds or `timeout` passes (server state changes asynchronously)."""
    deadline = time.monotonic() + timeout
    while True:
        if check():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


# ---------------------------------------------------------------------------------------
# Comparing greedy answers: token-prefix agreement with a near-tie tolerance


@dataclass(frozen=True)
class Agreement:
    """How two greedy answers to the same request compare, in tokens."""

    common: int  # tokens they share from the start
    lengths: tuple[int, int]

    @property
    def same(self) -> bool:
        return self.common == self.lengths[0] == self.lengths[1]

    @property
    def early(self) -> bool:
        """They differ within the first MIN_AGREE_TOKENS tokens (one ending early, by EOS,
        where the other goes on, counts as agreeing that far)."""
        return not self.same and self.common < min(MIN_AGREE_TOKENS, *self.lengths)


def agreement(reference: list[int], got: list[int]) -> Agreement:
    common = len(os.path.commonprefix([reference, got]))
    return Agreement(common, (len(reference), len(got)))


def judge_agreement(
    what: str, pairs: list[tuple[str, str]], tokenize: Callable[[str], list[int]]
) -> str:
    """(reference, other) greedy answers of equal requests. All equal: the pass detail.
    Near ties (a few pairs differ, late): CheckWarned. More than a quarter of the pairs
    differing within MIN_AGREE_TOKENS tokens, or more than half differing at all (with two
    or more pairs): CheckFailed."""
    n = len(pairs)
    found = [agreement(tokenize(a), tokenize(b)) for a, b in pairs]
    differ = [i for i, a in enumerate(found) if not a.same]
    if not differ:
        return f"{what}: {n} of {n} equal"
    early = [i for i in differ if found[i].early]
    where = "; ".join(
        f"#{i}: first {found[i].common} of {min(found[i].lengths)} tokens agree" for i in differ[:4]
    )
    summary = f"{what}: {len(differ)} of {n} differ ({where})"
    if len(early) > n // 4:
        raise CheckFailed(
            f"{summary}: {len(early)} differ within their first {MIN_AGREE_TOKENS} tokens "
            "(more than a near tie: wrong or garbled output)"
        )
    if n >= 2 and len(differ) * 2 > n:
        raise CheckFailed(f"{summary}: more than half differ (more than near ties)")
    raise CheckWarned(
        f"{summary}; within the near-tie tolerance (agree on the first {MIN_AGREE_TOKENS}+ "
        "tokens): random weights flip greedy near-ties between batch sizes"
    )


def make_tokenize(artifact: str | None) -> Callable[[str], list[int]]:
    """The artifact's tokenizer (mistral_serving's loader, as the server reads it); UTF-8
    bytes if it has none (the comparison then counts bytes, which is stricter)."""
    if artifact:
        try:
            from mistral_serving.text.tokenizer import load_tokenizer

            tokenizer = load_tokenizer(Path(artifact))
            return tokenizer.encode
        except Exception as exc:  # no tokenizer files: compare bytes
            print(f"  (comparing answers by bytes: no tokenizer in {artifact}: {exc})")
    return lambda text: list(text.encode())


# ---------------------------------------------------------------------------------------
# The checks. Each takes the context and returns its detail line, or raises CheckFailed.


@dataclass
class Context:
    url: str
    expected_engine: str
    model: str = "model"  # served model name, from /v1/models
    max_model_len: int = 0
    concurrency: int = MAX_INFLIGHT
    max_inflight: int = MAX_INFLIGHT
    max_waiting: int = MAX_WAITING
    long_tokens: int = 4000  # a stream that outlasts the checks that hold it
    drain_tokens: int = 512
    max_num_tokens: int = MAX_NUM_TOKENS["pytorch"]  # prompt tokens per engine step
    # Text -> token ids, to compare greedy answers by tokens (the artifact's tokenizer).
    tokenize: Callable[[str], list[int]] = field(default=lambda text: list(text.encode()))


GREEDY = {"top_k": 1, "temperature": 1.0}


def check_health_and_models(ctx: Context) -> str:
    requests = _requests()
    health = requests.get(ctx.url + "/health", timeout=10)
    if health.status_code != 200:
        raise CheckFailed(f"/health -> {health.status_code}")
    models = requests.get(ctx.url + "/v1/models", timeout=10)
    if models.status_code != 200:
        raise CheckFailed(f"/v1/models -> {models.status_code}: {models.text[:200]}")
    data = models.json().get("data") or []
    if len(data) != 1 or not data[0].get("id"):
        raise CheckFailed(f"/v1/models lists {data!r}; expected one model")
    ctx.model = data[0]["id"]
    ctx.max_model_len = int(data[0].get("max_model_len") or 0)
    engine = requests.get(ctx.url + "/version", timeout=10).json().get("engine")
    if engine != ctx.expected_engine:
        raise CheckFailed(f"/version says engine {engine!r}, expected {ctx.expected_engine!r}")
    return (
        f"/health 200; /v1/models: {ctx.model} (max_model_len {ctx.max_model_len}); engine {engine}"
    )


def check_streaming_equals_non_streaming(ctx: Context) -> str:
    """Streamed and non-streamed greedy answers of predict and chat, token-prefix compared."""
    body = {"prompt": "Write about the sea", "max_new_tokens": 48, "streaming_interval": 1}
    body |= GREEDY
    full = predict(ctx.url, **body)
    streamed = predict_stream(ctx.url, **body)
    chat = {
        "model": ctx.model,
        "messages": [{"role": "user", "content": "Tell me about lighthouses."}],
        "max_tokens": 48,
        "temperature": 0,
    }
    message = post_json(ctx.url, "/v1/chat/completions", chat)["choices"][0]["message"]
    joined = chat_stream(ctx.url, chat)
    pairs = [(full["output"], streamed), (message.get("content") or "", joined)]
    return (
        judge_agreement("predict and chat, streamed vs not", pairs, ctx.tokenize)
        + f" ({full['usage']['completion_tokens']} predict tokens)"
    )


def check_stop_strings(ctx: Context) -> str:
    base = {"prompt": "Once upon a time", "max_new_tokens": 48} | GREEDY
    full = predict(ctx.url, **base)["output"]
    if len(full.strip()) < 6:
        raise CheckFailed(f"the greedy answer {full!r} is too short to pick a stop string from")
    mid = len(full) // 2
    stop = full[mid : mid + 3]
    cut = full[: full.index(stop)]
    r = predict(ctx.url, **base, stop=[stop])
    if r["output"] != cut or r["finish_reason"] != "stop":
        raise CheckFailed(
            f"stop={stop!r}: got {r['output']!r} ({r['finish_reason']}), expected {cut!r} (stop)"
        )
    streamed = predict_stream(ctx.url, **base, stop=[stop], streaming_interval=1)
    if streamed != cut:
        raise CheckFailed(f"stop={stop!r} streamed: got {streamed!r}, expected {cut!r}")
    return (
        f"stop={stop!r} ends the output before it ({len(cut)} of {len(full)} chars), streamed too"
    )


def check_penalties(ctx: Context) -> str:
    # A random model repeats itself within ~100 tokens; penalties only count output tokens.
    base = {"prompt": "The the the the the", "max_new_tokens": 160} | GREEDY
    plain = predict(ctx.url, **base)["output"]
    changed = []
    for name in ("presence_penalty", "frequency_penalty"):
        out = predict(ctx.url, **base, **{name: 2.0})["output"]  # CheckFailed unless 200
        changed.append((name, out != plain))
    unchanged = [n for n, c in changed if not c]
    if unchanged:
        raise CheckFailed(
            f"accepted, but {' and '.join(unchanged)}=2.0 left the greedy output unchanged "
            "(the engine ignores it)"
        )
    return "presence_penalty=2.0 and frequency_penalty=2.0 each change the greedy output"


def check_concurrency(ctx: Context) -> str:
    """n greedy streams at once vs the same requests one at a time (other batch sizes)."""
    n = ctx.concurrency
    prompts = [f"Question number {i}: why is the sky blue?" for i in range(n)]
    body = {"max_new_tokens": 32, "streaming_interval": 1} | GREEDY
    sequential = [predict(ctx.url, prompt=p, **body)["output"] for p in prompts]
    with ThreadPoolExecutor(n) as pool:
        together = list(pool.map(lambda p: predict_stream(ctx.url, prompt=p, **body), prompts))
    return judge_agreement(
        f"{n} concurrent greedy streams vs sequential",
        list(zip(sequential, together, strict=True)),
        ctx.tokenize,
    )


def check_long_prompt(ctx: Context) -> str:
    """A prompt longer than max_num_tokens (the prompt tokens one engine step takes): only
    chunked prefill serves it. It must be answered, counted right, and the same greedy
    answer twice."""
    target = ctx.max_num_tokens + ctx.max_num_tokens // 2 + 8
    if ctx.max_model_len and target + 16 > ctx.max_model_len:
        raise CheckWarned(
            f"not tested: max_num_tokens {ctx.max_num_tokens} leaves no room under "
            f"max_model_len {ctx.max_model_len}"
        )
    words = "The lighthouse keeper counted the waves again and again. "
    per = max(1, len(ctx.tokenize(words)))
    prompt = words * (target // per + 1)
    body = {"model": ctx.model, "prompt": prompt, "max_tokens": 16, "temperature": 0}
    first = post_json(ctx.url, "/v1/completions", body)
    used = first["usage"]["prompt_tokens"]
    if used <= ctx.max_num_tokens:
        raise CheckFailed(
            f"the prompt counted {used} tokens, not more than max_num_tokens "
            f"{ctx.max_num_tokens}: the check did not test chunked prefill"
        )
    if first["usage"]["completion_tokens"] < 1:
        raise CheckFailed(f"a {used}-token prompt got no completion tokens: {first['usage']}")
    again = post_json(ctx.url, "/v1/completions", body)
    pair = [(first["choices"][0]["text"], again["choices"][0]["text"])]
    verdict = judge_agreement("answered twice", pair, ctx.tokenize)
    return f"{used}-token prompt (max_num_tokens {ctx.max_num_tokens}) answered; {verdict}"


# The server setting (engine=tensorrt_llm, off by default) that serves logprobs although an
# aborted request with logprobs crashed TensorRT-LLM 1.1.0 / 1.2.0rc7.
ABORT_SAFE_SETTING = "trtllm_logprobs_abort_safe"
LOGPROB_TOLERANCE = 1e-3  # the greedy token's logprob against the best listed (rounding)


def check_logprobs(ctx: Context) -> str:
    """Chat logprobs with top_logprobs 2, then 1, then 0: one entry per generated token, finite
    logprobs <= 0, the top list sorted, and the greedy token the best of it. A clear 4xx
    refusal (a kind or sampler that cannot) passes, with what was refused."""
    notes: list[str] = []
    # 0: the chosen token's logprob only (all a TRTLLMSampler returns: trtllm_sampler=trtllm).
    for k in (2, 1, 0):
        body = {
            "model": ctx.model,
            "messages": [{"role": "user", "content": "Name a colour."}],
            "max_tokens": 8,
            "temperature": 0,
            "logprobs": True,
            "top_logprobs": k,
        }
        r = _requests().post(ctx.url + "/v1/chat/completions", json=body, timeout=300)
        if 400 <= r.status_code < 500:
            notes.append(f"top_logprobs={k} refused ({r.status_code}: {_error_text(r)})")
            continue
        if r.status_code != 200:
            raise CheckFailed(f"logprobs top_logprobs={k} -> {r.status_code}: {r.text[:200]}")
        answer = r.json()
        content = ((answer["choices"][0].get("logprobs") or {}).get("content")) or []
        judge_logprobs(content, answer["usage"]["completion_tokens"], k)
        notes.append(f"top_logprobs={k}: {len(content)} tokens, consistent")
        return "; ".join(notes)
    # Every form refused: a clear answer, nothing to check the values of.
    return "; ".join(notes) + " (this kind returns no logprobs: stated refusals, no 500)"


def judge_logprobs(content: list[dict[str, Any]], completion_tokens: int, k: int) -> None:
    """OpenAI chat `logprobs.content` of a greedy answer; CheckFailed says what is wrong."""
    import math

    if len(content) != completion_tokens:
        raise CheckFailed(f"{len(content)} logprob entries for {completion_tokens} tokens")
    for i, entry in enumerate(content):
        lp = entry.get("logprob")
        top = [t.get("logprob") for t in entry.get("top_logprobs") or []]
        values = [lp, *top]
        if not all(isinstance(v, (int, float)) and math.isfinite(v) and v <= 0 for v in values):
            raise CheckFailed(f"token {i}: logprobs {values} are not all finite and <= 0")
        if not min(1, k) <= len(top) <= k:
            raise CheckFailed(f"token {i}: {len(top)} top_logprobs, asked for {k}")
        if not top:
            continue
        if top != sorted(top, reverse=True):
            raise CheckFailed(f"token {i}: top_logprobs {top} not best first")
        if lp < top[0] - LOGPROB_TOLERANCE:
            raise CheckFailed(
                f"token {i}: the greedy token's logprob {lp:.4f} is below the best listed "
                f"{top[0]:.4f}: logprobs do not belong to the sampled tokens"
            )


def _stream_error(chunk: bytes) -> str | None:
    """The message of an SSE `data: {"error": ...}` event at the start of `chunk`."""
    for line in chunk.split(b"\n"):
        if line.startswith(b"data: {"):
            try:
                error = json.loads(line[6:]).get("error")
            except ValueError:
                return None
            if error:
                return str(error.get("message") if isinstance(error, dict) else error)[:160]
            return None
    return None


def _error_text(r: Any) -> str:
    try:
        error = r.json().get("error")
    except ValueError:
        return r.text[:160]
    return str(error.get("message") if isinstance(error, dict) else error)[:160]


def kv_usage(url: str) -> float:
    return metric_sum(url, "mtt:kv_cache_usage_perc")


def check_kv_gauge(ctx: Context) -> str:
    """The KV-cache gauge (what the Inference Gateway routes on) is 0 when idle, rises while
    streams hold cache, and returns to 0 when they end."""
    if not wait_until(lambda: kv_usage(ctx.url) == 0, 30):
        raise CheckFailed(f"kv_cache_usage_perc {kv_usage(ctx.url)} with nothing running")
    held: list[Any] = []
    peak = 0.0

    def risen() -> bool:
        nonlocal peak
        peak = max(peak, kv_usage(ctx.url))
        return peak > 0

    try:
        for i in range(min(4, ctx.max_inflight)):
            held.append(open_long_stream(ctx, f"Fill the cache {i}"))
        if not wait_until(risen, 30):
            raise CheckFailed(
                f"kv_cache_usage_perc stayed 0 with {len(held)} streams running (frozen gauge)"
            )
    finally:
        for stream, _reader in held:
            stream.close()
    if not wait_until(lambda: kv_usage(ctx.url) == 0, 60):
        raise CheckFailed(
            f"kv_cache_usage_perc rose to {peak:.4f} but stayed at {kv_usage(ctx.url):.4f} "
            "after the streams ended"
        )
    return f"0 idle, {peak:.4f} under {len(held)} streams, back to 0 after"


def long_stream_body(ctx: Context, prompt: str) -> dict[str, Any]:
    """A completions stream that runs to max_tokens whatever the model says (ignore_eos)."""
    room = ctx.max_model_len - 64 if ctx.max_model_len else ctx.long_tokens
    return {
        "model": ctx.model,
        "prompt": prompt,
        "max_tokens": max(16, min(ctx.long_tokens, room)),
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
    }


def open_long_stream(ctx: Context, prompt: str) -> tuple[Any, Iterator[bytes]]:
    """A started stream (its first chunk read): the request is in the engine. The reader
    is returned too: dropping it closes the connection, which aborts the request."""
    r = _requests().post(
        ctx.url + "/v1/completions", json=long_stream_body(ctx, prompt), stream=True, timeout=300
    )
    if r.status_code != 200:
        raise CheckFailed(f"long stream -> {r.status_code}: {r.text[:200]}")
    reader = r.iter_content(chunk_size=None)
    if not next(reader, b""):
        raise CheckFailed("a long stream ended before its first chunk")
    return r, reader


def check_abort_on_disconnect(ctx: Context) -> str:
    before = aborted(ctx.url)
    stream, _reader = open_long_stream(ctx, "A very long story")
    stream.close()
    if not wait_until(lambda: aborted(ctx.url) >= before + 1, 30):
        raise CheckFailed(
            "the client left mid-stream but no request finished with 'abort' within 30 s "
            "(did the stream run to its end first?)"
        )
    if not wait_until(lambda: running(ctx.url) == 0, 30):
        raise CheckFailed(f"running gauge stuck at {running(ctx.url)} after the abort")
    after = predict(ctx.url, prompt="after", max_new_tokens=2)
    return f"disconnect -> finish 'abort', running gauge back to 0, next request {after['finish_reason']}"


def check_abort_streamed_logprobs(ctx: Context) -> str:
    """Abort (disconnect) a streaming request that asked for logprobs, then the server must
    keep answering. Upstream TensorRT-LLM 1.1.0 and 1.2.0rc7 crash the executor there with
    gather_generation_logits on; where this passes, streamed logprobs are safe on the kind."""
    probe = {"model": ctx.model, "prompt": "Probe", "max_tokens": 2, "temperature": 0}
    body = long_stream_body(ctx, "Abort me with logprobs") | {"logprobs": 0}
    before = aborted(ctx.url)
    r = _requests().post(ctx.url + "/v1/completions", json=body, stream=True, timeout=300)
    first = next(r.iter_content(chunk_size=None), b"") if r.status_code == 200 else b""
    # A refusal arrives as a 4xx, or (raised by the engine once the stream began) as the
    # stream's first event: an OpenAI error object.
    streamed_error = _stream_error(first)
    if 400 <= r.status_code < 500 or streamed_error:
        refusal = streamed_error or _error_text(r)
        r.close()
        plain = _requests().post(
            ctx.url + "/v1/completions", json=probe | {"logprobs": 0}, timeout=300
        )
        # engine=tensorrt_llm refuses logprobs unless trtllm_logprobs_abort_safe is on (and
        # the engine gathers generation logits): this check is what may turn it on.
        rerun = f"rerun with --set {ABORT_SAFE_SETTING}=true to test the abort"
        if 400 <= plain.status_code < 500:
            return (
                f"not applicable: this server returns no logprobs ({_error_text(plain)}); "
                f"for an engine built with gather_generation_logits, {rerun}"
            )
        raise CheckWarned(
            f"streamed logprobs refused on this kind ({refusal}): not tested; {rerun}"
        )
    if r.status_code != 200:
        raise CheckFailed(f"streamed logprobs -> {r.status_code}: {r.text[:200]}")
    if not first:
        raise CheckFailed("the streamed-logprobs request ended before its first chunk")
    r.close()
    if not wait_until(lambda: aborted(ctx.url) >= before + 1, 30):
        raise CheckFailed("the client left the streamed-logprobs request but no abort was counted")
    try:
        after = post_json(ctx.url, "/v1/completions", probe, timeout=60)
        again = post_json(ctx.url, "/v1/completions", probe | {"logprobs": 0}, timeout=60)
        ready = _requests().get(ctx.url + "/v1/models/model", timeout=10).status_code
    except CheckFailed as exc:
        raise CheckFailed(f"after the abort: {exc} (the executor died?)") from None
    except Exception as exc:
        raise CheckFailed(f"after the abort the server stopped answering: {exc}") from None
    if ready != 200:
        raise CheckFailed(f"after the abort the server is not ready ({ready})")
    if not after["usage"]["completion_tokens"] or not again["choices"][0].get("logprobs"):
        raise CheckFailed(f"after the abort: answers without tokens or logprobs: {again}")
    return (
        "a streamed request with logprobs was aborted and the server kept answering (with "
        f"logprobs, ready 200): logprobs survive an abort here, so {ABORT_SAFE_SETTING} "
        "(engine=tensorrt_llm) may be turned on for this release"
    )


def check_overload_429(ctx: Context) -> str:
    held: list[Any] = []
    waiters: list[socket.socket] = []
    try:
        for i in range(ctx.max_inflight):
            held.append(open_long_stream(ctx, f"Hold slot {i}"))
        if not wait_until(lambda: running(ctx.url) == ctx.max_inflight, 30):
            raise CheckFailed(f"{running(ctx.url)} running, expected {ctx.max_inflight}")
        for _ in range(ctx.max_waiting):
            waiters.append(raw_post(ctx.url, PREDICT, {"prompt": "wait", "max_new_tokens": 4}))
        if not wait_until(lambda: waiting(ctx.url) == ctx.max_waiting, 30):
            raise CheckFailed(f"{waiting(ctx.url)} waiting, expected {ctx.max_waiting}")
        r = _requests().post(
            ctx.url + PREDICT, json={"prompt": "one too many", "max_new_tokens": 4}, timeout=30
        )
        still = running(ctx.url)
        if r.status_code != 429:
            raise CheckFailed(f"request past max_inflight+max_waiting got {r.status_code}")
        if still != ctx.max_inflight:
            raise CheckFailed(
                f"the held streams ended before the check finished ({still} running): "
                "raise --long-tokens"
            )
        retry = r.headers.get("retry-after")
        if not retry:
            raise CheckFailed("429 without a Retry-After header")
    finally:
        for sock in waiters:
            sock.close()
        for stream, _reader in held:
            stream.close()
    if not wait_until(lambda: running(ctx.url) == 0 and waiting(ctx.url) == 0, 60):
        raise CheckFailed("running/waiting gauges did not return to 0 after the streams closed")
    return (
        f"{ctx.max_inflight} running + {ctx.max_waiting} waiting: the next request got 429 "
        f"(Retry-After {retry}); gauges back to 0"
    )


def check_drain_on_sigterm(ctx: Context, process: subprocess.Popen, grace: float) -> str:
    """Last: SIGTERM with streams in flight. Each stream must complete within the grace
    period (its answer token-prefix compared with the non-streamed one), the listener close,
    and the engine shut down (llm.shutdown()) and the process exit soon after: both timed."""
    requests = _requests()
    body = {"prompt": "Drain me", "max_new_tokens": ctx.drain_tokens, "streaming_interval": 1}
    body |= GREEDY
    reference = predict(ctx.url, **body)["output"]
    streams = [
        requests.post(ctx.url + PREDICT, json=body | {"streaming": True}, stream=True, timeout=300)
        for _ in range(2)
    ]
    readers = [s.iter_content(chunk_size=None) for s in streams]
    firsts = [next(reader, b"") for reader in readers]
    in_flight = running(ctx.url)
    started = time.monotonic()
    process.send_signal(signal.SIGTERM)
    outcomes: list[tuple[str, str]] = []
    for first, reader in zip(firsts, readers, strict=True):
        got = bytearray(first)
        try:
            for chunk in reader:
                got += chunk
            outcomes.append(("completed", got.decode(errors="replace")))
        except requests.exceptions.ChunkedEncodingError:  # no closing chunk: visibly cut
            outcomes.append(("cut", got.decode(errors="replace")))
    drained = time.monotonic() - started
    closed = wait_until(lambda: not _accepts(ctx.url), 10)
    try:
        code = process.wait(max(1.0, grace + SHUTDOWN_BUDGET_S - drained))
    except subprocess.TimeoutExpired:
        raise CheckFailed(
            f"still running {grace + SHUTDOWN_BUDGET_S:.0f} s after SIGTERM (grace {grace:.0f} s "
            f"+ {SHUTDOWN_BUDGET_S:.0f} s for llm.shutdown() and the exit)"
        ) from None
    took = time.monotonic() - started
    return judge_drain(
        Drain(in_flight, outcomes, reference, drained, took - drained, grace, code, closed),
        ctx.tokenize,
    )


@dataclass
class Drain:
    """What the drain check saw, for `judge_drain`."""

    in_flight: float  # running at SIGTERM
    outcomes: list[tuple[str, str]]  # ("completed" | "cut", text) per stream
    reference: str  # the non-streamed answer to the same request
    drain_s: float  # SIGTERM -> the last stream ended
    shutdown_s: float  # the last stream ended -> the process exited (llm.shutdown() in it)
    grace: float
    code: int | None
    closed: bool  # the listener stopped accepting connections


def judge_drain(d: Drain, tokenize: Callable[[str], list[int]]) -> str:
    states = [state for state, _ in d.outcomes]
    summary = (
        f"{d.in_flight:.0f} in flight at SIGTERM; streams: {', '.join(states)}; drained in "
        f"{d.drain_s:.1f} s, shutdown + exit {d.shutdown_s:.1f} s (exit {d.code}; grace "
        f"{d.grace:.0f} s)"
    )
    if d.in_flight < 2:
        raise CheckFailed(f"{summary}: the streams ended before SIGTERM: raise --drain-tokens")
    if "cut" in states:
        why = (
            "the streams outlast the grace period: lower --drain-tokens"
            if d.drain_s >= d.grace
            else "cut before the grace period ended: the drain does not let requests finish"
        )
        raise CheckFailed(f"{summary}: {why}")
    if d.code not in EXITED_ON_SIGTERM or not d.closed:
        raise CheckFailed(summary + ("" if d.closed else "; still accepting connections"))
    if d.shutdown_s > SHUTDOWN_BUDGET_S:
        raise CheckFailed(
            f"{summary}: the exit came {d.shutdown_s:.1f} s after the drain, more than "
            f"{SHUTDOWN_BUDGET_S:.0f} s (llm.shutdown() hangs?)"
        )
    pairs = [(d.reference, text) for _, text in d.outcomes]
    try:
        return f"{summary}; {judge_agreement('drained vs non-streamed', pairs, tokenize)}"
    except CheckWarned as warned:
        raise CheckWarned(f"{summary}; {warned}") from None


def _accepts(url: str) -> bool:
    try:
        _requests().get(url + "/v1/models/model", timeout=2)
        return True
    except Exception:
        return False


CHECKS: list[tuple[str, Callable[[Context], str]]] = [
    ("health_and_models", check_health_and_models),
    ("streaming_equals_non_streaming", check_streaming_equals_non_streaming),
    ("stop_strings", check_stop_strings),
    ("penalties", check_penalties),
    ("concurrency", check_concurrency),
    ("long_prompt", check_long_prompt),
    ("logprobs", check_logprobs),
    ("kv_gauge", check_kv_gauge),
    ("abort_on_disconnect", check_abort_on_disconnect),
    ("abort_streamed_logprobs", check_abort_streamed_logprobs),
    ("overload_429", check_overload_429),
]


# ---------------------------------------------------------------------------------------
# The NVIDIA driver against the image's CUDA (no server needed)

# CUDA toolkit (major, minor) -> the Linux x86_64 driver its release needs (CUDA Toolkit
# release notes, "CUDA Toolkit and Corresponding Driver Versions", the GA releases).
CUDA_TOOLKIT_DRIVER: dict[tuple[int, int], str] = {
    (12, 0): "525.60.13",
    (12, 1): "530.30.02",
    (12, 2): "535.54.03",
    (12, 3): "545.23.06",
    (12, 4): "550.54.14",
    (12, 5): "555.42.02",
    (12, 6): "560.28.03",
    (12, 8): "570.26",
    (12, 9): "575.51.03",
    (13, 0): "580.65.06",
}
# The oldest driver of each CUDA major (minor version compatibility: a toolkit of that major
# runs, with a limited feature set, e.g. no JIT of newer PTX).
CUDA_MAJOR_DRIVER: dict[int, str] = {12: "525.60.13", 13: "580.65.06"}
COMPAT_LIBS = Path("/usr/local/cuda/compat")


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split(".") if p.isdigit())


def driver_from_proc(text: str) -> str | None:
    """The kernel module's version from /proc/driver/nvidia/version ("NVRM version: NVIDIA
    UNIX x86_64 Kernel Module  580.65.06  Sun Jul 27 ..."); None if absent."""
    import re

    match = re.search(r"Kernel Module\s+(?:for \S+\s+)?(\d+\.\d+(?:\.\d+)?)", text)
    return match.group(1) if match else None


def judge_driver(driver: str | None, cuda: str | None, forward_compat: bool) -> str:
    """PASS: the driver is at least what the image's CUDA release needs. WARN: minor
    version compatibility (same major, older driver), the forward-compatibility package,
    or a version unknown. FAIL: a driver too old for the image's CUDA major."""
    if not driver or not cuda:
        raise CheckWarned(f"not checked: driver {driver or 'unknown'}, CUDA {cuda or 'unknown'}")
    have = _version_tuple(driver)
    cuda_t = _version_tuple(cuda)
    if len(cuda_t) < 2 or not have:
        raise CheckWarned(f"not checked: cannot read driver {driver!r} or CUDA {cuda!r}")
    major, minor = cuda_t[0], cuda_t[1]
    known = [mm for mm in CUDA_TOOLKIT_DRIVER if mm[0] == major and mm <= (major, minor)]
    if major not in CUDA_MAJOR_DRIVER or not known:
        raise CheckWarned(f"not checked: CUDA {cuda} is not in the driver table (driver {driver})")
    wants = CUDA_TOOLKIT_DRIVER[max(known)]
    floor = CUDA_MAJOR_DRIVER[major]
    what = f"driver {driver}, image CUDA {cuda} (its release needs >= {wants})"
    if have >= _version_tuple(wants):
        return what
    if have >= _version_tuple(floor):
        raise CheckWarned(
            f"{what}: runs by CUDA minor version compatibility (>= {floor}), with a limited "
            "feature set (no JIT of newer PTX); upgrade the driver for the full toolkit"
        )
    if forward_compat:
        raise CheckWarned(
            f"{what}: below CUDA {major}'s minimum {floor}; the image's forward-compatibility "
            f"libraries ({COMPAT_LIBS}) may bridge it on a datacenter GPU with a supported "
            "driver branch: watch for CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE"
        )
    raise CheckFailed(
        f"{what}: below CUDA {major}'s minimum driver {floor} and no forward-compatibility "
        f"libraries in {COMPAT_LIBS}: CUDA will not initialise (upgrade the node's driver, "
        "e.g. a newer GKE node image / driver version)"
    )


def image_cuda_version() -> str | None:
    """The image's CUDA: NVIDIA images set CUDA_VERSION; else torch's build."""
    if os.environ.get("CUDA_VERSION"):
        return os.environ["CUDA_VERSION"]
    try:
        import torch

        return torch.version.cuda
    except Exception:  # no torch: unknown
        return None


def node_driver_version() -> str | None:
    """/proc/driver/nvidia/version (the kernel module), else nvidia-smi's driver_version."""
    try:
        found = driver_from_proc(Path("/proc/driver/nvidia/version").read_text())
    except OSError:
        found = None
    if found:
        return found
    gpus = gpu_facts()
    return gpus[0]["driver_version"] if isinstance(gpus, list) and gpus else None


def check_driver_vs_cuda() -> str:
    forward = COMPAT_LIBS.is_dir() and any(COMPAT_LIBS.glob("libcuda.so*"))
    return judge_driver(node_driver_version(), image_cuda_version(), forward)


# ---------------------------------------------------------------------------------------
# Benchmark


def run_benchmark(ctx: Context, prompts: int) -> dict[str, Any]:
    """`client.bench.run_bench` (OpenAI completions, greedy, 128 in / 64 out) at
    concurrency 1 and `ctx.concurrency`; a minimal timed loop if the client is missing."""
    levels = sorted({1, ctx.concurrency})
    try:
        from client.bench import BenchConfig, run_bench
    except ImportError as exc:
        return minimal_bench(ctx, prompts, levels) | {"note": f"client.bench unavailable: {exc}"}
    cfg = BenchConfig(
        url=ctx.url,
        backend="openai",
        model=ctx.model,
        num_prompts=prompts,
        input_len=128,
        output_len=64,
        concurrency=levels,
        warmup=1,
        timeout=300,
        progress=False,
        report=False,
    )
    result = asyncio.run(run_bench(cfg))
    keys = [
        "completed",
        "failed",
        "duration_s",
        "request_throughput",
        "output_throughput",
        "mean_ttft_ms",
        "median_ttft_ms",
        "p99_ttft_ms",
        "mean_tpot_ms",
        "median_tpot_ms",
        "p99_itl_ms",
        "mean_e2el_ms",
    ]
    return {
        "tool": "client.bench.run_bench (openai completions, greedy, 128 in / 64 out)",
        "points": [
            {"concurrency": run["concurrency"]} | {k: run["metrics"].get(k) for k in keys}
            for run in result["runs"]
        ],
    }


def minimal_bench(ctx: Context, prompts: int, levels: list[int]) -> dict[str, Any]:
    """Fallback: non-streamed completions timed end to end (no TTFT/ITL)."""
    points = []
    for level in levels:
        body = {"model": ctx.model, "max_tokens": 64, "temperature": 0, "prompt": "Tell a story"}

        def one(_: int, body: dict[str, Any] = body) -> int:
            return post_json(ctx.url, "/v1/completions", body)["usage"]["completion_tokens"]

        started = time.monotonic()
        with ThreadPoolExecutor(level) as pool:
            tokens = sum(pool.map(one, range(prompts)))
        took = time.monotonic() - started
        points.append(
            {
                "concurrency": level,
                "completed": prompts,
                "duration_s": took,
                "request_throughput": prompts / took,
                "output_throughput": tokens / took,
            }
        )
    return {"tool": "minimal timed loop (non-streamed completions, 64 tokens)", "points": points}


# ---------------------------------------------------------------------------------------
# Artifacts


def build_checkpoint(out_dir: Path) -> Path:
    """The tiny Mistral-shaped checkpoint, by the dev model's code (rebuilt only when its
    shape changed)."""
    from mistral_build.dev_model import build_dev_model

    return build_dev_model(out_dir / "checkpoint", shape=TINY_SHAPE, dtype=TINY_DTYPE)


def pick_gpu_target(gpu_option: str | None) -> str:
    """The build target matching this machine's GPU (an engine runs only there)."""
    from mistral_build.gpu import TARGETS, detect_gpus, matches_target

    if gpu_option:
        return gpu_option
    gpus = detect_gpus()
    if not gpus:
        raise RuntimeError("no NVIDIA GPU found (nvidia-smi lists none)")
    for name in TARGETS:
        if matches_target(gpus[0], name):
            return name
    raise RuntimeError(
        f"{gpus[0].name} (sm {gpus[0].compute_capability}) is none of the build targets "
        f"({', '.join(TARGETS)}): pass --gpu, or --engine-dir, or use --kind trtllm_pytorch"
    )


def installed_trtllm_version() -> str | None:
    """The package's version; for a tree without metadata (a test double), its
    `__version__`, read in a subprocess so this process does not import it."""
    from mistral_build.engine import package_version

    version = package_version("tensorrt_llm", "tensorrt-llm")
    if version:
        return version
    probe = subprocess.run(
        [sys.executable, "-c", "import tensorrt_llm; print(tensorrt_llm.__version__)"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if probe.returncode != 0:
        return None
    return probe.stdout.strip() or None


def build_engine(checkpoint: Path, out_dir: Path, gpu: str | None, examples_dir: str) -> dict:
    """`build.py engine --checkpoint-dir <tiny checkpoint>`, through the same functions."""
    from mistral_build import engine

    output_dir, workdir = out_dir / "engine", out_dir / "engine.work"
    opts = engine.EngineOptions(
        checkpoint_dir=checkpoint,
        output_dir=output_dir,
        workdir=workdir,
        dtype="float16",
        gpu=pick_gpu_target(gpu),
        examples_dir=examples_dir,
        **ENGINE_LIMITS,
    )
    for path in (output_dir, workdir):
        shutil.rmtree(path, ignore_errors=True)  # ours: a previous verify-gpu run
    model = engine.read_model_facts(opts, None)
    facts = engine.gather_facts(opts)
    if facts.trtllm_version == "unknown":
        facts.trtllm_version = installed_trtllm_version() or "unknown"
    problems = engine.check_options(opts, model) + engine.check_environment(
        opts, facts, model, download=False
    )
    if problems:
        raise RuntimeError("; ".join(problems))
    paths = engine.build_paths(opts)
    commands = [shlex.join(s.argv) for s in engine.plan_steps(opts, paths, sys.executable)]
    started = time.monotonic()
    artifact = engine.build_trtllm_engine(opts, facts, token=None)
    return {
        "status": "built",
        "artifact": str(artifact),
        "seconds": round(time.monotonic() - started, 1),
        "gpu_target": opts.gpu,
        "commands": commands,
        "logs": str(paths.logs_dir),
    }


def prepare_artifact(kind: Kind, opts: VerifyOptions) -> tuple[str, dict[str, Any]]:
    """(artifact path, build record). Prints one line saying what is built or skipped."""
    if kind == "pytorch":
        from mistral_build.dev_model import build_dev_model

        path = build_dev_model(DEV_MODEL_DIR)
        return str(path), {"status": "skipped", "reason": "the dev model serves as is"}
    checkpoint = build_checkpoint(opts.out)
    if kind == "trtllm_pytorch":
        reason = "trtllm_pytorch serves the checkpoint directly: no engine build"
        print(f"[{kind}] engine build skipped: {reason}", flush=True)
        return str(checkpoint), {"status": "skipped", "reason": reason}
    if opts.engine_dir is not None:
        reason = f"--engine-dir {opts.engine_dir} given"
        print(f"[{kind}] engine build skipped: {reason}", flush=True)
        return str(opts.engine_dir), {"status": "skipped", "reason": reason}
    print(f"[{kind}] building a tiny engine from {checkpoint} (minutes)", flush=True)
    record = build_engine(checkpoint, opts.out, opts.gpu, opts.examples_dir)
    return record["artifact"], record


def server_settings(kind: Kind, artifact: str, overrides: dict[str, str]) -> dict[str, str]:
    from mistral_build.local_server import dev_settings

    if kind == "pytorch":
        base = dev_settings(Path(artifact))
    else:
        base = {"artifact": artifact, "engine": kind, "cache_dir": str(CACHE_DIR / "artifacts")}
        base |= GPU_SETTINGS
    if kind != "tensorrt_llm":  # a TensorRT engine has its own, from its build
        base["max_num_tokens"] = str(MAX_NUM_TOKENS[kind])
    return base | COMMON_SETTINGS | overrides


def max_num_tokens_of(kind: Kind, artifact: str, settings: dict[str, str]) -> int:
    """Prompt tokens per engine step for the long-prompt check: the setting, or for a
    TensorRT engine its config.json's build_config (an --engine-dir may differ from ours)."""
    if kind == "tensorrt_llm":
        try:
            config = json.loads((Path(artifact) / "config.json").read_text())
            return int(config["build_config"]["max_num_tokens"])
        except (OSError, ValueError, KeyError, TypeError):
            return MAX_NUM_TOKENS[kind]
    return int(settings.get("max_num_tokens", MAX_NUM_TOKENS[kind]))


# ---------------------------------------------------------------------------------------
# Server


def context_dir(out: Path) -> Path:
    """The Truss build context rendered by truss's own code, laid out as the image does."""
    from mistral_build.local_server import prepare_app_dir, render_build_context

    context = render_build_context(out / "truss-context")
    prepare_app_dir(context)
    return context


# ---------------------------------------------------------------------------------------
# One kind, all kinds


@dataclass
class VerifyOptions:
    kinds: list[Kind]
    out: Path = DEFAULT_OUT
    engine_dir: Path | None = None
    gpu: str | None = None
    examples_dir: str = "/app/tensorrt_llm/examples"
    overrides: dict[str, str] = field(default_factory=dict)
    ready_timeout: float = 900.0
    bench_prompts: int = 32
    long_tokens: int = 4000
    drain_tokens: int = 512


def verify_kind(kind: Kind, opts: VerifyOptions, context: Callable[[], Path]) -> KindReport:
    report = KindReport(kind)
    if kind in GPU_KINDS:  # first: a driver too old for the image's CUDA breaks all else
        report.checks.append(run_check("driver_vs_cuda", check_driver_vs_cuda))
    print(f"[{kind}] artifact", flush=True)
    started = time.monotonic()
    try:
        artifact, report.build = prepare_artifact(kind, opts)
        report.artifact = artifact
    except Exception as exc:  # a failed build is this kind's result
        report.build = {"status": "failed", "error": f"{type(exc).__name__}: {exc}"}
        report.checks.append(
            CheckResult("build", False, report.build["error"], time.monotonic() - started)
        )
        print(f"  [FAIL] build: {report.build['error']}", flush=True)
        return report
    if report.build["status"] == "built":
        report.checks.append(CheckResult("build", True, "engine built", report.build["seconds"]))

    settings = server_settings(kind, artifact, opts.overrides)
    log_path = opts.out / f"server-{kind}.log"
    server = LocalServer.start(context(), settings, log_path=log_path, wait=False)
    url, process = server.url, server.process
    report.server = {"url": url, "settings": settings, "log": str(log_path)}
    print(f"[{kind}] starting the Truss server on {url} (log: {log_path})", flush=True)
    try:
        load = run_check("server_ready", lambda: _ready(url, process, opts.ready_timeout, log_path))
        report.checks.append(load)
        if not load.passed:
            return report
        ctx = Context(
            url=url,
            expected_engine=kind,
            long_tokens=opts.long_tokens,
            drain_tokens=opts.drain_tokens,
            max_num_tokens=max_num_tokens_of(kind, artifact, settings),
            tokenize=make_tokenize(artifact),
        )
        for name, check in CHECKS:
            report.checks.append(run_check(name, functools.partial(check, ctx)))
        if opts.bench_prompts > 0:
            report.checks.append(
                run_check("benchmark", lambda: _bench(ctx, opts.bench_prompts, report))
            )
        grace = float(settings.get("drain_grace_seconds", DRAIN_GRACE_S))
        report.checks.append(
            run_check("drain_on_sigterm", lambda: check_drain_on_sigterm(ctx, process, grace))
        )
    finally:
        server.kill()
    return report


def _ready(url: str, process: subprocess.Popen, timeout: float, log_path: Path) -> str:
    try:
        return f"ready in {wait_ready(url, process, timeout, log_path):.1f} s"
    except RuntimeError as exc:
        raise CheckFailed(str(exc)) from None


def _bench(ctx: Context, prompts: int, report: KindReport) -> str:
    report.bench = run_benchmark(ctx, prompts)
    points = report.bench["points"]
    failed = sum(p.get("failed") or 0 for p in points)
    if failed:
        raise CheckFailed(f"{failed} benchmark requests failed")
    return (
        "; ".join(f"c={p['concurrency']}: {p['output_throughput']:.0f} tok/s" for p in points)
        + f" ({report.bench['tool']})"
    )


# ---------------------------------------------------------------------------------------
# Facts for the report


def parse_gpu_query(text: str) -> list[dict[str, str]]:
    """`nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total
    --format=csv,noheader` -> one dict per GPU; lines that do not fit are skipped."""
    keys = ("name", "driver_version", "compute_cap", "memory_total")
    gpus = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == len(keys) and parts[0]:
            gpus.append(dict(zip(keys, parts, strict=True)))
    return gpus


def gpu_facts() -> list[dict[str, str]] | str:
    if shutil.which("nvidia-smi") is None:
        return "no nvidia-smi on PATH"
    try:
        out = subprocess.run(
            [
                "nvidia-smi",
                "--query-gpu=name,driver_version,compute_cap,memory.total",
                "--format=csv,noheader",
            ],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return f"nvidia-smi failed: {exc}"
    return parse_gpu_query(out.stdout) or f"nvidia-smi printed nothing usable: {out.stderr[:200]}"


def versions() -> dict[str, str | None]:
    from mistral_build.engine import package_version

    found: dict[str, str | None] = {"python": platform.python_version()}
    for name in ("tensorrt_llm", "tensorrt", "torch", "transformers", "truss", "mistral_common"):
        found[name] = package_version(name, name.replace("_", "-"))
    if found["tensorrt_llm"] is None and (version := installed_trtllm_version()):
        # No package metadata but importable: a tree on PYTHONPATH (the test double in CI).
        found["tensorrt_llm"] = f"{version} (no package metadata: {trtllm_location()})"
    return found


def trtllm_location() -> str | None:
    import importlib.util

    spec = importlib.util.find_spec("tensorrt_llm")
    return spec.origin if spec else None


# ---------------------------------------------------------------------------------------
# Report


def report_dict(reports: list[KindReport], opts: VerifyOptions) -> dict[str, Any]:
    return {
        "passed": bool(reports) and all(r.passed for r in reports),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": shlex.join(sys.argv),
        "warnings": sum(r.warnings for r in reports),
        "kinds": [
            {"kind": r.kind, "passed": r.passed, "warnings": r.warnings}
            | asdict(r)
            | {"checks": [asdict(c) | {"verdict": c.verdict} for c in r.checks]}
            for r in reports
        ],
        "versions": versions(),
        "gpu": gpu_facts(),
        "options": {k: str(v) for k, v in asdict(opts).items()},
    }


def render_markdown(data: dict[str, Any]) -> str:
    lines = [
        f"# verify-gpu: {_headline(data['passed'], data.get('warnings', 0))}",
        "",
        f"`{data['command']}` at {data['created']}",
        "",
    ]
    gpu = data["gpu"]
    if isinstance(gpu, list):
        for g in gpu:
            lines.append(
                f"- GPU: {g['name']}, driver {g['driver_version']}, sm {g['compute_cap']}, "
                f"{g['memory_total']}"
            )
    else:
        lines.append(f"- GPU: {gpu}")
    lines.append(
        "- versions: " + ", ".join(f"{k} {v or 'absent'}" for k, v in data["versions"].items())
    )
    for kind in data["kinds"]:
        lines += ["", f"## {kind['kind']}: {_headline(kind['passed'], kind.get('warnings', 0))}"]
        lines.append("")
        build = kind["build"]
        lines.append(
            f"- artifact: {kind['artifact']} ({build.get('status')}"
            + (f": {build['reason']}" if build.get("reason") else "")
            + ")"
        )
        if kind["server"]:
            lines.append(f"- server log: {kind['server']['log']}")
        lines += ["", "| check | result | seconds | detail |", "| --- | --- | --- | --- |"]
        for c in kind["checks"]:
            detail = c["detail"].replace("|", "\\|").replace("\n", " / ")
            verdict = "**FAIL**" if not c["passed"] else "WARN" if c.get("warned") else "pass"
            lines.append(f"| {c['name']} | {verdict} | {c['seconds']} | {detail} |")
        points = (kind.get("bench") or {}).get("points") or []
        if points:
            lines += ["", f"Benchmark: {kind['bench']['tool']}", ""]
            cols = [k for k in points[0] if points[0][k] is not None]
            lines += ["| " + " | ".join(cols) + " |", "|" + " --- |" * len(cols)]
            for p in points:
                lines.append("| " + " | ".join(_fmt(p.get(c)) for c in cols) + " |")
    return "\n".join(lines) + "\n"


def _headline(passed: bool, warnings: int) -> str:
    if not passed:
        return "FAILED"
    return f"PASSED with {warnings} WARN" if warnings else "PASSED"


def _fmt(v: Any) -> str:
    return f"{v:.2f}" if isinstance(v, float) else str(v)


def write_report(data: dict[str, Any], out: Path) -> tuple[Path, Path]:
    out.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out / "report.json", out / "report.md"
    json_path.write_text(json.dumps(data, indent=2, default=str) + "\n")
    md_path.write_text(render_markdown(data))
    return json_path, md_path


# ---------------------------------------------------------------------------------------
# CLI


def parse_set(items: list[str] | None) -> dict[str, str]:
    """`--set KEY=VALUE` pairs; ValueError names a malformed one."""
    out: dict[str, str] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key or not key.replace("_", "").isalnum() or not key.isascii():
            raise ValueError(f"--set {item!r}: expected KEY=VALUE with KEY a setting name")
        out[key.lower()] = value
    return out


def kinds_for(option: str) -> list[Kind]:
    return list(GPU_KINDS) if option == "all" else [option]  # type: ignore[list-item]


def run(opts: VerifyOptions, stdout: IO[str] = sys.stdout) -> int:
    opts.out.mkdir(parents=True, exist_ok=True)
    rendered: list[Path] = []

    def context() -> Path:
        if not rendered:
            rendered.append(context_dir(opts.out))
        return rendered[0]

    reports = [verify_kind(kind, opts, context) for kind in opts.kinds]
    data = report_dict(reports, opts)
    json_path, md_path = write_report(data, opts.out)
    print("", render_markdown(data), f"report: {json_path} and {md_path}", sep="\n", file=stdout)
    return 0 if data["passed"] else 1


def main(args: argparse.Namespace) -> int:
    try:
        overrides = parse_set(args.set)
    except ValueError as exc:
        print(f"refused: {exc}", file=sys.stderr)
        return 2
    if args.engine_dir is not None and not (args.engine_dir / "config.json").is_file():
        print(f"refused: --engine-dir {args.engine_dir}: no config.json there", file=sys.stderr)
        return 2
    opts = VerifyOptions(
        kinds=kinds_for(args.kind),
        out=args.out,
        engine_dir=args.engine_dir,
        gpu=args.gpu,
        examples_dir=args.examples_dir,
        overrides=overrides,
        ready_timeout=args.ready_timeout,
        bench_prompts=args.bench_prompts,
        long_tokens=args.long_tokens,
        drain_tokens=args.drain_tokens,
    )
    return run(opts)


def _positive(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError("must be 0 or more")
    return value


def register(subparsers: argparse._SubParsersAction) -> None:
    from mistral_build.engine import DEFAULT_EXAMPLES_DIR
    from mistral_build.gpu import TARGETS

    p = subparsers.add_parser(
        "verify-gpu",
        help="Check the whole serving path on this GPU: tiny engine, real server, checks, report.",
        description=(
            "Build a tiny random-weight Mistral-shaped engine (no download), serve it with the "
            "real Truss server, run the end-to-end checks and a short benchmark, and write "
            "report.json + report.md. Run inside the TensorRT-LLM release image on a GPU. "
            "Exit 1 if any check failed."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument(
        "--kind",
        choices=KIND_CHOICES,
        default="all",
        help="tensorrt_llm: TensorRT engine; trtllm_pytorch: TensorRT-LLM's PyTorch backend "
        "(no build); all: both; pytorch: the dev model on our PyTorch engine (CPU).",
    )
    p.add_argument(
        "--engine-dir", type=Path, help="Serve this engine instead of building the tiny one."
    )
    p.add_argument(
        "--gpu", choices=sorted(TARGETS), help="Build target (default: this machine's GPU)."
    )
    p.add_argument(
        "--examples-dir", default=DEFAULT_EXAMPLES_DIR, help="TensorRT-LLM's example scripts."
    )
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="Report, logs, artifacts.")
    p.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="Override a server setting, e.g. --set kv_cache_free_gpu_memory_fraction=0.5.",
    )
    p.add_argument("--ready-timeout", type=float, default=900.0, help="Seconds to load.")
    p.add_argument(
        "--bench-prompts",
        type=_positive,
        default=32,
        help="Requests per benchmark point (0: none).",
    )
    p.add_argument(
        "--long-tokens",
        type=_positive,
        default=4000,
        help="Length of the streams the abort and 429 checks hold open.",
    )
    p.add_argument(
        "--drain-tokens", type=_positive, default=512, help="Length of the drained streams."
    )
    p.set_defaults(func=main)
