"""The small async interface every engine implements, and the delivery helpers the
engines running their own thread share.

The service hands an engine prompt token ids and `SamplingOptions`, and reads an async
stream of `TokenDelta`s: the new token ids since the last delta, and on the last one a
finish reason. Text, stop strings and throttling live above the engine (`streaming.py`),
so every engine streams correctly the same way.

A failure that belongs to one request (its sampling, its bookkeeping) ends that request's
stream with `EngineError`; the engine and the other requests go on. Only a failure of a
whole engine step makes the engine unhealthy.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypeAlias, runtime_checkable

from mistral_serving.structured.constraint import GuidedDecoding

FinishReason = Literal["stop", "length", "abort", "error"]

# Below this temperature sampling is greedy (vLLM's threshold): dividing logits by a
# smaller number overflows float32, and the distribution is one-hot anyway.
GREEDY_TEMPERATURE = 1e-5


class EngineError(RuntimeError):
    """The engine failed a request (not the client's fault)."""


class EngineRequestError(ValueError):
    """The engine refused a request because of its inputs (the client's fault: a 4xx)."""


@dataclass(frozen=True)
class TokenLogprob:
    """One token's log-probability, and the `top` most likely alternatives (token id,
    logprob), from the log-softmax of the logits the sampler saw. `logprob` is None only
    for a prompt's first token (nothing precedes it: OpenAI and vLLM report null)."""

    token_id: int
    logprob: float | None
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class SamplingOptions:
    """What to generate, in the service's own terms (engine adapters map these)."""

    max_new_tokens: int
    temperature: float = 1.0
    top_k: int = 0  # 0: off; 1: greedy
    top_p: float = 1.0  # in (0, 1]; 1.0: off (how a route spells "off" is its own affair)
    seed: int | None = None
    repetition_penalty: float = 1.0  # multiplicative, over prompt and output (HF semantics)
    presence_penalty: float = 0.0  # additive, over output tokens (OpenAI semantics)
    frequency_penalty: float = 0.0
    stop_token_ids: tuple[int, ...] = ()  # end generation on these (EOS is always one)
    ignore_eos: bool = False  # vLLM: EOS does not end generation (max_new_tokens does)
    min_tokens: int = 0  # vLLM: EOS and stop_token_ids cannot end it before this many tokens
    logprobs: int | None = None  # None: off; k: the chosen token's logprob and the top k
    # None: off; k: each prompt token's logprob given the tokens before it, and the top k
    # (echo on /v1/completions). 0 new tokens is allowed with it: the request is a prefill.
    prompt_logprobs: int | None = None
    guided: GuidedDecoding | None = None  # structured output (response_format)

    @property
    def greedy(self) -> bool:
        return self.top_k == 1 or self.temperature < GREEDY_TEMPERATURE


@dataclass(frozen=True)
class TokenDelta:
    token_ids: list[int]
    finish_reason: FinishReason | None = None
    logprobs: list[TokenLogprob] | None = None  # one per token_ids entry when asked
    # On a request's first delta when `prompt_logprobs` was asked: prompt tokens 1..n-1
    # (the log-softmax of the prefill logits at positions 0..n-2; no penalties).
    prompt_logprobs: list[TokenLogprob] | None = None


@dataclass(frozen=True)
class EngineLimits:
    max_input_len: int  # longest prompt, in tokens
    max_seq_len: int  # prompt + output, in tokens
    max_batch_size: int  # sequences decoded together

    def fit(self, prompt_len: int, max_new: int, what: str = "prompt") -> int:
        """The output tokens a prompt of `prompt_len` tokens may have: `max_new`, clamped
        to the room left within max_seq_len. The one place these limits are checked (the
        service before admission, every engine again on its own input); a prompt that
        does not fit is refused with EngineRequestError naming `what`."""
        if not 1 <= prompt_len <= self.max_input_len:
            raise EngineRequestError(
                f"{what} is {prompt_len} tokens; this engine accepts 1 to "
                f"{self.max_input_len} input tokens"
            )
        room = self.max_seq_len - prompt_len
        if room < 1:
            raise EngineRequestError(
                f"{what} is {prompt_len} tokens, which leaves no room to generate within "
                f"the engine's {self.max_seq_len}-token sequence limit"
            )
        if max_new < 0:
            raise EngineRequestError(f"max_new_tokens must be at least 0, got {max_new}")
        return min(max_new, room)


@dataclass
class EngineInfo:
    """What the engine reports about itself (logged at load, shown on metadata)."""

    name: str
    details: dict[str, object] = field(default_factory=dict)


@runtime_checkable
class Engine(Protocol):
    limits: EngineLimits
    info: EngineInfo
    eos_token_id: int

    def generate(
        self, request_id: str, prompt_ids: list[int], sampling: SamplingOptions
    ) -> AsyncIterator[TokenDelta]:
        """Stream new tokens. The last delta carries the finish reason. Closing the
        iterator early (client gone) must abort the request in the engine."""
        ...

    def abort(self, request_id: str) -> None:
        """Stop a running request; its stream ends with finish reason `abort`."""
        ...

    def is_healthy(self) -> bool:
        """False once the engine can no longer serve (its loop died, the GPU failed)."""
        ...

    def kv_cache_usage(self) -> float:
        """Fraction (0..1) of the engine's KV-cache capacity in use now."""
        ...

    def num_running(self) -> int:
        """Requests in the running batch now (admitted, not finished)."""
        ...

    def stalled_for(self) -> float:
        """Seconds (monotonic clock) since the engine last made progress (a step finished,
        a response or stat arrived) while it had work pending (requests submitted and not
        finished); 0.0 when idle. The watchdog (`mistral_serving.engines.watchdog`) polls it."""
        ...

    def shutdown(self) -> None:
        """Stop the engine and free what it holds; pending streams end. Idempotent."""
        ...


def set_gil_switch_interval(interval_ms: float) -> None:
    """For an engine whose step thread runs every few milliseconds beside the server's
    event loop in one process: the two share the GIL, and at Python's default 5 ms switch
    interval a busy loop can hold the step thread for up to 5 ms per step."""
    sys.setswitchinterval(interval_ms / 1000)


def refuse_unsupported(sampling: SamplingOptions) -> None:
    """Refuse options this engine cannot honour (a 4xx, before any work)."""
    if sampling.guided is not None:
        raise EngineRequestError("response_format is not supported by this engine")


class Heartbeat:
    """`stalled_for` for an engine with a step loop: the loop calls `beat()` after every
    step (and while idle); `stalled_for(busy)` is the time since the last beat when the
    engine has work pending. Plain float writes: read from any thread without a lock."""

    def __init__(self) -> None:
        self._last = time.monotonic()

    def beat(self) -> None:
        self._last = time.monotonic()

    def stalled_for(self, busy: bool) -> float:
        return max(0.0, time.monotonic() - self._last) if busy else 0.0


# ---- delivery from an engine thread to the event loops that wait on its streams ----

Item = TokenDelta | BaseException
# One request's stream: what the engine delivers, read by `read_stream`.
StreamQueue: TypeAlias = "asyncio.Queue[Item]"


class Loop(Protocol):
    """Where an engine thread hands a step over: the event loop a stream is read on (or
    the engine process's outbox, which sends the step to the server instead)."""

    def call_soon_threadsafe(self, callback: Callable[..., object], *args: Any) -> object: ...


class Sink(Protocol):
    """One request's stream as an engine thread sees it: a `StreamQueue`, or a stand-in."""

    def put_nowait(self, item: Item) -> None: ...


def stop_ids_for(eos_token_id: int, sampling: SamplingOptions) -> frozenset[int]:
    """Tokens that end generation: EOS (unless ignore_eos) and the request's stop ids."""
    eos = () if sampling.ignore_eos else (eos_token_id,)
    return frozenset((*eos, *sampling.stop_token_ids))


def merge_ready(first: TokenDelta, queue: StreamQueue) -> tuple[TokenDelta, BaseException | None]:
    """`first` plus the deltas already queued behind it, as one delta: a consumer that
    fell behind the engine catches up in one pass (one chunk, one event) instead of one
    pass per token. Stops at a finish reason, or at an error: that error comes back
    second, to raise after the tokens that preceded it."""
    tokens = list(first.token_ids)
    logprobs = None if first.logprobs is None else list(first.logprobs)
    prompt = first.prompt_logprobs
    reason = first.finish_reason
    while reason is None and not queue.empty():
        item = queue.get_nowait()
        if isinstance(item, BaseException):
            return TokenDelta(tokens, None, logprobs, prompt), item
        tokens += item.token_ids
        if item.logprobs is not None:
            logprobs = (logprobs or []) + item.logprobs
        prompt = prompt if item.prompt_logprobs is None else item.prompt_logprobs
        reason = item.finish_reason
    return TokenDelta(tokens, reason, logprobs, prompt), None


def put_all(items: Iterable[tuple[Sink, Item]]) -> None:
    """Runs on the event loop: hand each item to its stream's queue."""
    for queue, item in items:
        queue.put_nowait(item)


def deliver(items: Iterable[tuple[Loop, Sink, Item]]) -> None:
    """From the engine thread: one thread-safe call per event loop for a whole step,
    not one per stream (each call wakes the loop)."""
    by_loop: dict[Loop, list[tuple[Sink, Item]]] = {}
    for loop, queue, item in items:
        by_loop.setdefault(loop, []).append((queue, item))
    for loop, batch in by_loop.items():
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody is listening
            loop.call_soon_threadsafe(put_all, batch)


async def read_stream(queue: StreamQueue, what: str) -> AsyncIterator[TokenDelta]:
    """A stream's consumer side: yield its deltas (merged when it fell behind) until a
    finish reason; an exception from the engine ends it, after the tokens delivered
    before it, as `EngineRequestError` (a refusal of its inputs) or `EngineError`."""
    while True:
        item = await queue.get()
        error = None
        if isinstance(item, TokenDelta):
            if not queue.empty():
                item, error = merge_ready(item, queue)
            if item.token_ids or item.finish_reason is not None or item.prompt_logprobs:
                yield item
            if item.finish_reason is not None:
                return
        else:
            error = item
        if isinstance(error, EngineError):  # a fresh one per stream: one item may reach many
            raise EngineError(str(error)) from error
        if isinstance(error, EngineRequestError):  # refused for its inputs: the client's fault
            raise EngineRequestError(str(error)) from error
        if error is not None:
            raise EngineError(f"{what} failed: {error!r}") from error
