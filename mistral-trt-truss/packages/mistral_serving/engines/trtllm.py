"""The TensorRT-LLM engine: our `Engine` protocol over TensorRT-LLM's LLM API (1.2.x).

What is called, and the source file (NVIDIA/TensorRT-LLM) each fact was read from:

- `tensorrt_llm._tensorrt_engine.LLM` is `llmapi/llm.py::_TrtLLM`, the TensorRT-engine
  backend (`_tensorrt_engine/__init__.py`); the plain `tensorrt_llm.LLM` is the PyTorch
  backend and cannot load an engine directory.
- `LLM(model=engine_dir, tokenizer=None, skip_tokenizer_init=True, kv_cache_config=...)`:
  with `skip_tokenizer_init` the LLM API keeps no tokenizer (`llmapi/llm_args.py`,
  `validate_and_init_tokenizer`), so it takes token ids and never detokenizes; it then
  requires `SamplingParams.end_id` (`llmapi/llm.py`, `_prepare_sampling_params`).
- `llm.generate_async(token_ids, sampling_params=..., streaming=True)` returns at once a
  `RequestOutput` (`llmapi/llm.py`) that is an async iterator of itself
  (`executor/result.py`, `GenerationResult.__anext__`); `outputs[0].token_ids_diff` are the
  ids new since the last step; `finish_reason` is 'stop' | 'length' | 'timeout' |
  'cancelled'; `.finished`; `.abort()` cancels the request in the executor.
- `generate_async` raises ValueError for a request it refuses (`_check_arguments`: prompt +
  max_tokens > the engine's max_seq_len; `SamplingParams._validate`) and RuntimeError("LLM
  is shutting down") once the executor is gone. While iterating, a per-request failure
  raises `RequestError` (`executor/utils.py`); any other error is a background (fatal)
  error: the executor shuts itself down and re-raises it
  (`executor/executor.py`, `_handle_background_error`).
- `llm.shutdown()` stops the executor and its MPI workers and sets `llm._executor = None`.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from mistral_serving.engine_checks import (
    EngineCheckError,
    GpuInfo,
    check_engine_dir,
    detect_gpu,
    read_engine_config,
    world_size,
)
from mistral_serving.engines.base import (
    EngineError,
    EngineInfo,
    EngineLimits,
    EngineRequestError,
    FinishReason,
    SamplingOptions,
    TokenDelta,
)
from mistral_serving.settings import Settings

log = logging.getLogger(__name__)

# TensorRT-LLM's `CompletionOutput.finish_reason` (executor/result.py) -> ours. A request
# that ran past its time limit ('timeout') was cut short by the server, like an abort.
FINISH_REASONS: dict[str, FinishReason] = {
    "stop": "stop",
    "length": "length",
    "cancelled": "abort",
    "timeout": "abort",
}


def to_sampling_params(options: SamplingOptions, eos_token_id: int, pad_token_id: int | None):
    """Our `SamplingOptions` as a `tensorrt_llm.sampling_params.SamplingParams`.

    Field names and defaults are from `tensorrt_llm/sampling_params.py` (1.2.x). Every value
    that has a surprising default is set explicitly: `max_tokens` (default 32), `end_id` /
    `pad_id` (None, which needs a tokenizer we do not load), `detokenize` (True).
    """
    from tensorrt_llm.sampling_params import SamplingParams

    if options.max_new_tokens < 1:
        raise EngineRequestError(f"max_new_tokens must be at least 1, got {options.max_new_tokens}")
    if options.repetition_penalty <= 0:
        raise EngineRequestError(
            f"repetition_penalty must be above 0, got {options.repetition_penalty}"
        )
    kwargs: dict[str, Any] = {
        "max_tokens": options.max_new_tokens,
        "end_id": eos_token_id,
        "pad_id": eos_token_id if pad_token_id is None else pad_token_id,
        "detokenize": False,  # we stream ids; text is built above the engine
        "n": 1,
    }
    if options.greedy:
        # top_k=1 is greedy in every 1.x release (`_greedy_decoding`); temperature and top_p
        # stay unset: temperature=0 is only accepted by recent releases.
        kwargs["top_k"] = 1
        kwargs["seed"] = options.seed
    else:
        kwargs["temperature"] = options.temperature
        # Set explicitly: top_k=0 means all logits; an unset top_p means the C++ default
        # (0.0 in older releases, which with top_k=0 silently turns sampling greedy).
        kwargs["top_k"] = max(options.top_k, 0)
        # top_p=0 would mean greedy, which the backend refuses; our HTTP contract uses 0
        # for "off". Out-of-range values go through for SamplingParams to reject.
        kwargs["top_p"] = 1.0 if options.top_p == 0.0 else options.top_p
        # seed=None means the C++ default seed 0 for every request: identical prompts would
        # sample identical text. Draw one per request unless the client fixed it.
        kwargs["seed"] = options.seed if options.seed is not None else random.getrandbits(31)
    # Neutral penalties stay unset so the runtime skips the penalty kernels.
    if options.repetition_penalty != 1.0:
        kwargs["repetition_penalty"] = options.repetition_penalty
    if options.presence_penalty != 0.0:
        kwargs["presence_penalty"] = options.presence_penalty
    if options.frequency_penalty != 0.0:
        kwargs["frequency_penalty"] = options.frequency_penalty
    stop_ids = [t for t in dict.fromkeys(options.stop_token_ids) if t != eos_token_id]
    if stop_ids:
        kwargs["stop_token_ids"] = stop_ids
    try:
        return SamplingParams(**kwargs)
    except ValueError as exc:  # SamplingParams._validate: top_p / top_k / temperature range
        raise EngineRequestError(f"invalid sampling options: {exc}") from None


class TrtLlmEngine:
    """One TensorRT-LLM engine; concurrent `generate` calls are batched in flight by the
    C++ executor. Must be used from one asyncio event loop: `generate_async` binds each
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
    ) -> None:
        self.llm = llm
        self.limits = limits
        self.eos_token_id = eos_token_id
        self.pad_token_id = pad_token_id
        self.info = info or EngineInfo(name="tensorrt_llm")
        # tensorrt_llm's RequestError: a per-request failure that leaves the engine healthy.
        self._request_error: tuple[type[BaseException], ...] = (
            (request_error,) if request_error else ()
        )
        self._results: dict[str, Any] = {}  # our request id -> RequestOutput
        self._fatal: BaseException | None = None
        self._shut_down = False

    @classmethod
    def load(
        cls,
        engine_dir: Path,
        settings: Settings,
        *,
        eos_token_id: int,
        pad_token_id: int | None = None,
        gpu: GpuInfo | None = None,
        tokenizer_vocab_size: int | None = None,
    ) -> TrtLlmEngine:
        """Check the engine directory against this machine, then start the engine.
        `gpu` None means detect it (torch.cuda)."""
        # Imported here so the package imports (and its tests run) without tensorrt_llm.
        try:
            import tensorrt_llm
            from tensorrt_llm._tensorrt_engine import LLM
            from tensorrt_llm.llmapi import KvCacheConfig, RequestError
        except ImportError as exc:
            raise EngineCheckError(
                f"{engine_dir} is a TensorRT-LLM engine but tensorrt_llm cannot be imported "
                f"({exc}); serve it from the TensorRT-LLM 1.2.x release image"
            ) from exc

        engine_dir = Path(engine_dir)
        built = check_engine_dir(
            engine_dir,
            installed_version=tensorrt_llm.__version__,
            gpu=gpu or detect_gpu(),
            max_input_len=settings.max_input_len,
            max_seq_len=settings.max_seq_len,
            tokenizer_vocab_size=tokenizer_vocab_size,
        )
        config = read_engine_config(engine_dir)
        # Prompts longer than the engine's max_num_tokens need chunked prefill
        # (llmapi/llm_args.py: enable_chunked_prefill, default False), which needs an
        # engine built with paged context FMHA, as `build.py engine` builds them.
        plugins = config.get("build_config", {}).get("plugin_config", {})
        chunked = bool(plugins.get("use_paged_context_fmha"))
        try:
            llm = LLM(
                model=str(engine_dir),
                tokenizer=None,
                skip_tokenizer_init=True,
                kv_cache_config=KvCacheConfig(
                    free_gpu_memory_fraction=settings.kv_cache_free_gpu_memory_fraction
                ),
                enable_chunked_prefill=chunked,
            )
        except Exception as exc:
            raise EngineError(f"TensorRT-LLM could not start {engine_dir}: {exc}") from exc
        limits = effective_limits(built, settings)
        pretrained = config["pretrained_config"]
        info = EngineInfo(
            name="tensorrt_llm",
            details={
                "engine_dir": str(engine_dir),
                "tensorrt_llm_version": tensorrt_llm.__version__,
                "built_with": config.get("version"),
                "architecture": pretrained.get("architecture"),
                "dtype": pretrained.get("dtype"),
                "world_size": world_size(config),
                "built_limits": vars(built),
                "kv_cache_free_gpu_memory_fraction": settings.kv_cache_free_gpu_memory_fraction,
                "chunked_prefill": chunked,
            },
        )
        return cls(
            llm,
            limits=limits,
            eos_token_id=eos_token_id,
            pad_token_id=pad_token_id,
            info=info,
            request_error=RequestError,
        )

    async def generate(
        self, request_id: str, prompt_ids: list[int], sampling: SamplingOptions
    ) -> AsyncIterator[TokenDelta]:
        if request_id in self._results:
            raise EngineRequestError(f"request id {request_id!r} is already generating")
        max_new = self._room_for(prompt_ids, sampling.max_new_tokens)
        params = to_sampling_params(
            replace(sampling, max_new_tokens=max_new), self.eos_token_id, self.pad_token_id
        )
        stop_ids = {self.eos_token_id, *sampling.stop_token_ids}
        try:
            result = self.llm.generate_async(
                list(prompt_ids), sampling_params=params, streaming=True
            )
        except ValueError as exc:  # refused for its inputs (_check_arguments, SamplingParams)
            raise EngineRequestError(str(exc)) from None
        except Exception as exc:
            raise self._failed(request_id, exc) from exc
        self._results[request_id] = result
        count = 0
        finished = False
        try:
            async for output in result:
                completion = output.outputs[0]
                tokens = list(completion.token_ids_diff)
                count += len(tokens)
                reason = None
                if output.finished:
                    reason = FINISH_REASONS.get(completion.finish_reason or "")
                    if reason is None:  # not reported: infer it from the count
                        reason = "length" if count >= max_new else "stop"
                    # Whether the runtime returns the end token is not pinned down; we never do.
                    if reason == "stop" and tokens and tokens[-1] in stop_ids:
                        tokens.pop()
                if tokens or reason:
                    finished = reason is not None
                    yield TokenDelta(token_ids=tokens, finish_reason=reason)
                if finished:
                    return
            finished = True
            yield TokenDelta(token_ids=[], finish_reason="stop")  # ended without a reason
        except Exception as exc:
            raise self._failed(request_id, exc) from exc
        finally:
            # Client gone (aclose -> GeneratorExit, task cancelled -> CancelledError) or an
            # error: free the sequence's batch slot and KV cache now, not at max_tokens.
            self._results.pop(request_id, None)
            if not finished:
                self._abort_result(request_id, result)

    def abort(self, request_id: str) -> None:
        result = self._results.get(request_id)
        if result is not None:
            self._abort_result(request_id, result)

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
        if self._shut_down:
            return
        self._shut_down = True
        self.llm.shutdown()

    def _room_for(self, prompt_ids: list[int], max_new_tokens: int) -> int:
        """Output tokens this prompt may have: what was asked, within max_seq_len."""
        n = len(prompt_ids)
        if n == 0:
            raise EngineRequestError("the prompt is empty")
        if n > self.limits.max_input_len:
            raise EngineRequestError(
                f"the prompt has {n} tokens; this engine accepts at most "
                f"{self.limits.max_input_len}"
            )
        room = self.limits.max_seq_len - n
        if room < 1:
            raise EngineRequestError(
                f"the prompt has {n} tokens, leaving no room for output within "
                f"max_seq_len {self.limits.max_seq_len}"
            )
        if max_new_tokens < 1:
            raise EngineRequestError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
        return min(max_new_tokens, room)

    def _abort_result(self, request_id: str, result: Any) -> None:
        if getattr(result, "finished", False):
            return
        try:
            result.abort()
        except Exception:  # the executor may already be gone; nothing left to free
            log.warning("abort of request %s failed", request_id, exc_info=True)

    def _failed(self, request_id: str, exc: BaseException) -> EngineError:
        """An EngineError for `exc`; marks the engine unhealthy unless it is per-request."""
        if isinstance(exc, EngineError):
            return exc
        if self._request_error and isinstance(exc, self._request_error):
            return EngineError(f"request {request_id} failed in TensorRT-LLM: {exc}")
        if not isinstance(exc, asyncio.CancelledError):
            self._fatal = exc
            log.error("TensorRT-LLM executor failed; engine is now unhealthy: %r", exc)
        return EngineError(f"TensorRT-LLM engine failed: {exc}")


def effective_limits(built: EngineLimits, settings: Settings) -> EngineLimits:
    """The engine's built limits, lowered by the max_input_len / max_seq_len settings."""
    max_seq_len = min(built.max_seq_len, settings.max_seq_len or built.max_seq_len)
    max_input_len = min(built.max_input_len, settings.max_input_len or built.max_input_len)
    return EngineLimits(
        max_input_len=min(max_input_len, max_seq_len - 1),
        max_seq_len=max_seq_len,
        max_batch_size=built.max_batch_size,
    )
