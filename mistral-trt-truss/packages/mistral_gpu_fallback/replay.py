"""The replay engine: FOR BENCHMARKS ONLY. It emits pre-made tokens without computing, so
a load test measures the serving path itself (HTTP, admission, detokenizer, streaming,
metrics) and nothing of a model. Selected only by the explicit setting `engine: replay`
(never by `auto`).

It behaves like a GPU engine seen from the server: a background thread runs a step every
`replay_step_ms` milliseconds; each step appends one token to every live request (cycling
through the token ids of a fixed text) and hands that step's deltas to the event loop with
one thread-safe call, exactly as the PyTorch engine does (`base.deliver`). A request
ends with finish reason `length` after its `max_new_tokens`; stop token ids are never
produced, so `ignore_eos` and `min_tokens` hold trivially. With `logprobs`, each token
reports log-probability 0.0 (it was certain: nothing was sampled) and `top` holds only
that token. Prompt logprobs (echo) are 0.0 likewise, on the first delta; with
`max_new_tokens` 0 the request ends at once (`length`). Structured output is refused.

KV-cache usage (the gauge) is what the live requests would hold (prompt + tokens so far)
over `max_batch_size x max_seq_len`. It imports no torch: a model-free engine stays light.
With `engine_process: on` it runs in the engine process (`submit`, as the PyTorch engine's),
so a benchmark measures the serving layer over that process's IPC too.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from mistral_serving.engines.base import (
    EngineError,
    EngineInfo,
    EngineLimits,
    Heartbeat,
    Loop,
    SamplingOptions,
    Sink,
    StreamQueue,
    TokenDelta,
    TokenLogprob,
    deliver,
    read_stream,
    refuse_unsupported,
)

if TYPE_CHECKING:
    from mistral_serving.text.tokenizer import Tokenizer

TEXT = (
    "The quick brown fox jumps over the lazy dog. Continuous batching keeps the GPU busy: "
    "requests join and leave the running batch at every step, so a short answer never "
    "waits for a long one. Café, naïve, 東京, emoji 🚀 and numbers 3.14159 keep the "
    "detokenizer honest across multi-byte characters. "
)


@dataclass
class _Stream:
    loop: Loop
    queue: Sink
    remaining: int
    offset: int
    held: int  # tokens this request would hold in a KV cache: prompt + output so far
    logprobs: int | None
    prompt_lps: list[TokenLogprob] | None = None  # sent with the first delta


class ReplayEngine:
    def __init__(
        self,
        token_ids: list[int],
        eos_token_id: int,
        limits: EngineLimits,
        step_s: float = 0.01,
        vocab_size: int | None = None,
    ) -> None:
        if not token_ids:
            raise EngineError("the replay engine needs at least one token to replay")
        self._tokens = token_ids
        self.eos_token_id = eos_token_id
        # What the engine process reports as the embedding's rows (no model: the vocabulary).
        self.vocab_size = vocab_size or max(token_ids) + 1
        self.limits = limits
        self.info = EngineInfo(
            "replay", {"note": "benchmarks only: emits pre-made tokens", "step_ms": step_s * 1000}
        )
        self._step_s = step_s
        self._lock = threading.Lock()
        self._live: dict[str, _Stream] = {}
        self._wake = threading.Event()
        self._closed = threading.Event()
        self._kv_tokens = 0  # replaced by the replay thread each step
        self._heartbeat = Heartbeat()  # beats every step-loop pass
        self._thread = threading.Thread(target=self._run, name="replay-engine", daemon=True)
        self._thread.start()

    @classmethod
    def for_tokenizer(
        cls,
        tokenizer: Tokenizer,
        max_batch_size: int,
        max_seq_len: int | None = None,
        max_input_len: int | None = None,
        step_ms: float = 10.0,
    ) -> ReplayEngine:
        seq = max_seq_len or 32768
        limits = EngineLimits(min(max_input_len or seq - 1, seq - 1), seq, max_batch_size)
        return cls(
            tokenizer.encode(TEXT), tokenizer.eos_id, limits, step_ms / 1000, tokenizer.vocab_size
        )

    async def generate(
        self, request_id: str, prompt_ids: list[int], sampling: SamplingOptions
    ) -> AsyncIterator[TokenDelta]:
        queue: StreamQueue = asyncio.Queue()
        self.submit(request_id, prompt_ids, sampling, asyncio.get_running_loop(), queue)
        try:
            async for delta in read_stream(queue, "replay engine"):
                yield delta
        finally:
            with self._lock:
                self._live.pop(request_id, None)

    def submit(
        self,
        request_id: str,
        prompt_ids: list[int],
        sampling: SamplingOptions,
        loop: Loop,
        queue: Sink,
    ) -> None:
        """Check a request and start replaying to it: its deltas go to `queue.put_nowait`
        through `loop.call_soon_threadsafe`, one call per step (`base.deliver`), as the
        PyTorch engine's `submit` does; so the engine process (`worker.py`) serves it too."""
        if self._closed.is_set():
            raise EngineError("the replay engine is not running")
        refuse_unsupported(sampling)
        max_new = self.limits.fit(len(prompt_ids), sampling.max_new_tokens)
        k = sampling.prompt_logprobs
        prompt_lps = (
            None if k is None else [TokenLogprob(t, 0.0, ((t, 0.0),)[:k]) for t in prompt_ids[1:]]
        )
        if max_new == 0:  # a prefill only: nothing to replay
            deliver([(loop, queue, TokenDelta([], "length", prompt_logprobs=prompt_lps))])
            return
        with self._lock:
            self._live[request_id] = _Stream(
                loop,
                queue,
                max_new,
                len(prompt_ids) % len(self._tokens),
                len(prompt_ids),
                sampling.logprobs,
                prompt_lps,
            )
        self._wake.set()

    def _run(self) -> None:
        tokens, n = self._tokens, len(self._tokens)
        next_step = time.monotonic()
        while not self._closed.is_set():
            self._heartbeat.beat()
            with self._lock:
                streams = list(self._live.items())
            if not streams:
                self._kv_tokens = 0
                self._wake.wait(0.1)
                self._wake.clear()
                next_step = time.monotonic()
                continue
            deliveries = []
            done = []
            for request_id, s in streams:
                s.remaining -= 1
                s.held += 1
                token = tokens[s.offset]
                s.offset = (s.offset + 1) % n
                finished = s.remaining <= 0
                if finished:
                    done.append(request_id)
                logprobs = None
                if s.logprobs is not None:  # nothing was sampled: the token was certain
                    logprobs = [TokenLogprob(token, 0.0, ((token, 0.0),)[: s.logprobs])]
                prompt_lps, s.prompt_lps = s.prompt_lps, None
                delta = TokenDelta([token], "length" if finished else None, logprobs, prompt_lps)
                deliveries.append((s.loop, s.queue, delta))
            self._kv_tokens = sum(s.held for _, s in streams if s.remaining > 0)
            if done:
                with self._lock:
                    for request_id in done:
                        self._live.pop(request_id, None)
            deliver(deliveries)
            next_step += self._step_s
            time.sleep(max(0.0, next_step - time.monotonic()))

    def abort(self, request_id: str) -> None:
        with self._lock:
            s = self._live.pop(request_id, None)
        if s is not None:
            deliver([(s.loop, s.queue, TokenDelta([], "abort"))])

    def is_healthy(self) -> bool:
        return not self._closed.is_set() and self._thread.is_alive()

    def kv_cache_usage(self) -> float:
        capacity = self.limits.max_batch_size * self.limits.max_seq_len
        return min(1.0, self._kv_tokens / capacity)

    def num_running(self) -> int:
        return len(self._live)

    def stalled_for(self) -> float:
        return self._heartbeat.stalled_for(bool(self._live))

    def shutdown(self) -> None:
        """Abort every live request and stop the step thread. Safe to call again."""
        with self._lock:
            live = list(self._live)
        for request_id in live:
            self.abort(request_id)
        self._closed.set()
        self._wake.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        self._kv_tokens = 0
