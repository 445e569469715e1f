"""The checks of the server's state over a request's life: the KV-cache gauge, abort on
disconnect, the abort of a streamed-logprobs request, 503 past the queue, and last the
drain on SIGTERM. Each takes the `Context` and returns its detail line, or raises
CheckFailed / CheckWarned."""

from __future__ import annotations

import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from mistral_build.local_server import raw_post
from mistral_build.verify import wire
from mistral_build.verify.checks import Context
from mistral_build.verify.config import GREEDY, PREDICT, SHUTDOWN_BUDGET_S
from mistral_build.verify.judges import Drain, judge_drain
from mistral_build.verify.results import CheckFailed, CheckWarned

# The server setting (engine=tensorrt_llm, off by default) that serves logprobs although an
# aborted request with logprobs crashed TensorRT-LLM 1.1.0 / 1.2.0rc7.
ABORT_SAFE_SETTING = "trtllm_logprobs_abort_safe"


def long_stream_body(ctx: Context, prompt: str) -> dict[str, Any]:
    return wire.long_stream_body(prompt, ctx.model, ctx.max_model_len, ctx.long_tokens)


def open_long_stream(ctx: Context, prompt: str) -> tuple[Any, Iterator[bytes]]:
    return wire.open_stream(ctx.url, long_stream_body(ctx, prompt))


def check_kv_gauge(ctx: Context) -> str:
    """The KV-cache gauge (what the Inference Gateway routes on) is 0 when idle, rises while
    streams hold cache, and returns to 0 when they end."""
    if not wire.wait_until(lambda: wire.kv_usage(ctx.url) == 0, 30):
        raise CheckFailed(f"kv_cache_usage_perc {wire.kv_usage(ctx.url)} with nothing running")
    held: list[Any] = []
    peak = 0.0

    def risen() -> bool:
        nonlocal peak
        peak = max(peak, wire.kv_usage(ctx.url))
        return peak > 0

    try:
        for i in range(min(4, ctx.max_inflight)):
            held.append(open_long_stream(ctx, f"Fill the cache {i}"))
        if not wire.wait_until(risen, 30):
            raise CheckFailed(
                f"kv_cache_usage_perc stayed 0 with {len(held)} streams running (frozen gauge)"
            )
    finally:
        for stream, _reader in held:
            stream.close()
    if not wire.wait_until(lambda: wire.kv_usage(ctx.url) == 0, 60):
        raise CheckFailed(
            f"kv_cache_usage_perc rose to {peak:.4f} but stayed at {wire.kv_usage(ctx.url):.4f} "
            "after the streams ended"
        )
    return f"0 idle, {peak:.4f} under {len(held)} streams, back to 0 after"


def check_abort_on_disconnect(ctx: Context) -> str:
    before = wire.aborted(ctx.url)
    stream, _reader = open_long_stream(ctx, "A very long story")
    stream.close()
    if not wire.wait_until(lambda: wire.aborted(ctx.url) >= before + 1, 30):
        raise CheckFailed(
            "the client left mid-stream but no request finished with 'abort' within 30 s "
            "(did the stream run to its end first?)"
        )
    if not wire.wait_until(lambda: wire.running(ctx.url) == 0, 30):
        raise CheckFailed(f"running gauge stuck at {wire.running(ctx.url)} after the abort")
    after = wire.predict(ctx.url, prompt="after", max_new_tokens=2)
    return f"disconnect -> finish 'abort', running gauge back to 0, next request {after['finish_reason']}"


def _refused_streamed_logprobs(ctx: Context, probe: dict[str, Any], refusal: str) -> str:
    """The abort check's verdict where streamed logprobs were refused: nothing to abort."""
    plain = wire._requests().post(
        ctx.url + "/v1/completions", json=probe | {"logprobs": 0}, timeout=300
    )
    why = wire.error_text(plain) if 400 <= plain.status_code < 500 else refusal
    # Only an engine that gathers generation logits (not one from build.py engine) can
    # serve logprobs on engine=tensorrt_llm, behind the setting this check may turn on.
    if ABORT_SAFE_SETTING in why:
        how = f"rerun with --set {ABORT_SAFE_SETTING}=true to test the abort"
    else:
        how = "logprobs are served by engine=trtllm_pytorch, where this check tests the abort"
    if 400 <= plain.status_code < 500:
        return f"not applicable: this server returns no logprobs ({why}); {how}"
    raise CheckWarned(f"streamed logprobs refused on this kind ({refusal}): not tested; {how}")


def _still_serving_after_abort(ctx: Context, probe: dict[str, Any]) -> None:
    """CheckFailed unless the server answers (with logprobs) and is ready after the abort."""
    try:
        after = wire.post_json(ctx.url, "/v1/completions", probe, timeout=60)
        again = wire.post_json(ctx.url, "/v1/completions", probe | {"logprobs": 0}, timeout=60)
        ready = wire._requests().get(ctx.url + "/v1/models/model", timeout=10).status_code
    except CheckFailed as exc:
        raise CheckFailed(f"after the abort: {exc} (the executor died?)") from None
    except Exception as exc:
        raise CheckFailed(f"after the abort the server stopped answering: {exc}") from None
    if ready != 200:
        raise CheckFailed(f"after the abort the server is not ready ({ready})")
    if not after["usage"]["completion_tokens"] or not again["choices"][0].get("logprobs"):
        raise CheckFailed(f"after the abort: answers without tokens or logprobs: {again}")


def check_abort_streamed_logprobs(ctx: Context) -> str:
    """Abort (disconnect) a streaming request that asked for logprobs, then the server must
    keep answering. Upstream TensorRT-LLM 1.1.0 and 1.2.0rc7 crash the executor there with
    gather_generation_logits on; where this passes, streamed logprobs are safe on the kind."""
    probe = {"model": ctx.model, "prompt": "Probe", "max_tokens": 2, "temperature": 0}
    body = long_stream_body(ctx, "Abort me with logprobs") | {"logprobs": 0}
    before = wire.aborted(ctx.url)
    r = wire._requests().post(ctx.url + "/v1/completions", json=body, stream=True, timeout=300)
    first = next(r.iter_content(chunk_size=None), b"") if r.status_code == 200 else b""
    # A refusal arrives as a 4xx, or (raised by the engine once the stream began) as the
    # stream's first event: an OpenAI error object.
    streamed_error = wire.stream_error(first)
    if 400 <= r.status_code < 500 or streamed_error:
        refusal = streamed_error or wire.error_text(r)
        r.close()
        return _refused_streamed_logprobs(ctx, probe, refusal)
    if r.status_code != 200:
        raise CheckFailed(f"streamed logprobs -> {r.status_code}: {r.text[:200]}")
    if not first:
        raise CheckFailed("the streamed-logprobs request ended before its first chunk")
    r.close()
    if not wire.wait_until(lambda: wire.aborted(ctx.url) >= before + 1, 30):
        raise CheckFailed("the client left the streamed-logprobs request but no abort was counted")
    _still_serving_after_abort(ctx, probe)
    return (
        "a streamed request with logprobs was aborted and the server kept answering (with "
        f"logprobs, ready 200): logprobs survive an abort here, so {ABORT_SAFE_SETTING} "
        "(engine=tensorrt_llm) may be turned on for this release"
    )


def _fill_to_the_limit(ctx: Context, held: list[Any], waiters: list[socket.socket]) -> None:
    """max_inflight long streams running and max_waiting requests queued behind them."""
    for i in range(ctx.max_inflight):
        held.append(open_long_stream(ctx, f"Hold slot {i}"))
    if not wire.wait_until(lambda: wire.running(ctx.url) == ctx.max_inflight, 30):
        raise CheckFailed(f"{wire.running(ctx.url)} running, expected {ctx.max_inflight}")
    for _ in range(ctx.max_waiting):
        waiters.append(raw_post(ctx.url, PREDICT, {"prompt": "wait", "max_new_tokens": 4}))
    if not wire.wait_until(lambda: wire.waiting(ctx.url) == ctx.max_waiting, 30):
        raise CheckFailed(f"{wire.waiting(ctx.url)} waiting, expected {ctx.max_waiting}")


def check_overload_503(ctx: Context) -> str:
    held: list[Any] = []
    waiters: list[socket.socket] = []
    try:
        _fill_to_the_limit(ctx, held, waiters)
        r = wire._requests().post(
            ctx.url + PREDICT, json={"prompt": "one too many", "max_new_tokens": 4}, timeout=30
        )
        still = wire.running(ctx.url)
        if r.status_code != 503:  # saturation: a gateway retries another replica
            raise CheckFailed(f"request past max_inflight+max_waiting got {r.status_code}")
        if still != ctx.max_inflight:
            raise CheckFailed(
                f"the held streams ended before the check finished ({still} running): "
                "raise --long-tokens"
            )
        retry = r.headers.get("retry-after")
        if not retry:
            raise CheckFailed("503 without a Retry-After header")
    finally:
        for sock in waiters:
            sock.close()
        for stream, _reader in held:
            stream.close()
    if not wire.wait_until(lambda: wire.running(ctx.url) == 0 and wire.waiting(ctx.url) == 0, 60):
        raise CheckFailed("running/waiting gauges did not return to 0 after the streams closed")
    return (
        f"{ctx.max_inflight} running + {ctx.max_waiting} waiting: the next request got 503 "
        f"(Retry-After {retry}); gauges back to 0"
    )


def _read_to_the_end(readers: list[Iterator[bytes]], firsts: list[bytes]) -> list[tuple[str, str]]:
    """("completed" | "cut", text) of each stream, read to its end."""
    requests = wire._requests()
    outcomes: list[tuple[str, str]] = []
    for first, reader in zip(firsts, readers, strict=True):
        got = bytearray(first)
        try:
            for chunk in reader:
                got += chunk
            outcomes.append(("completed", got.decode(errors="replace")))
        except requests.exceptions.ChunkedEncodingError:  # no closing chunk: visibly cut
            outcomes.append(("cut", got.decode(errors="replace")))
    return outcomes


def check_drain_on_sigterm(ctx: Context, process: subprocess.Popen[Any], grace: float) -> str:
    """Last: SIGTERM with streams in flight. Each stream must complete within the grace
    period (its answer token-prefix compared with its batch-mate and with the same two
    requests non-streamed together, `judges.batch_pairs`), the listener close,
    and the engine shut down (llm.shutdown()) and the process exit soon after: both timed."""
    requests = wire._requests()
    body = {"prompt": "Drain me", "max_new_tokens": ctx.drain_tokens, "streaming_interval": 1}
    body |= GREEDY
    # The reference: the same two requests at once (one batch, as the drained streams).
    with ThreadPoolExecutor(2) as pool:
        references = list(pool.map(lambda _: wire.predict(ctx.url, **body)["output"], range(2)))
    streams = [
        requests.post(ctx.url + PREDICT, json=body | {"streaming": True}, stream=True, timeout=300)
        for _ in range(2)
    ]
    readers = [s.iter_content(chunk_size=None) for s in streams]
    firsts = [next(reader, b"") for reader in readers]
    in_flight = wire.running(ctx.url)
    started = time.monotonic()
    process.send_signal(signal.SIGTERM)
    outcomes = _read_to_the_end(readers, firsts)
    drained = time.monotonic() - started
    closed = wire.wait_until(lambda: not wire.accepts(ctx.url), 10)
    try:
        code = process.wait(max(1.0, grace + SHUTDOWN_BUDGET_S - drained))
    except subprocess.TimeoutExpired:
        raise CheckFailed(
            f"still running {grace + SHUTDOWN_BUDGET_S:.0f} s after SIGTERM (grace {grace:.0f} s "
            f"+ {SHUTDOWN_BUDGET_S:.0f} s for llm.shutdown() and the exit)"
        ) from None
    took = time.monotonic() - started
    return judge_drain(
        Drain(in_flight, outcomes, references, drained, took - drained, grace, code, closed),
        ctx.tokenize,
    )


LifecycleCheck = Callable[[Context], str]
LIFECYCLE_CHECKS: list[tuple[str, LifecycleCheck]] = [
    ("kv_gauge", check_kv_gauge),
    ("abort_on_disconnect", check_abort_on_disconnect),
    ("abort_streamed_logprobs", check_abort_streamed_logprobs),
    ("overload_503", check_overload_503),
]
