"""Mirrors tensorrt_llm/executor/result.py: `Logprob`, `CompletionOutput` (token_ids,
token_ids_diff, logprobs, logprobs_diff, finish_reason), `GenerationResult` (async iterator of
itself, `finished`, `abort()`) and `IterationResult` (the async iterable of iteration stats
that `LLM.get_stats_async` returns).

Instead of reading responses from the C++ executor, each step of the iteration "decodes"
tokens from the LLM double's script and applies the runtime's stop rules: end_id (unless
ignore_eos, and not before min_tokens), stop_token_ids (trimmed from the output, as the LLM
API does when include_stop_str_in_output is False), max_tokens, and abort ('cancelled').

Behaviours kept on purpose because the real runtime has them (each is a trap for the adapter):
- `abort()` only queues a cancel (`GenerationResult.abort` -> `executor.abort_request`); the
  executor acts on it at a later iteration, so one more step of tokens arrives before the
  final response with 'cancelled'.
- A per-request failure is raised as `RequestError` from `_handle_response` while iterating,
  and the result is NOT marked done (`_done` stays False): a caller that aborts unfinished
  requests in `finally` sends one extra cancel for it.
- `logprobs` is one dict per generated token, {token id: Logprob(logprob, rank)}, holding
  the top-k ids and the sampled one (`TokenLogprobs`); `logprobs_diff` is the new part.
- `context_logits` (`GenerationResultBase.context_logits`): None until a response carries
  the prompt's logits, which only a request with `return_context_logits=True` gets; then a
  tensor [prompt length, vocab]. The double sets it at the request's first step, from the
  LLM's `context_logits_for(prompt_ids)` knob.
"""

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

from tensorrt_llm.executor.utils import RequestError


@dataclass(slots=True)
class Logprob:
    logprob: float
    rank: int | None = None


@dataclass(slots=True)
class CompletionOutput:
    index: int
    text: str = ""
    token_ids: list[int] | None = field(default_factory=list)
    cumulative_logprob: float | None = None
    logprobs: list[dict[int, Logprob]] | None = field(default_factory=list)
    finish_reason: str | None = None  # 'stop' | 'length' | 'timeout' | 'cancelled'
    stop_reason: Any | None = None
    _last_token_ids_len: int = field(default=0, init=False, repr=False)
    _last_logprobs_len: int = field(default=0, init=False, repr=False)

    @property
    def length(self) -> int:
        return len(self.token_ids)

    @property
    def token_ids_diff(self) -> list[int]:
        return self.token_ids[self._last_token_ids_len :]

    @property
    def logprobs_diff(self) -> list[dict[int, Logprob]]:
        return self.logprobs[self._last_logprobs_len :]


def fake_logprobs(token: int, k: int) -> dict[int, Logprob]:
    """The double's stand-in for the runtime's top-k: the sampled token first (rank 1),
    then k-1 made-up alternatives, all with fixed logprobs."""
    entries = {token: Logprob(logprob=-0.25, rank=1)}
    for i in range(1, k):
        entries[token + 7 * i] = Logprob(logprob=-0.25 - i, rank=i + 1)
    return entries


class GenerationResult:
    def __init__(self, request_id: int, prompt_token_ids, sampling_params, streaming, llm):
        self.id = request_id
        self.sampling_params = sampling_params
        self._prompt_token_ids = list(prompt_token_ids)
        self._streaming = streaming
        self._llm = llm
        self._outputs = [CompletionOutput(0)]
        self._done = False
        self._aborted = False
        self._steps_since_abort = 0
        self._request_error: str | None = None  # knob: the next step fails this request only
        self._context_logits = None

    # -- the real public surface -------------------------------------------------------
    @property
    def request_id(self) -> int:
        return self.id

    @property
    def prompt_token_ids(self) -> list[int]:
        return self._prompt_token_ids

    @property
    def outputs(self) -> list[CompletionOutput]:
        return self._outputs[: self.sampling_params.n]

    @property
    def context_logits(self):
        return self._context_logits

    @property
    def finished(self) -> bool:
        return self._done

    def abort(self) -> None:
        self._llm._executor.abort_request(self.request_id)
        self._aborted = True

    def aborted(self) -> bool:
        return self._aborted

    def __aiter__(self):
        return self

    async def __anext__(self):
        if self._done:
            raise StopAsyncIteration
        await self._aresult_step()
        return self

    async def aresult(self):
        while not self._done:
            await self._aresult_step()
        return self

    # -- the double's engine -----------------------------------------------------------
    @property
    def _holds_kv(self) -> bool:
        return not self._done and self._request_error is None

    def _kv_tokens(self) -> int:
        return len(self._prompt_token_ids) + len(self._outputs[0].token_ids)

    async def _aresult_step(self) -> None:
        await asyncio.sleep(self._llm.step_delay)  # the real one awaits its response queue
        executor = self._llm._executor
        if executor is not None and executor.background_error is not None:
            # `_handle_background_error`: shut the executor down, raise the error.
            executor.shutdown()
            raise executor.background_error
        if self._request_error is not None:
            # Not marked done, as in the real `_handle_response` (see the module docstring).
            raise RequestError(self._request_error)

        if self.sampling_params.return_context_logits and self._context_logits is None:
            self._context_logits = self._llm.context_logits_for(self._prompt_token_ids)
        out = self._outputs[0]
        out._last_token_ids_len = len(out.token_ids)
        out._last_logprobs_len = len(out.logprobs)
        if self._aborted:
            if self._steps_since_abort >= self._llm.steps_after_abort:
                out.finish_reason = "cancelled"
                self._done = True
                self._llm._record_iteration()
                return
            self._steps_since_abort += 1

        sp = self.sampling_params
        min_tokens = sp.min_tokens or 0
        steps = self._llm.tokens_per_step if self._streaming else sp.max_tokens
        for _ in range(steps):
            script = self._llm.script
            generated = len(out.token_ids)
            token = script[generated] if generated < len(script) else sp.end_id
            may_stop = generated >= min_tokens
            if token == sp.end_id and not sp.ignore_eos and may_stop:
                if self._llm.include_end_id_in_output:
                    out.token_ids.append(token)
                    self._append_logprobs(out, token)
                out.finish_reason = "stop"
                break
            out.token_ids.append(token)
            self._append_logprobs(out, token)
            if sp.stop_token_ids and token in sp.stop_token_ids and may_stop:
                out.stop_reason = token
                if not sp.include_stop_str_in_output:
                    out.token_ids = out.token_ids[:-1]
                    if sp.logprobs:
                        out.logprobs = out.logprobs[:-1]
                out.finish_reason = "stop"
                break
            if len(out.token_ids) >= sp.max_tokens:
                out.finish_reason = "length"
                break
        self._done = out.finish_reason is not None
        self._llm._record_iteration()

    def _append_logprobs(self, out: CompletionOutput, token: int) -> None:
        if self.sampling_params.logprobs:
            out.logprobs.append(fake_logprobs(token, self.sampling_params.logprobs))


class IterationResult:
    """`executor/result.py::IterationResult`: an async iterable over the iteration stats the
    runtime queued. The real one waits up to `timeout` for each next item and ends when none
    comes (so under load it keeps yielding); the double yields what is queued, then ends.
    Items are dicts in 1.2 (`stat["kvCacheStats"]["usedNumBlocks"]`); older releases put JSON
    strings in the queue (knob `LLM.stats_as_json`)."""

    def __init__(self, queue: list[dict], as_json: bool) -> None:
        self._queue = queue
        self._as_json = as_json

    def __aiter__(self):
        return self

    async def __anext__(self):
        await asyncio.sleep(0)
        if not self._queue:
            raise StopAsyncIteration
        stat = self._queue.pop(0)
        return json.dumps(stat) if self._as_json else stat
