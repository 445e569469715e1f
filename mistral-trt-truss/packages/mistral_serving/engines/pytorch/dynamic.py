"""The PyTorch engine: a transformers causal LM with in-flight (continuous) batching.

Used for the dev model on CPU and as the fallback on GPUs without a TensorRT-LLM engine.
One background thread owns the model and runs steps; every step it
  1. drops aborted requests,
  2. admits waiting requests (up to `max_batch_size` sequences, `max_num_tokens` padded
     positions and `prefill_logits_bytes` of logits a step: `prefill.py`, the rule both
     PyTorch engines share) and prefills them together, left-padded,
  3. decodes one token for every running sequence in one forward pass,
so a request joins and leaves the running batch at any step instead of waiting for a
batch to drain. Sequences of different lengths share one left-padded KV cache; joining
pads the shorter side, leaving trims columns that are padding for every row.

Sampling is per request (`sampling.py`). Whatever fails while handling one sequence
(its sampling, its bookkeeping) ends that sequence's stream with `EngineError`; the other
sequences and the engine go on. Only a failing forward pass (the whole step) stops the
engine and marks it unhealthy.

Request options: `ignore_eos` (EOS is an ordinary token; only `max_new_tokens` and
stop_token_ids end generation), `min_tokens` (EOS and stop_token_ids are masked until that
many tokens exist), `logprobs` (each token's log-probability and the top k, from the
logits after penalties and before temperature, top-k and top-p: see `sampling.py`),
`prompt_logprobs` (each prompt token's logprob, from the final hidden states of the
prefill that runs anyway, for the rows that ask only, projected through lm_head in chunks:
no second forward pass, no logits for other rows' positions; with `max_new_tokens` 0 the request ends after it, with
finish reason `length`). A request with `prompt_logprobs` that ends on a stop token gets
that token's logprob on its last delta (with no token id; vLLM's output holds its stop
token too): echo clients (lm-evaluation-harness) index prompt + output logprobs by position.
Structured output (`guided`) needs `engine.guided` set (a `mistral_serving.engines.pytorch.guided`
decoder: its per-request matcher masks each row before sampling and is told each chosen
token); without it such a request is refused with a 4xx.

The fast path is the static engine (preallocated KV slots, our own Llama/Mistral forward
pass, CUDA graphs; docs/perf/history/round-01.md measured both). `factory.py` picks (`pytorch_kv_cache: auto`: static on a CUDA GPU
for the architectures it supports).
"""

from __future__ import annotations

import asyncio
import collections
import inspect
import logging
import random
import threading
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self, cast

import torch
import torch.nn.functional as F

from mistral_serving.engines.base import (
    EngineError,
    EngineInfo,
    EngineLimits,
    EngineRequestError,
    FinishReason,
    Heartbeat,
    Loop,
    SamplingOptions,
    Sink,
    TokenDelta,
    TokenLogprob,
    deliver,
    read_stream,
    refuse_unsupported,
    set_gil_switch_interval,
    stop_ids_for,
)
from mistral_serving.engines.pytorch.cpus import available_cpus, default_torch_threads
from mistral_serving.engines.pytorch.prefill import (
    PrefillBudget,
    chunked_prompt_logprobs,
    is_allocation_failure,
    take_admissible,
)
from mistral_serving.engines.sampling import Sampled, sample_next_tokens
from mistral_serving.settings import TorchEngineSettings

if TYPE_CHECKING:
    from transformers import DynamicCache

    from mistral_serving.engines.pytorch.guided import GuidedDecoder, GuidedMatcher

log = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
_JOIN_TIMEOUT_S = 30.0


@dataclass(eq=False)
class _Sequence:
    request_id: str
    prompt: list[int]
    sampling: SamplingOptions
    max_new_tokens: int
    generator: torch.Generator
    # Where this sequence's deltas go: a queue read on the event loop `loop`.
    loop: Loop
    queue: Sink
    stop_ids: frozenset[int] = frozenset()
    generated: list[int] = field(default_factory=list)
    # Structured output: `mask_fn` edits the row's logits in place before sampling
    # (disallowed tokens to -inf); `accept_fn` is told every chosen token.
    mask_fn: Callable[[torch.Tensor], None] | None = None
    accept_fn: Callable[[int], None] | None = None
    # Prompt logprobs (when asked), computed at prefill, sent with the first delta.
    prompt_lps: list[TokenLogprob] | None = None

    def emit(self, item: TokenDelta | BaseException) -> None:
        deliver([(self.loop, self.queue, item)])


def pick_device(setting: str) -> torch.device:
    if setting == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if setting == "cuda" and not torch.cuda.is_available():
        raise EngineError("device=cuda but no CUDA GPU is visible (check nvidia.com/gpu limits)")
    return torch.device(setting)


def pick_dtype(setting: str, device: torch.device) -> torch.dtype:
    if setting != "auto":
        return _DTYPES[setting]
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.float32


def _has_accelerate() -> bool:
    import importlib.util

    return importlib.util.find_spec("accelerate") is not None


@dataclass(frozen=True)
class LoadedModel:
    model: torch.nn.Module
    max_seq_len: int  # the model's positions, lowered by settings
    max_input_len: int


def load_model(
    model_dir: Path,
    settings: TorchEngineSettings,
    loader: Callable[[Path, object, torch.dtype, torch.device], torch.nn.Module | None]
    | None = None,
    config: Any | None = None,
) -> LoadedModel:
    """The checkpoint on its device, eval mode, with the sequence limits settings allow.
    `loader(model_dir, config, dtype, device)` is tried before transformers'
    `from_pretrained` (the static engine's direct safetensors loader; None: not for it).
    `config`: the checkpoint's config object when the caller made it (else AutoConfig's)."""
    # Threads for the CPUs we really have (a quota, an affinity mask), less one for the loop.
    torch.set_num_threads(settings.torch_threads or default_torch_threads(available_cpus()))
    device = pick_device(settings.device)
    dtype = pick_dtype(settings.torch_dtype, device)
    if config is None:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(str(model_dir))
    positions = int(getattr(config, "max_position_embeddings", 0) or 0)
    if positions < 2:
        raise EngineError(f"{model_dir}/config.json has no usable max_position_embeddings")
    max_seq = min(positions, settings.max_seq_len or positions)
    max_input = min(settings.max_input_len or max_seq - 1, max_seq - 1)
    # Straight to the GPU (no host copy of the weights) where transformers can.
    model = loader(model_dir, config, dtype, device) if loader is not None else None
    if model is None:
        # Imported only here: in transformers 5.17 this import pulls in the whole modeling
        # stack (torch.distributed.tensor's custom ops, sklearn): seconds of a cold start
        # that the direct loader never needs (docs/perf/history/round-06.md, goal 4).
        from transformers import AutoModelForCausalLM

        placement = {"device_map": device} if device.type == "cuda" and _has_accelerate() else {}
        model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype, **placement)
    model = model.to(device).eval()
    if device.type == "cuda":  # a GPU step is a few ms: the GIL must not hold it up
        set_gil_switch_interval(settings.gil_switch_interval_ms)
    return LoadedModel(model, max_seq, max_input)


@dataclass(frozen=True)
class TorchOptions:
    """The settings a PyTorch engine is built with, beyond its limits (defaults: Settings')."""

    max_num_tokens: int = TorchEngineSettings.model_fields["max_num_tokens"].default
    prefill_logits_bytes: int = TorchEngineSettings.model_fields["prefill_logits_bytes"].default

    @classmethod
    def from_settings(cls, settings: TorchEngineSettings) -> TorchOptions:
        return cls(settings.max_num_tokens, settings.prefill_logits_bytes)


class TorchEngine:
    def __init__(
        self,
        model: torch.nn.Module,
        eos_token_id: int,
        limits: EngineLimits,
        options: TorchOptions = TorchOptions(),
    ) -> None:
        self._prepare(model, limits, options)
        # A transformers model or the static path's own modules: called and probed by
        # name (torch types a module's attributes as `Tensor | Module`).
        self._model: Any = cast(Any, model)
        self._device = next(model.parameters()).device
        self._vocab: int = self._model.get_input_embeddings().num_embeddings
        # lm_head: the static engine's own modules have no get_output_embeddings().
        head = getattr(model, "lm_head", None)
        self._head: Any = head if head is not None else self._model.get_output_embeddings()
        self._budget = PrefillBudget(
            options.max_num_tokens,
            options.prefill_logits_bytes,
            self._head.weight.shape[0],
            self._head.weight.element_size(),
        )
        self.eos_token_id = eos_token_id
        self.limits = limits
        self.info = self._describe(model, limits, options)
        self._committed = False  # whether the prefill under way has joined the batch
        # transformers 5.x names the KV cache argument `cache`; 4.57 (the TensorRT-LLM
        # image's pin) calls it `past_key_values`.
        params = inspect.signature(model.forward).parameters
        self._cache_arg = "cache" if "cache" in params else "past_key_values"
        self._lock = threading.Lock()
        self._waiting: collections.deque[_Sequence] = collections.deque()
        self._aborted: set[str] = set()
        # Requests whose grammar is compiling (not queued yet): id -> aborted meanwhile.
        self._compiling: dict[str, bool] = {}
        self._wake = threading.Event()
        self._closing = threading.Event()
        self._fatal: BaseException | None = None
        self._heartbeat = Heartbeat()  # beats once per step-loop pass (the watchdog reads it)
        # Structured output, when set: `.matcher(GuidedDecoding)` gives a per-request
        # object with `mask(row_logits)` and `accept(token_id)` (`mistral_serving.engines.pytorch.guided`).
        self.guided: GuidedDecoder | None = None
        # Read from other threads (gauges): plain values the engine thread replaces.
        self._kv_usage = 0.0
        self._n_running = 0
        # Running batch (engine thread only).
        self._running: list[_Sequence] = []
        self._admitting: list[_Sequence] = []
        self._cache: DynamicCache | None = None  # per layer [B, H, T, D]
        self._mask = torch.zeros((0, 0), dtype=torch.long, device=self._device)
        self._last = torch.zeros(0, dtype=torch.long, device=self._device)
        self._pos = torch.zeros(0, dtype=torch.long, device=self._device)
        self._thread = threading.Thread(target=self._run, name="torch-engine", daemon=True)
        self._thread.start()

    @classmethod
    def from_pretrained(
        cls, model_dir: Path, settings: TorchEngineSettings, eos_token_id: int
    ) -> TorchEngine:
        return cls.for_model(load_model(model_dir, settings), settings, eos_token_id)

    @classmethod
    def for_model(
        cls, loaded: LoadedModel, settings: TorchEngineSettings, eos_token_id: int
    ) -> Self:
        limits = cls.limits_for(loaded, settings)
        return cls(loaded.model, eos_token_id, limits, cls.options_for(settings))

    @classmethod
    def options_for(cls, settings: TorchEngineSettings) -> TorchOptions:
        """This engine's options from the settings (a subclass adds its own)."""
        return TorchOptions.from_settings(settings)

    # ---- what a subclass (the static engine) adds ----

    @classmethod
    def limits_for(cls, loaded: LoadedModel, settings: TorchEngineSettings) -> EngineLimits:
        """The engine's limits for this model: the model's positions, lowered by settings."""
        return EngineLimits(loaded.max_input_len, loaded.max_seq_len, settings.max_batch_size)

    def _prepare(self, model: torch.nn.Module, limits: EngineLimits, options: TorchOptions) -> None:
        """Check and set up `model` before the engine is built around it (nothing here)."""

    def _details(self) -> dict[str, object]:
        """What the engine adds to its `info.details`."""
        return {}

    def _describe(
        self, model: torch.nn.Module, limits: EngineLimits, options: TorchOptions
    ) -> EngineInfo:
        """The engine's report (`/version`, the start-up log): device, dtype and limits,
        then the kind's own `_details`."""
        return EngineInfo(
            "pytorch",
            {
                "device": str(self._device),
                "dtype": str(next(model.parameters()).dtype),
                "max_batch_size": limits.max_batch_size,
                "max_num_tokens": options.max_num_tokens,
                "prefill_logits_chunk": self._budget.chunk,
                "threads": torch.get_num_threads(),
                **self._details(),
            },
        )

    # ---- the async interface (event loop side) ----

    async def generate(
        self, request_id: str, prompt_ids: list[int], sampling: SamplingOptions
    ) -> AsyncIterator[TokenDelta]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[TokenDelta | BaseException] = asyncio.Queue()
        self.submit(request_id, prompt_ids, sampling, loop, queue)
        finished = False
        try:
            async for delta in read_stream(queue, "PyTorch engine"):
                finished = delta.finish_reason is not None
                yield delta
        except EngineError:
            finished = True  # the engine already let go of it
            raise
        finally:
            if not finished:  # the consumer went away (client disconnect): free the slot
                self.abort(request_id)

    def submit(
        self,
        request_id: str,
        prompt_ids: list[int],
        sampling: SamplingOptions,
        loop: Loop,
        queue: Sink,
    ) -> None:
        """Check a request and queue it. Its deltas (or its error) go to `queue.put_nowait`
        through `loop.call_soon_threadsafe`, one call per step for all of a loop's requests
        (`base.deliver`). `generate` is this plus reading the queue; the engine process
        (`worker.py`) passes a loop and queues of its own that send each step to the server."""
        if self._fatal is not None or self._closing.is_set():
            raise EngineError("the PyTorch engine is not running")
        if self.guided is None:
            refuse_unsupported(sampling)
        max_new = self.limits.fit(len(prompt_ids), sampling.max_new_tokens)
        # An id outside the embedding table would fail the whole batch's forward pass.
        if min(prompt_ids) < 0 or max(prompt_ids) >= self._vocab:
            raise EngineRequestError(f"prompt token ids must be in 0..{self._vocab - 1}")
        gen = torch.Generator(device=self._device)
        gen.manual_seed(sampling.seed if sampling.seed is not None else random.getrandbits(63))
        seq = _Sequence(
            request_id,
            list(prompt_ids),
            sampling,
            max_new,
            gen,
            loop,
            queue,
            stop_ids=stop_ids_for(self.eos_token_id, sampling),
        )
        if sampling.guided is not None and self.guided is not None:
            # Compiled on the decoder's thread, then queued: neither the caller (the event
            # loop) nor the step waits for it. A bad schema ends the stream with its error.
            with self._lock:
                self._compiling[request_id] = False
            self.guided.matcher_later(sampling.guided, lambda m: self._guided_ready(seq, m))
            return
        with self._lock:
            self._waiting.append(seq)
        self._wake.set()

    def _guided_ready(self, seq: _Sequence, matcher: GuidedMatcher | BaseException) -> None:
        """On the grammar thread: queue `seq` with its matcher, or end it (its schema's
        error, an abort that came during the compile, or an engine that stopped)."""
        with self._lock:
            aborted = self._compiling.pop(seq.request_id, False)
            if isinstance(matcher, BaseException):
                outcome: TokenDelta | BaseException | None = matcher
            elif aborted:
                outcome = TokenDelta([], "abort")
            elif self._fatal is not None or self._closing.is_set():
                outcome = EngineError("the PyTorch engine is not running")
            else:
                seq.mask_fn, seq.accept_fn = matcher.mask, matcher.accept
                self._waiting.append(seq)
                outcome = None
        if outcome is not None:
            seq.emit(outcome)
        self._wake.set()

    def abort(self, request_id: str) -> None:
        with self._lock:
            self._aborted.add(request_id)
            if request_id in self._compiling:  # not queued yet: _guided_ready ends it
                self._compiling[request_id] = True
        self._wake.set()

    def is_healthy(self) -> bool:
        return self._fatal is None and self._thread.is_alive()

    @property
    def vocab_size(self) -> int:
        """Rows of the model's embedding (may exceed the tokenizer's vocabulary)."""
        return self._vocab

    def kv_cache_usage(self) -> float:
        return self._kv_usage

    def num_running(self) -> int:
        return self._n_running

    def stalled_for(self) -> float:
        busy = bool(self._waiting or self._running or self._admitting)
        return self._heartbeat.stalled_for(busy)

    def shutdown(self) -> None:
        """Stop the engine thread (pending streams end with EngineError), then drop the
        model and caches so their memory can go. Safe to call again."""
        self._closing.set()
        self._wake.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=_JOIN_TIMEOUT_S)
        if self._thread.is_alive():
            log.warning("the PyTorch engine thread did not stop; its model stays loaded")
            return
        self._free()

    def _free(self) -> None:
        """Drop device memory (engine thread stopped). Subclasses drop their buffers too."""
        if self._model is None:
            return
        device, self._model = self._device, None
        self._cache = self._head = None
        self._running, self._admitting = [], []
        self._kv_usage, self._n_running = 0.0, 0
        if device.type == "cuda":
            torch.cuda.empty_cache()

    # ---- the engine thread ----

    def _run(self) -> None:
        try:
            with torch.inference_mode():
                self._on_thread_start()
                while not self._closing.is_set():
                    self._heartbeat.beat()  # a pass began: the last step (if any) finished
                    self._drop_aborted()
                    if not self._pass():
                        self._update_gauges()
                        self._wake.wait(0.1)
                        self._wake.clear()
            self._fail_all(EngineError("the engine shut down"))
        except BaseException as exc:  # noqa: BLE001 - any failure here ends the engine
            log.exception("PyTorch engine loop died")
            self._fatal = exc
            self._fail_all(exc)
        self._update_gauges()

    def _pass(self) -> bool:
        """One pass of the engine thread: admit and prefill, then one decode step. False
        when there was nothing to do (the thread then waits for work)."""
        admitted = self._admitting = self._admit()
        if admitted:
            self._prefill(admitted)
        self._admitting = []
        if self._running:
            self._decode()
            return True
        return bool(admitted)

    def _on_thread_start(self) -> None:
        """Engine-thread set-up, inside inference mode (subclasses allocate here)."""

    def _update_gauges(self) -> None:
        capacity = self.limits.max_batch_size * self.limits.max_seq_len
        self._kv_usage = min(1.0, self._kv_tokens() / capacity) if self._running else 0.0
        self._n_running = len(self._running)

    def _kv_tokens(self) -> int:
        """Token positions the KV cache holds now: every row is as wide as the widest
        (left padding is memory in use too)."""
        return self._mask.numel()

    def _fail_all(self, exc: BaseException) -> None:
        with self._lock:
            waiting, self._waiting = list(self._waiting), collections.deque()
        # `_admitting`: taken from the queue but not yet in the batch when a step failed.
        pending = {id(s): s for s in [*self._running, *self._admitting, *waiting]}
        deliver((s.loop, s.queue, exc) for s in pending.values())
        self._running, self._admitting = [], []

    def _drop_aborted(self) -> None:
        with self._lock:
            if not self._aborted:
                return
            aborted, self._aborted = self._aborted, set()
            for seq in [s for s in self._waiting if s.request_id in aborted]:
                self._waiting.remove(seq)
                seq.emit(TokenDelta([], "abort"))
        keep = []
        for i, seq in enumerate(self._running):
            if seq.request_id in aborted:
                seq.emit(TokenDelta([], "abort"))
            else:
                keep.append(i)
        if len(keep) != len(self._running):
            self._select(keep)

    def _admit(self) -> list[_Sequence]:
        """The next prefill batch, by the rule in `engines/pytorch/prefill.py` (padded rows x
        width, and the logits they need)."""
        room = self.limits.max_batch_size - len(self._running)
        with self._lock:
            return take_admissible(self._waiting, room, self._budget)

    def _prefill(self, seqs: list[_Sequence]) -> None:
        """Prefill `seqs` and sample their first tokens. If an allocation fails, each
        request is tried alone, so the failure is that request's own: it ends with
        EngineError, the running batch and the engine go on (the batch's state is only
        changed once a prefill has succeeded). Any other failure is the engine's."""
        self._committed = False
        try:
            self._prefill_rows(seqs)
        except Exception as exc:
            if self._committed or not is_allocation_failure(exc):
                raise
            if len(seqs) > 1:
                log.warning("a prefill of %d requests failed (%r); one at a time", len(seqs), exc)
                for seq in seqs:
                    self._prefill([seq])
                return
            (seq,) = seqs
            log.error("request %s failed in prefill: %r", seq.request_id, exc)
            seq.emit(EngineError(f"prefill failed for this request: {exc!r}"[:300]))

    def _prompt_logprobs(
        self, seqs: list[_Sequence], own: Callable[[int, _Sequence], torch.Tensor]
    ) -> dict[int, Exception]:
        """Set `prompt_lps` of the rows that asked, from `own(row, seq)`: that prompt's
        final hidden states [len(prompt), H], projected in chunks (`engines/pytorch/prefill.py`).
        A failure (an allocation) is that request's alone: returned by row, for
        `_advance` to end it with."""
        failures: dict[int, Exception] = {}
        for row, seq in enumerate(seqs):
            k = seq.sampling.prompt_logprobs
            if k is None:
                continue
            try:
                seq.prompt_lps = chunked_prompt_logprobs(
                    own(row, seq), seq.prompt, k, self._head, self._budget.chunk
                )
            except Exception as exc:  # noqa: BLE001 - this request's failure is its own
                failures[row] = exc
        return failures

    def _prefill_rows(self, seqs: list[_Sequence]) -> None:
        width = max(len(s.prompt) for s in seqs)
        ids = torch.zeros((len(seqs), width), dtype=torch.long, device=self._device)
        mask = torch.zeros_like(ids)
        for row, seq in enumerate(seqs):
            ids[row, width - len(seq.prompt) :] = torch.tensor(seq.prompt, device=self._device)
            mask[row, width - len(seq.prompt) :] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        # The model's own forward keeps the logits of the last column only; the decoder's
        # final hidden states [rows, width, H] (which the forward computes anyway) are
        # caught on the way for the rows that asked for prompt logprobs.
        hidden: list[torch.Tensor] = []
        echo = any(s.sampling.prompt_logprobs is not None for s in seqs)
        hook = (
            self._model.get_decoder().register_forward_hook(
                lambda _m, _a, out: hidden.append(out.last_hidden_state)
            )
            if echo
            else None
        )
        try:
            out = self._model(
                input_ids=ids,
                attention_mask=mask,
                position_ids=positions,
                use_cache=True,
                logits_to_keep=1,
                **{self._cache_arg: _new_cache([])},
            )
        finally:
            if hook is not None:
                hook.remove()
        # Left-padded: a prompt's positions are the last len(prompt) columns of its row.
        failures = self._prompt_logprobs(
            seqs, lambda row, seq: hidden[-1][row, width - len(seq.prompt) :]
        )
        hidden.clear()
        kv = _cache_tensors(out[self._cache_arg])
        lengths = torch.tensor([len(s.prompt) for s in seqs], device=self._device)
        self._join(seqs, kv, mask, lengths)
        first_row = len(self._running) - len(seqs)
        self._advance(seqs, out.logits[:, -1, :], first_row=first_row, failures=failures)

    def _decode(self) -> None:
        ones = torch.ones((len(self._running), 1), dtype=torch.long, device=self._device)
        self._mask = torch.cat([self._mask, ones], dim=1)
        # The cache grows in place.
        out = self._model(
            input_ids=self._last[:, None],
            attention_mask=self._mask,
            position_ids=self._pos[:, None],
            use_cache=True,
            **{self._cache_arg: self._cache},
        )
        self._pos = self._pos + 1
        self._advance(list(self._running), out.logits[:, -1, :], first_row=0)

    def _advance(
        self,
        seqs: list[_Sequence],
        logits: torch.Tensor,
        first_row: int,
        failures: dict[int, Exception] | None = None,
    ) -> None:
        """Sample the next token of `seqs` (rows first_row.. of the batch) and deliver it.
        A row that fails (sampling, bookkeeping, or its prefill's prompt logprobs: the
        `failures` by offset in `seqs`) gets its error and leaves the batch."""
        picks = sample_next_tokens(logits.float(), seqs)
        for offset, exc in (failures or {}).items():
            picks[offset] = exc
        self._store_tokens(first_row, [p.token if isinstance(p, Sampled) else 0 for p in picks])
        self._take_picks(seqs, picks, range(first_row, first_row + len(seqs)))

    def _take_picks(
        self, seqs: list[_Sequence], picks: list[Sampled | Exception], rows: Iterable[int]
    ) -> None:
        """Record each sequence's pick and deliver it (one call per event loop); those that
        finished or failed leave the batch (`rows`: each one's row in it now)."""
        leaving = []
        deliveries = []
        for row, seq, pick in zip(rows, seqs, picks):
            try:
                if isinstance(pick, Exception):
                    raise pick
                item: TokenDelta | EngineError = self._record(seq, pick)
            except Exception as exc:  # noqa: BLE001 - this sequence's failure is its own
                log.error("request %s failed in the engine: %r", seq.request_id, exc)
                item = (
                    exc
                    if isinstance(exc, EngineError)
                    else EngineError(f"generation failed for this request: {exc!r}")
                )
            deliveries.append((seq.loop, seq.queue, item))
            if not isinstance(item, TokenDelta) or item.finish_reason is not None:
                leaving.append(row)
        deliver(deliveries)
        if leaving:
            gone = set(leaving)
            self._select([i for i in range(len(self._running)) if i not in gone])
        self._update_gauges()

    @staticmethod
    def _record(seq: _Sequence, pick: Sampled) -> TokenDelta:
        """Add the sampled token to `seq`; the delta to send (with a finish reason if it
        ended: a stop token is not emitted)."""
        prompt, seq.prompt_lps = seq.prompt_lps, None  # on the first delta only
        if seq.max_new_tokens <= 0:  # a prefill only (echo with max_tokens 0)
            return TokenDelta([], "length", prompt_logprobs=prompt)
        token = pick.token
        if seq.accept_fn is not None:
            seq.accept_fn(token)
        lps = None if pick.logprob is None else [pick.logprob]
        if token in seq.stop_ids and len(seq.generated) >= seq.sampling.min_tokens:
            # With prompt logprobs (echo), the stop token's logprob still counts (see above).
            echo = seq.sampling.prompt_logprobs is not None
            return TokenDelta([], "stop", lps if echo else None, prompt)
        seq.generated.append(token)
        reason: FinishReason | None = "length" if len(seq.generated) >= seq.max_new_tokens else None
        return TokenDelta([token], reason, lps, prompt)

    def _store_tokens(self, first_row: int, tokens: list[int]) -> None:
        """Keep the step's tokens as the next step's input (one host-to-device copy for the
        step, not one tiny write per row)."""
        self._last[first_row : first_row + len(tokens)] = torch.tensor(tokens).to(self._device)

    # ---- the shared, left-padded batch ----

    def _join(
        self,
        seqs: list[_Sequence],
        kv: list[tuple[torch.Tensor, torch.Tensor]],
        mask: torch.Tensor,
        lengths: torch.Tensor,
    ) -> None:
        """Add prefilled rows to the batch: everything is built first, then assigned, so
        a failure (an allocation) leaves the batch as it was."""
        if not self._running:
            cache, last = (
                _new_cache(kv),
                torch.zeros(len(seqs), dtype=torch.long, device=self._device),
            )
            self._committed = True
            self._running, self._cache, self._mask = list(seqs), cache, mask
            self._pos, self._last = lengths, last
            return
        old_width, new_width = self._mask.shape[1], mask.shape[1]
        width = max(old_width, new_width)

        def left_pad(t: torch.Tensor, n: int, dim_from_end: int) -> torch.Tensor:
            return F.pad(t, (0, 0) * dim_from_end + (n, 0)) if n else t

        cache = _new_cache(
            [
                (
                    torch.cat(
                        [left_pad(ok, width - old_width, 1), left_pad(nk, width - new_width, 1)]
                    ),
                    torch.cat(
                        [left_pad(ov, width - old_width, 1), left_pad(nv, width - new_width, 1)]
                    ),
                )
                for (ok, ov), (nk, nv) in zip(_cache_tensors(self._cache), kv)
            ]
        )
        joined_mask = torch.cat(
            [left_pad(self._mask, width - old_width, 0), left_pad(mask, width - new_width, 0)]
        )
        pos = torch.cat([self._pos, lengths])
        last = torch.cat(
            [self._last, torch.zeros(len(seqs), dtype=torch.long, device=self._device)]
        )
        self._committed = True
        self._cache, self._mask, self._pos, self._last = cache, joined_mask, pos, last
        self._running.extend(seqs)

    def _select(self, rows: list[int]) -> None:
        """Keep only these rows of the batch, then drop columns no row needs."""
        self._running = [self._running[i] for i in rows]
        if not rows:
            self._cache, self._last, self._pos = None, self._last[:0], self._pos[:0]
            self._mask = self._mask[:0, :0]
            return
        index = torch.tensor(rows, device=self._device)
        mask = self._mask.index_select(0, index)
        used = mask.any(dim=0).nonzero()
        start = int(used[0]) if len(used) else 0
        self._mask = mask[:, start:]
        self._cache = _new_cache(
            [
                (k.index_select(0, index)[:, :, start:], v.index_select(0, index)[:, :, start:])
                for k, v in _cache_tensors(self._cache)
            ]
        )
        self._last = self._last.index_select(0, index)
        self._pos = self._pos.index_select(0, index)


def _new_cache(kv: list[tuple[torch.Tensor, torch.Tensor]]) -> DynamicCache:
    from transformers import DynamicCache

    cache = DynamicCache()
    for layer, (k, v) in enumerate(kv):
        cache.update(k, v, layer)
    return cache


def _cache_tensors(cache: DynamicCache | None) -> list[tuple[torch.Tensor, torch.Tensor]]:
    assert cache is not None  # only asked of a running batch
    # Our caches hold full-attention layers only (`_new_cache`): each has keys and values.
    layers: list[Any] = cache.layers
    return [(layer.keys, layer.values) for layer in layers]
