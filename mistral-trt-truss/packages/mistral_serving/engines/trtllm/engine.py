"""The TensorRT-LLM engines: our `Engine` protocol over TensorRT-LLM's LLM API (1.2.x).

`LlmApiEngine` holds everything both TensorRT-LLM engine kinds share: the sampling mapping,
streaming, abort, per-request errors, health, shutdown and the KV-cache gauge.
`TrtLlmEngine` (here) serves a TensorRT engine directory; `TrtLlmPytorchEngine`
(`pytorch_backend.py`) serves a Hugging Face checkpoint with the PyTorch backend.

What is called, and the source file (NVIDIA/TensorRT-LLM) each fact was read from:

- `tensorrt_llm._tensorrt_engine.LLM` is `llmapi/llm.py::_TrtLLM`, the TensorRT-engine
  backend (`_tensorrt_engine/__init__.py`); the plain `tensorrt_llm.LLM` is the PyTorch
  backend (`_TorchLLM`) and loads checkpoints, not engine directories.
- `LLM(model=engine_dir, tokenizer=engine_dir, ...)` loads the tokenizer files that sit in
  the artifact: `guided_decoding_backend="xgrammar"` builds its grammar tables from the
  LLM's tokenizer (`_TrtLLM._build_model`, `_xgrammar_tokenizer_info`). Prompts still go in
  as token ids and `detokenize=False` keeps it from ever decoding text.
- `llm.generate_async(token_ids, sampling_params=..., streaming=True)` returns at once a
  `RequestOutput` (`llmapi/llm.py`) that is an async iterator of itself
  (`executor/result.py`, `GenerationResult.__anext__`); `outputs[0].token_ids_diff` are the
  ids new since the last step (`logprobs_diff` their logprobs); `finish_reason` is 'stop' |
  'length' | 'timeout' | 'cancelled'; `.finished`; `.abort()` queues a cancel.
- `generate_async` raises ValueError for a request it refuses (`_check_arguments`,
  `SamplingParams._validate`) and RuntimeError("LLM is shutting down") once the executor is
  gone. With chunked prefill on (always, for our engines) `_check_arguments` does NOT check
  prompt + max_tokens against max_seq_len: `EngineLimits.fit` is the only guard.
- While iterating, a per-request failure raises `RequestError` (`executor/utils.py`) and the
  result is not marked done; any other error is a background (fatal) error: the executor
  shuts itself down and re-raises it (`executor/executor.py`, `_handle_background_error`)
  in ONE stream, the first to handle a response; every other stream then waits on a
  response queue that nothing fills. We end those ourselves (`_end_streams`).
- `RequestError` carries only a message. The one client-caused case that reaches it is a
  guided-decoding grammar the compiler refuses: the grammar is compiled inside the executor
  loop (`_torch/pyexecutor/guided_decoder.py::GuidedDecoder._build`, "TODO: Make this an
  error response"), whose error handler fails every active request with that message. So a
  grammar error is the client's (400) only for a request that sent a grammar; for the
  others it is an engine error. Everything else a client controls is checked before
  submission: lengths (`EngineLimits.fit`), sampling values (`SamplingParams._validate`, a
  ValueError from `generate_async`).
- `result.abort()` only queues the cancel (`executor.abort_request`): tokens of a step or two
  can still arrive before the final 'cancelled' response. We abort each request once.
- `llm.get_stats_async(timeout)` is an async iterable of iteration stats
  (`executor/result.py::IterationResult`): dicts (JSON strings in older releases) with
  `kvCacheStats.usedNumBlocks` / `maxNumBlocks`. There is ONE such iterable per executor
  and its `_done` is sticky: once a read waits `timeout` without a stat it stays done, and
  every later `get_stats_async` returns it finished, until the next `generate_async`
  (`GenerationExecutor._maybe_initialize_iteration_results`, its only reset). So one
  long-lived reader with a timeout far above the longest step reads it, restarted after a
  submission when it has ended (`_read_stats`).
- `llm.shutdown()` stops the executor and its MPI workers and sets `llm._executor = None`.
- Prompt logprobs (echo): `SamplingParams(return_context_logits=True)` puts the prompt's
  logits on `RequestOutput.context_logits` ([prompt length, vocab], `executor/result.py`),
  and we take their log-softmax ourselves (`sampling.prompt_logprobs`), as the PyTorch
  engines do. Not `SamplingParams.prompt_logprobs`: what it returns is the top k at each
  position, which need not hold the prompt token itself. The TensorRT backend has context
  logits only from an engine built with `gather_context_logits` (`_check_arguments`).
  `max_tokens` 0 (prefill only) runs as `max_tokens=1` and drops that token.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import time
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mistral_serving.artifacts.manifest import read_manifest
from mistral_serving.engines.base import (
    EngineError,
    EngineInfo,
    EngineLimits,
    EngineRequestError,
    FinishReason,
    SamplingOptions,
    TokenDelta,
    TokenLogprob,
    stop_ids_for,
)
from mistral_serving.engines.trtllm.checks import (
    EngineCheckError,
    GpuInfo,
    check_engine,
    check_engine_runtime,
    detect_gpu,
    read_engine_config,
    world_size,
)
from mistral_serving.ops.metrics import CacheStats
from mistral_serving.settings import TrtllmSettings

if TYPE_CHECKING:  # the image's tensorrt_llm; absent here (the type is then Any)
    from tensorrt_llm.sampling_params import SamplingParams

log = logging.getLogger(__name__)

# TensorRT-LLM's `CompletionOutput.finish_reason` (executor/result.py) -> ours. A request
# that ran past its time limit ('timeout') was cut short by the server, like an abort.
FINISH_REASONS: dict[str, FinishReason] = {
    "stop": "stop",
    "length": "length",
    "cancelled": "abort",
    "timeout": "abort",
}

# The stats reader's wait for the next iteration stat. Far above the longest step (a long
# prefill chunk): a read that times out leaves upstream's iterator done until the next
# submission, which would freeze the KV-cache gauge the Inference Gateway routes on.
STATS_TIMEOUT_S = 300.0

# Words of a guided-decoding compile error (RequestError has only a message; see above).
GRAMMAR_ERROR_MARKERS = ("grammar", "json schema", "xgrammar", "guided decoding")


def to_sampling_params(
    options: SamplingOptions,
    eos_token_id: int,
    pad_token_id: int | None,
    *,
    prompt_len: int = 0,
    logprobs_unavailable: str | None = None,
    prompt_logprobs_unavailable: str | None = None,
    top_logprobs_unavailable: str | None = None,
    penalties_unavailable: str | None = None,
) -> SamplingParams:
    """Our `SamplingOptions` as a `tensorrt_llm.sampling_params.SamplingParams`.

    Field names and defaults are from `tensorrt_llm/sampling_params.py` (1.2.x). Every value
    that has a surprising default is set explicitly: `max_tokens` (default 32), `end_id` /
    `pad_id` (None, which needs a tokenizer), `detokenize` (True), `prompt_ignore_length`
    (None: presence/frequency penalties count the prompt; ours count the output only).
    `logprobs_unavailable`: why this engine cannot return logprobs (None: it can); the
    same for `prompt_logprobs_unavailable` (context logits), `top_logprobs_unavailable`
    (top-k alternatives: logprobs above 0) and `penalties_unavailable` (what the sampler
    cannot apply).
    """
    from tensorrt_llm.sampling_params import GuidedDecodingParams, SamplingParams

    _refuse_unservable(
        options,
        logprobs_unavailable=logprobs_unavailable,
        prompt_logprobs_unavailable=prompt_logprobs_unavailable,
        top_logprobs_unavailable=top_logprobs_unavailable,
        penalties_unavailable=penalties_unavailable,
    )
    kwargs: dict[str, Any] = {
        "max_tokens": options.max_new_tokens,
        "end_id": eos_token_id,
        "pad_id": eos_token_id if pad_token_id is None else pad_token_id,
        "detokenize": False,  # we stream ids; text is built above the engine
        "n": 1,
        **_decoding_kwargs(options),
        **_penalty_kwargs(options, prompt_len),
        **_ending_and_output_kwargs(options, eos_token_id),
    }
    if options.guided is not None:
        if options.guided.kind == "json_object":
            kwargs["guided_decoding"] = GuidedDecodingParams(json_object=True)
        else:
            kwargs["guided_decoding"] = GuidedDecodingParams(json=options.guided.json_schema)
    try:
        return SamplingParams(**kwargs)
    except ValueError as exc:  # SamplingParams._validate: top_p / top_k / temperature range
        raise EngineRequestError(f"invalid sampling options: {exc}") from None


def _refuse_unservable(
    options: SamplingOptions,
    *,
    logprobs_unavailable: str | None,
    prompt_logprobs_unavailable: str | None,
    top_logprobs_unavailable: str | None,
    penalties_unavailable: str | None,
) -> None:
    """A request error for options out of range or that this engine cannot serve (each
    `*_unavailable` says why, None where it can)."""
    if options.max_new_tokens < 1:
        raise EngineRequestError(f"max_new_tokens must be at least 1, got {options.max_new_tokens}")
    if options.repetition_penalty <= 0:
        raise EngineRequestError(
            f"repetition_penalty must be above 0, got {options.repetition_penalty}"
        )
    if options.logprobs is not None and logprobs_unavailable:
        raise EngineRequestError(logprobs_unavailable)
    if options.prompt_logprobs is not None and prompt_logprobs_unavailable:
        raise EngineRequestError(prompt_logprobs_unavailable)
    if options.logprobs is not None and options.logprobs > 0 and top_logprobs_unavailable:
        raise EngineRequestError(top_logprobs_unavailable)
    penalised = (
        options.repetition_penalty != 1.0
        or options.presence_penalty != 0.0
        or options.frequency_penalty != 0.0
    )
    if penalised and penalties_unavailable:
        raise EngineRequestError(penalties_unavailable)


def _decoding_kwargs(options: SamplingOptions) -> dict[str, Any]:
    """How the next token is picked: greedy, or sampled with its temperature, top-k,
    top-p and seed."""
    if options.greedy:
        # top_k=1 is greedy in every 1.x release (`_greedy_decoding`); temperature and top_p
        # stay unset: temperature=0 is only accepted by recent releases.
        return {"top_k": 1, "seed": options.seed}
    return {
        "temperature": options.temperature,
        # Set explicitly: top_k=0 means all logits; an unset top_p means the C++ default
        # (0.0 in older releases, which with top_k=0 silently turns sampling greedy).
        "top_k": max(options.top_k, 0),
        # 1.0 is off (the wire formats map their own spellings of "off" to it); an
        # out-of-range value goes through for SamplingParams to reject.
        "top_p": options.top_p,
        # seed=None means the C++ default seed 0 for every request: identical prompts would
        # sample identical text. Draw one per request unless the client fixed it.
        "seed": options.seed if options.seed is not None else random.getrandbits(31),
    }


def _penalty_kwargs(options: SamplingOptions, prompt_len: int) -> dict[str, Any]:
    """The penalties that are not neutral (neutral ones stay unset so the runtime skips the
    penalty kernels)."""
    kwargs: dict[str, Any] = {}
    if options.repetition_penalty != 1.0:
        kwargs["repetition_penalty"] = options.repetition_penalty
    if options.presence_penalty != 0.0:
        kwargs["presence_penalty"] = options.presence_penalty
    if options.frequency_penalty != 0.0:
        kwargs["frequency_penalty"] = options.frequency_penalty
    if (options.presence_penalty or options.frequency_penalty) and prompt_len > 0:
        # Upstream counts prompt tokens too unless told to skip them (PR #8127, in 1.2.0).
        kwargs["prompt_ignore_length"] = prompt_len
    return kwargs


def _ending_and_output_kwargs(options: SamplingOptions, eos_token_id: int) -> dict[str, Any]:
    """What ends the answer (stop ids, ignore_eos, min_tokens) and what comes back with
    it (logprobs, context logits)."""
    kwargs: dict[str, Any] = {}
    stop_ids = [t for t in dict.fromkeys(options.stop_token_ids) if t != eos_token_id]
    if stop_ids:
        kwargs["stop_token_ids"] = stop_ids
    if options.ignore_eos:
        kwargs["ignore_eos"] = True
    if options.min_tokens > 0:
        # Holds back end_id only: stop_token_ids are stop words and can end it earlier.
        kwargs["min_tokens"] = options.min_tokens
    if options.logprobs is not None:
        # 0 (the chosen token only) would read as "off" (`self.logprobs and int(...)`):
        # ask for top-1, which always holds the chosen token, and keep what was asked.
        kwargs["logprobs"] = max(options.logprobs, 1)
    if options.prompt_logprobs is not None:
        kwargs["return_context_logits"] = True  # computed by us: see the module docstring
    return kwargs


def to_token_logprobs(token_ids: list[int], entries: list[Any], k: int) -> list[TokenLogprob]:
    """`CompletionOutput.logprobs` entries ({token id: Logprob(logprob, rank)}, one per
    token, the top-k and the chosen one) as ours: the chosen token's logprob and the k best."""
    if len(entries) < len(token_ids):
        raise EngineError(
            f"TensorRT-LLM returned {len(entries)} logprobs for {len(token_ids)} tokens"
        )
    out: list[TokenLogprob] = []
    for token, entry in zip(token_ids, entries, strict=False):
        if token not in entry:
            raise EngineError(f"TensorRT-LLM returned no logprob for the chosen token {token}")
        ranked = sorted(entry.items(), key=lambda kv: -float(kv[1].logprob))
        top = tuple((int(t), float(lp.logprob)) for t, lp in ranked[:k])
        out.append(TokenLogprob(token_id=token, logprob=float(entry[token].logprob), top=top))
    return out


@dataclass
class _Step:
    """One response's new tokens (the end token dropped), their logprob entries, and its
    finish reason if it was the last."""

    tokens: list[int]
    entries: list[Any]
    count: int  # the request's tokens so far, a dropped end token included
    reason: FinishReason | None = None
    stop_entry: tuple[int, Any] | None = None  # the dropped end token's entry (echo keeps it)

    def logprobs(self, k: int) -> list[TokenLogprob]:
        out = to_token_logprobs(self.tokens, self.entries, k)
        if self.stop_entry is not None:
            out += to_token_logprobs([self.stop_entry[0]], [self.stop_entry[1]], k)
        return out


def _read_step(
    output: Any,
    sampling: SamplingOptions,
    count: int,
    max_new: int,
    stop_ids: frozenset[int],
    echo: bool,
) -> _Step:
    """A response (`RequestOutput`) of a request that had `count` tokens before it."""
    completion = output.outputs[0]
    tokens = list(completion.token_ids_diff)
    entries = list(completion.logprobs_diff) if sampling.logprobs is not None else []
    step = _Step(tokens, entries, count + len(tokens))
    if not output.finished:
        return step
    reason = FINISH_REASONS.get(completion.finish_reason or "")
    if reason is None:  # not reported: infer it from the count
        reason = "length" if step.count >= max_new else "stop"
    step.reason = reason
    # Whether the runtime returns the end token is not pinned down; we never do.
    if reason == "stop" and tokens and tokens[-1] in stop_ids:
        stopped = tokens.pop()
        if echo and len(entries) > len(tokens):  # echo keeps its logprob
            step.stop_entry = (stopped, entries[len(tokens)])
        step.entries = entries[: len(tokens)]
    return step


def _prompt_logprobs(
    output: Any, prompt_ids: list[int], k: int | None
) -> list[TokenLogprob] | None:
    """The prompt tokens' logprobs from `output.context_logits` ([prompt length, vocab]),
    or None while the runtime has not sent them."""
    logits = getattr(output, "context_logits", None)
    if logits is None or k is None:
        return None
    from mistral_serving.engines.sampling import prompt_logprobs  # torch: only when asked

    if len(logits) != len(prompt_ids):
        raise EngineError(
            f"TensorRT-LLM returned context logits for {len(logits)} of {len(prompt_ids)} "
            "prompt tokens"
        )
    return prompt_logprobs(logits[: len(prompt_ids) - 1], prompt_ids, k)


def kv_usage_from_stat(stat: Any) -> float | None:
    """usedNumBlocks / maxNumBlocks of one iteration stat (a dict, or its JSON text)."""
    if isinstance(stat, str | bytes):
        stat = json.loads(stat)
    kv = stat.get("kvCacheStats") if isinstance(stat, dict) else None
    if not isinstance(kv, dict):
        return None
    used, total = kv.get("usedNumBlocks"), kv.get("maxNumBlocks")
    if not isinstance(used, int | float) or not isinstance(total, int | float) or total <= 0:
        return None
    return min(max(float(used) / float(total), 0.0), 1.0)


def _count(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) and value >= 0 else None


class CacheStatsReader:
    """`CacheStats` from the iteration stats, as trtllm-serve reads them
    (`metrics/collector.py::MetricsCollector.log_iteration_stats`): `kvCacheStats`'
    `tokensPerBlock`, `maxNumBlocks`, and `reusedBlocks` / `missedBlocks`, totals since the
    start (`missedBlocks` is absent in some releases' PyTorch backend:
    `_torch/pyexecutor/py_executor.py::_update_iter_stats`); preemptions from
    `inflightBatchingStats.numPausedRequests` (requests paused in that iteration): each rise
    counts, so requests paused in a row and resumed together count once (a lower bound)."""

    def __init__(self) -> None:
        self.stats: CacheStats | None = None
        self._paused = 0
        self._preemptions = 0

    def read(self, stat: Any) -> None:
        if isinstance(stat, str | bytes):
            stat = json.loads(stat)
        if not isinstance(stat, dict):
            return
        ifb = stat.get("inflightBatchingStats")
        paused = _count(ifb.get("numPausedRequests")) if isinstance(ifb, dict) else None
        if paused is not None:
            self._preemptions += max(0, paused - self._paused)
            self._paused = paused
        kv = stat.get("kvCacheStats")
        if not isinstance(kv, dict):
            return
        block, total = _count(kv.get("tokensPerBlock")), _count(kv.get("maxNumBlocks"))
        if not block or total is None:
            return
        self.stats = CacheStats(
            block_size=block,
            num_gpu_blocks=total,
            reused_blocks=_count(kv.get("reusedBlocks")) or 0,
            missed_blocks=_count(kv.get("missedBlocks")),
            preemptions=self._preemptions,
        )


def scheduler_config(settings: TrtllmSettings) -> Any:
    """`SchedulerConfig(capacity_scheduler_policy=...)` (llmapi/llm_args.py) from settings."""
    from tensorrt_llm.llmapi import CapacitySchedulerPolicy, SchedulerConfig

    policy = CapacitySchedulerPolicy[settings.trtllm_capacity_scheduler_policy.upper()]
    return SchedulerConfig(capacity_scheduler_policy=policy)


def kv_cache_config(settings: TrtllmSettings) -> Any:
    """`KvCacheConfig(free_gpu_memory_fraction=..., enable_block_reuse=...)`
    (llmapi/llm_args.py) from settings: the same for both engine kinds."""
    from tensorrt_llm.llmapi import KvCacheConfig

    return KvCacheConfig(
        free_gpu_memory_fraction=settings.kv_cache_free_gpu_memory_fraction,
        enable_block_reuse=settings.trtllm_kv_block_reuse,
    )


def prompt_logits_limit(settings: TrtllmSettings) -> int:
    """The bound on the prompt logits echo requests hold at once (every engine's limit)."""
    return settings.prefill_logits_bytes


class PromptLogitsBudget:
    """The prompt logits the requests that echo with logprobs hold at once. The runtime hands
    each such request its whole `context_logits`, [prompt length, vocab] float32 (4 GB for
    a 32k-token prompt of a 32k vocabulary), in one piece: a request whose logits alone
    exceed the budget is refused; others wait until the running ones leave room. One event
    loop: no lock needed."""

    def __init__(self, limit_bytes: int, vocab_size: int) -> None:
        self.limit = limit_bytes
        self.vocab_size = vocab_size
        self.held = 0
        self._waiters: list[asyncio.Future[None]] = []

    def bytes_for(self, prompt_len: int) -> int:
        need = prompt_len * self.vocab_size * 4
        if need > self.limit:
            raise EngineRequestError(
                f"echo with logprobs on a {prompt_len}-token prompt needs {need / 2**20:.0f} MiB "
                f"of prompt logits ({prompt_len} x {self.vocab_size} float32), more than "
                f"prefill_logits_bytes ({self.limit / 2**20:.0f} MiB): shorten the prompt"
            )
        return need

    async def acquire(self, need: int) -> None:
        while self.held + need > self.limit:
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            finally:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
        self.held += need

    def release(self, need: int) -> None:
        self.held -= need
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)


class LlmApiEngine:
    """One TensorRT-LLM LLM-API instance; concurrent `generate` calls are batched in flight
    by the executor. Must be used from one asyncio event loop: `generate_async` binds each
    result's queue to the loop running when it is called (`executor/result.py`)."""

    def __init__(
        self,
        llm: Any,
        *,
        limits: EngineLimits,
        eos_token_id: int,
        pad_token_id: int | None = None,
        info: EngineInfo | None = None,
        request_error: type[BaseException] | None = None,
        logprobs_unavailable: str | None = None,
        prompt_logprobs_unavailable: str | None = None,
        top_logprobs_unavailable: str | None = None,
        penalties_unavailable: str | None = None,
        prompt_logits: PromptLogitsBudget | None = None,
    ) -> None:
        self.llm = llm
        self._prompt_logits = prompt_logits  # None: prompt logits unbounded
        self.limits = limits
        self.eos_token_id = eos_token_id
        self.pad_token_id = pad_token_id
        self.info = info or EngineInfo(name="tensorrt_llm")
        self.logprobs_unavailable = logprobs_unavailable
        self.prompt_logprobs_unavailable = prompt_logprobs_unavailable
        self.top_logprobs_unavailable = top_logprobs_unavailable
        self.penalties_unavailable = penalties_unavailable
        # tensorrt_llm's RequestError: a per-request failure that leaves the engine healthy.
        self._request_error: tuple[type[BaseException], ...] = (
            (request_error,) if request_error else ()
        )
        self._results: dict[str, Any] = {}  # our request id -> RequestOutput
        self._guided: set[str] = set()  # request ids that sent a grammar
        self._aborted: set[str] = set()  # request ids already cancelled in the executor
        self._waiting: dict[str, asyncio.Task[Any]] = {}  # request id -> task awaiting it
        self._ended: set[str] = set()  # request ids whose wait we cancelled (fatal error)
        self._fatal: BaseException | None = None
        self._shut_down = False
        self._kv_usage = 0.0
        self._cache = CacheStatsReader()
        self._stats_task: asyncio.Task[None] | None = None
        self._submissions = 0  # generate_async calls (each makes the stats iterable undone)
        self._progress_at = time.monotonic()  # the last response or stat (the heartbeat)

    def generate(
        self, request_id: str, prompt_ids: list[int], sampling: SamplingOptions
    ) -> AsyncIterator[TokenDelta]:
        bounded = self._prompt_logits is not None and not self.prompt_logprobs_unavailable
        if sampling.prompt_logprobs is not None and bounded:
            return self._generate_echo(request_id, prompt_ids, sampling)
        return self._generate(request_id, prompt_ids, sampling)

    async def _generate_echo(
        self, request_id: str, prompt_ids: list[int], sampling: SamplingOptions
    ) -> AsyncIterator[TokenDelta]:
        """`_generate` holding its prompt logits in the budget until it ends."""
        assert self._prompt_logits is not None
        need = self._prompt_logits.bytes_for(len(prompt_ids))
        await self._prompt_logits.acquire(need)
        try:
            async with contextlib.aclosing(self._generate(request_id, prompt_ids, sampling)) as it:
                async for delta in it:
                    yield delta
        finally:
            self._prompt_logits.release(need)

    async def _generate(
        self, request_id: str, prompt_ids: list[int], sampling: SamplingOptions
    ) -> AsyncGenerator[TokenDelta, None]:
        if request_id in self._results:
            raise EngineRequestError(f"request id {request_id!r} is already generating")
        echo = sampling.prompt_logprobs is not None
        prefill_only = sampling.max_new_tokens == 0  # runs as 1, sends none
        # Chunked prefill: the LLM API does not check prompt + max_tokens itself.
        max_new = self.limits.fit(len(prompt_ids), 1 if prefill_only else sampling.max_new_tokens)
        if prefill_only and not echo:  # nothing to compute
            yield TokenDelta([], "length")
            return
        stop_ids = stop_ids_for(self.eos_token_id, sampling)
        result = self._submit(request_id, prompt_ids, sampling, max_new)
        count = 0
        finished = False
        prompt_lps: list[TokenLogprob] | None = None  # until sent with the first delta
        prompt_sent = not echo
        try:
            while True:
                try:
                    output = await self._next_output(request_id, result)
                except StopAsyncIteration:
                    break
                if not prompt_sent and prompt_lps is None:
                    prompt_lps = _prompt_logprobs(output, prompt_ids, sampling.prompt_logprobs)
                if prefill_only:
                    if prompt_lps is None and not output.finished:
                        continue  # the context logits have not come yet
                    if prompt_lps is None:
                        raise EngineError("TensorRT-LLM returned no context logits")
                    finished = output.finished
                    yield TokenDelta([], "length", prompt_logprobs=prompt_lps)
                    return  # `finally` aborts it if the runtime is not done with it
                step = _read_step(output, sampling, count, max_new, stop_ids, echo)
                count = step.count
                if step.tokens or step.reason:
                    if not prompt_sent and prompt_lps is None:
                        raise EngineError("TensorRT-LLM returned no context logits")
                    finished = step.reason is not None
                    k = sampling.logprobs
                    logprobs = None if k is None else step.logprobs(k)
                    yield TokenDelta(
                        step.tokens, step.reason, logprobs, None if prompt_sent else prompt_lps
                    )
                    prompt_sent = True
                if finished:
                    return
            finished = True
            yield TokenDelta(token_ids=[], finish_reason="stop")  # ended without a reason
        except Exception as exc:
            raise self._failed(request_id, exc) from exc
        finally:
            # Client gone (aclose -> GeneratorExit, task cancelled -> CancelledError) or an
            # error: free the sequence's batch slot and KV cache now, not at max_tokens.
            self._release(request_id, result, finished)

    def _submit(
        self, request_id: str, prompt_ids: list[int], sampling: SamplingOptions, max_new: int
    ) -> Any:
        """Hand the request to the executor (`max_new` tokens at most) and keep its
        streaming result."""
        params = to_sampling_params(
            replace(sampling, max_new_tokens=max_new),
            self.eos_token_id,
            self.pad_token_id,
            prompt_len=len(prompt_ids),
            logprobs_unavailable=self.logprobs_unavailable,
            prompt_logprobs_unavailable=self.prompt_logprobs_unavailable,
            top_logprobs_unavailable=self.top_logprobs_unavailable,
            penalties_unavailable=self.penalties_unavailable,
        )
        if not self._results:  # work pending from now: the heartbeat counts from here
            self._progress_at = time.monotonic()
        try:
            result = self.llm.generate_async(
                list(prompt_ids), sampling_params=params, streaming=True
            )
        except ValueError as exc:  # refused for its inputs (_check_arguments, SamplingParams)
            raise EngineRequestError(str(exc)) from None
        except Exception as exc:
            raise self._failed(request_id, exc) from exc
        self._results[request_id] = result
        if sampling.guided is not None:
            self._guided.add(request_id)
        self._aborted.discard(request_id)
        self._stats_submitted()
        return result

    def _release(self, request_id: str, result: Any, finished: bool) -> None:
        """Forget a request that ended, and cancel it in the executor unless it finished."""
        self._results.pop(request_id, None)
        self._guided.discard(request_id)
        if not finished:
            self._abort_result(request_id, result)
        self._aborted.discard(request_id)
        self._ended.discard(request_id)

    def abort(self, request_id: str) -> None:
        result = self._results.get(request_id)
        if result is not None:
            self._abort_result(request_id, result)

    def num_running(self) -> int:
        return len(self._results)

    def stalled_for(self) -> float:
        """Seconds since the last response or iteration stat while requests are pending
        (the watchdog's heartbeat); 0.0 when idle."""
        if not self._results:
            return 0.0
        return max(0.0, time.monotonic() - self._progress_at)

    async def _next_output(self, request_id: str, result: Any) -> Any:
        """The request's next response. While it waits, a fatal error raised in another
        stream may end the wait (`_end_streams`): upstream would leave it waiting forever."""
        task = asyncio.current_task()
        if task is not None:
            self._waiting[request_id] = task
        try:
            output = await result.__anext__()
        except asyncio.CancelledError:
            if request_id not in self._ended or task is None:
                raise
            task.uncancel()  # our cancel, not the caller's: this request failed
            raise EngineError(f"TensorRT-LLM engine failed: {self._fatal}") from None
        finally:
            self._waiting.pop(request_id, None)
        self._progress_at = time.monotonic()
        return output

    def _end_streams(self, failed: str) -> None:
        """After a fatal error raised in request `failed`: end every other request's wait."""
        for request_id, task in list(self._waiting.items()):
            if request_id != failed and request_id not in self._ended:
                self._ended.add(request_id)
                task.cancel()

    def is_healthy(self) -> bool:
        if self._shut_down or self._fatal is not None:
            return False
        # LLM.shutdown() sets `_executor` to None, and a fatal background error shuts the
        # executor down (`executor/executor.py`: is_shutdown()). Private, so read with care.
        if not hasattr(self.llm, "_executor"):
            return True
        executor = self.llm._executor
        if executor is None:
            return False
        is_shutdown = getattr(executor, "is_shutdown", None)
        return not (callable(is_shutdown) and is_shutdown())

    def shutdown(self) -> None:
        """Stop the executor and its MPI workers (the end of the drain calls this)."""
        if self._shut_down:
            return
        self._shut_down = True
        if self._stats_task is not None:
            self._stats_task.cancel()
        try:
            self.llm.shutdown()
        except Exception:  # shutting down anyway: say so, never raise from the drain
            log.warning("TensorRT-LLM shutdown failed", exc_info=True)

    def kv_cache_usage(self) -> float:
        """Share of the KV-cache blocks in use (0..1), the last iteration stat's. No request
        running means no block held (reusable blocks count as free), so 0."""
        return self._kv_usage if self._results else 0.0

    def cache_stats(self) -> CacheStats | None:
        """Block size, blocks, prefix-cache reuse and preemptions: None before the first
        iteration stat."""
        return self._cache.stats

    def _stats_submitted(self) -> None:
        """A request went in (which makes upstream's stats iterable undone): make sure the
        reader runs."""
        self._submissions += 1
        if self._stats_task is None and not self._shut_down:
            self._stats_task = asyncio.get_running_loop().create_task(self._read_stats())

    async def _read_stats(self) -> None:
        """Read the iteration stats for as long as they come (module docstring: the
        iterable stays done after a timeout, until a submission; then read it again)."""
        try:
            while not self._shut_down:
                submissions = self._submissions
                async for item in self.llm.get_stats_async(timeout=STATS_TIMEOUT_S):
                    self._progress_at = time.monotonic()
                    stat = json.loads(item) if isinstance(item, str | bytes) else item
                    usage = kv_usage_from_stat(stat)
                    if usage is not None:
                        self._kv_usage = usage
                    self._cache.read(stat)
                if self._submissions == submissions:
                    return  # done until the next submission, which starts a new reader
        except asyncio.CancelledError:
            raise
        except Exception:  # a gauge must never hurt serving
            log.warning("reading TensorRT-LLM iteration stats failed", exc_info=True)
        finally:
            self._stats_task = None

    def _abort_result(self, request_id: str, result: Any) -> None:
        """Cancel in the executor, once per request (abort() only queues the cancel, and the
        stream's own cleanup would send a second one)."""
        if getattr(result, "finished", False) or request_id in self._aborted:
            return
        self._aborted.add(request_id)
        try:
            result.abort()
        except Exception:  # the executor may already be gone; nothing left to free
            log.warning("abort of request %s failed", request_id, exc_info=True)

    def _failed(self, request_id: str, exc: BaseException) -> EngineError | EngineRequestError:
        """What `exc` means for this request: EngineRequestError (the client's input),
        EngineError (this request failed), or EngineError after marking the engine
        unhealthy and ending every other stream (a fatal error)."""
        if isinstance(exc, EngineError | EngineRequestError):
            return exc
        if self._request_error and isinstance(exc, self._request_error):
            message = str(exc)
            if request_id in self._guided and any(
                marker in message.lower() for marker in GRAMMAR_ERROR_MARKERS
            ):
                return EngineRequestError(
                    f"the response_format schema was refused by TensorRT-LLM's grammar "
                    f"compiler: {message}"
                )
            return EngineError(f"request {request_id} failed in TensorRT-LLM: {message}")
        if not isinstance(exc, asyncio.CancelledError):
            self._fatal = exc
            log.error("TensorRT-LLM executor failed; engine is now unhealthy: %r", exc)
            self._end_streams(request_id)
        return EngineError(f"TensorRT-LLM engine failed: {exc}")


class TrtLlmEngine(LlmApiEngine):
    """A TensorRT engine directory built by `python build.py engine`."""

    @classmethod
    def load(
        cls,
        engine_dir: Path,
        settings: TrtllmSettings,
        *,
        eos_token_id: int,
        pad_token_id: int | None = None,
        gpu: GpuInfo | None = None,
        tokenizer_vocab_size: int | None = None,
        config: dict[str, Any] | None = None,
        built_capability: str | None = None,
    ) -> TrtLlmEngine:
        """Check the engine directory against this machine, then start the engine.
        `gpu` None means detect it (NVML: no CUDA context in this process). `config` (config.json) and
        `built_capability` (from the build manifest) come from the `Artifact` when the
        caller has it; otherwise they are read from `engine_dir`."""
        tensorrt_llm, LLM, RequestError = _import_engine_runtime(engine_dir)
        engine_dir = Path(engine_dir)
        if config is None:
            config, built_capability = _read_engine_dir(engine_dir)
        built = check_engine(
            engine_dir,
            config,
            built_capability,
            installed_version=tensorrt_llm.__version__,
            gpu=gpu or detect_gpu(),
            max_input_len=settings.max_input_len,
            max_seq_len=settings.max_seq_len,
            tokenizer_vocab_size=tokenizer_vocab_size,
        )
        features = BuiltFeatures.of(config)
        # Aborting a request with logprobs while generation logits are gathered crashes the
        # executor (upstream issue 10810: 1.1.0, 1.2.0rc7), and every client disconnect is an
        # abort. Off unless verify-gpu showed this release survives it; then the runtime
        # switch stays off too (it also forces the single-process worker).
        serves_logprobs = features.gathers_logits and settings.trtllm_logprobs_abort_safe
        llm = _start_llm(LLM, engine_dir, settings, features, serves_logprobs)
        vocab_size = int(config["pretrained_config"].get("vocab_size") or 0)
        return cls(
            llm,
            limits=effective_limits(built, settings),
            eos_token_id=eos_token_id,
            pad_token_id=pad_token_id,
            info=_engine_info(
                engine_dir, config, built, settings, tensorrt_llm.__version__, serves_logprobs
            ),
            request_error=RequestError,
            logprobs_unavailable=None
            if serves_logprobs
            else logprobs_unavailable(features.gathers_logits),
            prompt_logits=PromptLogitsBudget(prompt_logits_limit(settings), vocab_size)
            if features.gathers_context
            else None,
            prompt_logprobs_unavailable=None
            if features.gathers_context
            else ENGINE_PROMPT_LOGPROBS_UNAVAILABLE,
        )


def _read_engine_dir(engine_dir: Path) -> tuple[dict[str, Any], str | None]:
    """An engine directory's config.json, and the compute capability its build manifest
    says it was built for (None without one)."""
    config = read_engine_config(engine_dir)
    manifest = read_manifest(engine_dir)
    return config, manifest.gpu.compute_capability if manifest and manifest.gpu else None


def _start_llm(
    LLM: Any, engine_dir: Path, settings: TrtllmSettings, features: BuiltFeatures, logprobs: bool
) -> Any:
    """TensorRT-LLM's LLM API over the engine directory (its tokenizer files too:
    xgrammar builds its tables from them)."""
    kwargs: dict[str, Any] = {
        "kv_cache_config": kv_cache_config(settings),
        "scheduler_config": scheduler_config(settings),
        "enable_chunked_prefill": features.chunked_prefill,
        "guided_decoding_backend": "xgrammar",
    }
    if logprobs:
        kwargs["gather_generation_logits"] = True
    try:
        return LLM(model=str(engine_dir), tokenizer=str(engine_dir), **kwargs)
    except Exception as exc:
        raise EngineError(f"TensorRT-LLM could not start {engine_dir}: {exc}") from exc


def _engine_info(
    engine_dir: Path,
    config: dict[str, Any],
    built: EngineLimits,
    settings: TrtllmSettings,
    version: str,
    serves_logprobs: bool,
) -> EngineInfo:
    """What `/v1/models` and the start-up log say of a TensorRT engine."""
    pretrained = config["pretrained_config"]
    features = BuiltFeatures.of(config)
    return EngineInfo(
        name="tensorrt_llm",
        details={
            "engine_dir": str(engine_dir),
            "tensorrt_llm_version": version,
            "built_with": config.get("version"),
            "architecture": pretrained.get("architecture"),
            "dtype": pretrained.get("dtype"),
            "world_size": world_size(config),
            "built_limits": vars(built),
            "kv_cache_free_gpu_memory_fraction": settings.kv_cache_free_gpu_memory_fraction,
            "capacity_scheduler_policy": settings.trtllm_capacity_scheduler_policy,
            "chunked_prefill": features.chunked_prefill,
            "logprobs": serves_logprobs,
            "prompt_logprobs": features.gathers_context,
        },
    )


def _import_engine_runtime(engine_dir: Path) -> tuple[Any, Any, type[BaseException]]:
    """tensorrt_llm, its TensorRT-engine `LLM` and its `RequestError`, imported here so the
    package imports (and its tests run) without tensorrt_llm."""
    try:
        import tensorrt_llm

        check_engine_runtime(tensorrt_llm.__version__)  # 1.3+: no _tensorrt_engine
        from tensorrt_llm._tensorrt_engine import LLM
        from tensorrt_llm.llmapi import RequestError
    except ImportError as exc:
        raise EngineCheckError(
            f"{engine_dir} is a TensorRT-LLM engine but tensorrt_llm cannot be imported "
            f"({exc}); serve it from the TensorRT-LLM 1.2.x release image"
        ) from exc
    return tensorrt_llm, LLM, RequestError


@dataclass(frozen=True)
class BuiltFeatures:
    """What a TensorRT engine was built with that decides what it serves."""

    # Prompts longer than the engine's max_num_tokens need chunked prefill
    # (llmapi/llm_args.py: enable_chunked_prefill, default False), which needs an
    # engine built with paged context FMHA, as `build.py engine` builds them.
    chunked_prefill: bool
    # Logprobs come from the generation logits, which the engine must gather
    # (`_check_arguments`: logprobs need LLM(gather_generation_logits=True)).
    gathers_logits: bool
    # Prompt logprobs (echo) come from the context logits, gathered only if built so.
    gathers_context: bool

    @classmethod
    def of(cls, config: dict[str, Any]) -> BuiltFeatures:
        build_config = config.get("build_config", {})
        return cls(
            chunked_prefill=bool(
                build_config.get("plugin_config", {}).get("use_paged_context_fmha")
            ),
            gathers_logits=bool(build_config.get("gather_generation_logits")),
            gathers_context=bool(build_config.get("gather_context_logits")),
        )


def logprobs_unavailable(gathers_logits: bool) -> str:
    """Why a TensorRT engine that does not serve logprobs refuses them."""
    if gathers_logits:
        return (
            "logprobs need engine=trtllm_pytorch (serve the checkpoint): this engine "
            "gathers generation logits, but TensorRT-LLM 1.1.0 and 1.2.0rc7 crash when a "
            "request with logprobs is aborted (any client disconnect); "
            "trtllm_logprobs_abort_safe=true serves them once verify-gpu's abort check "
            "passed with it on this release"
        )
    return (
        "logprobs need engine=trtllm_pytorch (serve the checkpoint): engines from "
        "build.py engine do not gather generation logits"
    )


ENGINE_PROMPT_LOGPROBS_UNAVAILABLE = (
    "echo with logprobs (prompt logprobs) is not available from this TensorRT "
    "engine: it was built without gather_context_logits (serve the checkpoint "
    "with engine=trtllm_pytorch)"
)


def effective_limits(built: EngineLimits, settings: TrtllmSettings) -> EngineLimits:
    """The engine's built limits, lowered by the max_input_len / max_seq_len settings."""
    max_seq_len = min(built.max_seq_len, settings.max_seq_len or built.max_seq_len)
    max_input_len = min(built.max_input_len, settings.max_input_len or built.max_input_len)
    return EngineLimits(
        max_input_len=min(max_input_len, max_seq_len - 1),
        max_seq_len=max_seq_len,
        max_batch_size=built.max_batch_size,
    )
