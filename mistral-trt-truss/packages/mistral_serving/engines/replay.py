"""The replay engine: FOR BENCHMARKS ONLY. It emits pre-made tokens without computing, so
a load test measures the serving path itself (HTTP, admission, detokenizer, streaming,
metrics) and nothing of a model. Selected only by the explicit setting `engine: replay`
(never by `auto`).

It behaves like a GPU engine seen from the server: a background thread runs a step every
`replay_step_ms` milliseconds; each step appends one token to every live request (cycling
through the token ids of a fixed text) and hands that step's deltas to the event loop with
one thread-safe call, exactly as `TorchEngine._deliver` does. A request ends with finish
reason `length` after its `max_new_tokens`; stop token ids are never produced.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from mistral_serving.engines.base import (
    EngineError,
    EngineInfo,
    EngineLimits,
    EngineRequestError,
    SamplingOptions,
    TokenDelta,
)
from mistral_serving.engines.pytorch import _merge_ready, _put_all

TEXT = (
    "The quick brown fox jumps over the lazy dog. Continuous batching keeps the GPU busy: "
    "requests join and leave the running batch at every step, so a short answer never "
    "waits for a long one. Café, naïve, 東京, emoji 🚀 and numbers 3.14159 keep the "
    "detokenizer honest across multi-byte characters. "
)


@dataclass
class _Stream:
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue
    remaining: int
    offset: int


class ReplayEngine:
    def __init__(
        self, token_ids: list[int], eos_token_id: int, limits: EngineLimits, step_s: float = 0.01
    ) -> None:
        if not token_ids:
            raise EngineError("the replay engine needs at least one token to replay")
        self._tokens = token_ids
        self.eos_token_id = eos_token_id
        self.limits = limits
        self.info = EngineInfo(
            "replay", {"note": "benchmarks only: emits pre-made tokens", "step_ms": step_s * 1000}
        )
        self._step_s = step_s
        self._lock = threading.Lock()
        self._live: dict[str, _Stream] = {}
        self._wake = threading.Event()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, name="replay-engine", daemon=True)
        self._thread.start()

    @classmethod
    def for_tokenizer(
        cls,
        tokenizer,
        max_batch_size: int,
        max_seq_len: int | None = None,
        max_input_len: int | None = None,
        step_ms: float = 10.0,
    ) -> ReplayEngine:
        seq = max_seq_len or 32768
        limits = EngineLimits(min(max_input_len or seq - 1, seq - 1), seq, max_batch_size)
        return cls(tokenizer.encode(TEXT), tokenizer.eos_id, limits, step_ms / 1000)

    async def generate(
        self, request_id: str, prompt_ids: list[int], sampling: SamplingOptions
    ) -> AsyncIterator[TokenDelta]:
        if self._closed.is_set():
            raise EngineError("the replay engine is not running")
        if not prompt_ids or len(prompt_ids) > self.limits.max_input_len:
            raise EngineRequestError(
                f"prompt has {len(prompt_ids)} tokens; this engine accepts 1 to "
                f"{self.limits.max_input_len}"
            )
        queue: asyncio.Queue = asyncio.Queue()
        with self._lock:
            self._live[request_id] = _Stream(
                asyncio.get_running_loop(),
                queue,
                max(1, sampling.max_new_tokens),
                len(prompt_ids) % len(self._tokens),
            )
        self._wake.set()
        try:
            while True:
                item = await queue.get()
                if not queue.empty():
                    item = _merge_ready(item, queue)
                yield item
                if item.finish_reason is not None:
                    return
        finally:
            with self._lock:
                self._live.pop(request_id, None)

    def _run(self) -> None:
        tokens, n = self._tokens, len(self._tokens)
        next_step = time.monotonic()
        while not self._closed.is_set():
            with self._lock:
                streams = list(self._live.items())
            if not streams:
                self._wake.wait(0.1)
                self._wake.clear()
                next_step = time.monotonic()
                continue
            by_loop: dict[asyncio.AbstractEventLoop, list] = {}
            done = []
            for request_id, s in streams:
                s.remaining -= 1
                token = tokens[s.offset]
                s.offset = (s.offset + 1) % n
                finished = s.remaining <= 0
                if finished:
                    done.append(request_id)
                by_loop.setdefault(s.loop, []).append(
                    (s.queue, TokenDelta([token], "length" if finished else None))
                )
            if done:
                with self._lock:
                    for request_id in done:
                        self._live.pop(request_id, None)
            for loop, items in by_loop.items():
                with contextlib.suppress(RuntimeError):  # closed loop: nobody listens
                    loop.call_soon_threadsafe(_put_all, items)
            next_step += self._step_s
            time.sleep(max(0.0, next_step - time.monotonic()))

    def abort(self, request_id: str) -> None:
        with self._lock:
            s = self._live.pop(request_id, None)
        if s is not None:
            with contextlib.suppress(RuntimeError):
                s.loop.call_soon_threadsafe(s.queue.put_nowait, TokenDelta([], "abort"))

    def is_healthy(self) -> bool:
        return not self._closed.is_set() and self._thread.is_alive()

    def shutdown(self) -> None:
        with self._lock:
            live = list(self._live)
        for request_id in live:
            self.abort(request_id)
        self._closed.set()
        self._wake.set()
        self._thread.join(timeout=5)
