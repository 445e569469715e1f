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
- A fatal (background) error is raised in ONE stream only: `GenerationResultBase._handle_response`
  calls the executor's `_handle_background_error()` after each response, which pops the first
  error of `_error_queue`, shuts the executor down and raises it. Every other running request
  then waits on a response queue that nothing fills any more: it blocks (until cancelled).
- Logprobs follow the sampler. TensorRT engine backend: `compute_logprobs` (top-k from the
  generation logits, plus the sampled token when it is not in the top k). PyTorch backend
  with `TorchSampler`: top-k too. PyTorch backend with `TRTLLMSampler`:
  `_torch/pyexecutor/sampler.py::TRTLLMSampler.update_requests` appends ONE entry per token,
  `{sampled token: Logprob(logprob, rank=1)}`, whatever k was asked for.
- `min_tokens` holds back only `end_id` (the C++ sampler's min-length penalty masks the end
  token alone); `stop_token_ids` are stop words, checked separately, and end a request at
  any length.
- Upstream issue 10810 (seen on 1.1.0 and 1.2.0rc7): with `gather_generation_logits` on,
  aborting a streaming request that asked for logprobs crashes the executor (a background
  error, see above). The double does so whenever the LLM was built with
  `gather_generation_logits=True` (knob `LLM.abort_with_logprobs_crashes`, default True).
- `IterationResult` (the stats iterable) is one object per executor and its `_done` is
  sticky: once a read times out it stays done, and every later `get_stats_async()` returns
  the same, finished, iterable, until the next `generate_async` marks it undone
  (`executor.py::GenerationExecutor._maybe_initialize_iteration_results`, the only reset).
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


def fake_logprobs(token: int, k: int, *, top_k: bool = True) -> dict[int, Logprob]:
    """The double's stand-in for the runtime's logprobs of one token. `top_k` (the TensorRT
    backend's `compute_logprobs`, the PyTorch backend's TorchSampler): the sampled token
    first (rank 1), then k-1 made-up alternatives, all with fixed logprobs. Not `top_k`
    (`TRTLLMSampler.update_requests`): the sampled token alone, rank 1, for any k."""
    entries = {token: Logprob(logprob=-0.25, rank=1)}
    if not top_k:
        return entries
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
        self._started = False  # the first step compiles the grammar

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
        if self._llm._abort_crashes(self):
            # Upstream issue 10810: the executor dies processing this cancel; the error
            # surfaces in the next stream that handles a response.
            self._llm._executor._error_queue.append(
                RuntimeError("Executor worker died while cancelling a request")
            )

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
        if executor is None or executor.dead or self._llm.hang:
            # Nothing fills this request's queue any more (the executor died and another
            # stream raised its error; or, knob `hang`, the executor stopped answering).
            await asyncio.Event().wait()
        if executor._error_queue:
            self._raise_background_error(executor)
        if not self._started:
            self._started = True
            self._llm._look_up_prompt_blocks(self._prompt_token_ids)
            grammar_error = self._llm._grammar_error(self.sampling_params.guided_decoding)
            if grammar_error is not None:
                # The grammar is compiled inside the executor loop (PyTorch backend:
                # `GuidedDecoder._build`, "TODO: Make this an error response"); the loop's
                # error handler fails every active request with that message.
                for other in self._llm.requests:
                    if other._holds_kv:
                        other._request_error = grammar_error
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
            may_stop = generated >= min_tokens  # min_tokens holds back end_id only
            if token == sp.end_id and not sp.ignore_eos and may_stop:
                if self._llm.include_end_id_in_output:
                    out.token_ids.append(token)
                    self._append_logprobs(out, token)
                out.finish_reason = "stop"
                break
            out.token_ids.append(token)
            self._append_logprobs(out, token)
            if sp.stop_token_ids and token in sp.stop_token_ids:  # stop words: any length
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

    def _raise_background_error(self, executor) -> None:
        """`GenerationExecutor._handle_background_error()`: the first queued error, raised in
        this stream only, after shutting the executor down."""
        error = executor._error_queue.pop(0)
        executor.dead = True
        executor.shutdown()
        raise error

    def _append_logprobs(self, out: CompletionOutput, token: int) -> None:
        if self.sampling_params.logprobs:
            k = self.sampling_params.logprobs
            out.logprobs.append(fake_logprobs(token, k, top_k=self._llm._top_k_logprobs))


class IterationResult:
    """`executor/result.py::IterationResult`: the async iterable of the iteration stats the
    runtime queues, ONE per executor. `__anext__` waits up to the timeout for the next item;
    when none comes it sets `_done` and ends, and `_done` stays set (later reads end at once)
    until `mark_undone()`, which only `generate_async` calls. Items are dicts (the real one
    `json.loads` what the worker queued); older releases yielded the JSON text (knob
    `LLM.stats_as_json`)."""

    def __init__(self, as_json: bool) -> None:
        self._done = False
        self._timeout: float | None = 2
        self._as_json = as_json
        self._items: list[dict] = []
        self._arrived: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def set_timeout(self, timeout: float | None) -> None:
        self._timeout = timeout

    def mark_undone(self) -> None:
        self._done = False

    def put(self, stat: dict) -> None:
        """The runtime queued one iteration's stats."""
        self._items.append(stat)
        if self._arrived is not None:
            self._arrived.set()

    def __aiter__(self):
        return self

    async def __anext__(self):
        if self._done:
            raise StopAsyncIteration
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # a fresh asyncio.run(): a queue of this loop
            self._loop, self._arrived = loop, asyncio.Event()
        while not self._items:
            self._arrived.clear()
            try:
                # asyncio.timeout, not wait_for: 3.11's wait_for can swallow a cancel that
                # races the wake-up (3.12, the release image's Python, cannot).
                async with asyncio.timeout(self._timeout):
                    await self._arrived.wait()
            except TimeoutError:
                self._done = True  # sticky: see the class docstring
                raise StopAsyncIteration from None
        stat = self._items.pop(0)
        return json.dumps(stat) if self._as_json else stat
