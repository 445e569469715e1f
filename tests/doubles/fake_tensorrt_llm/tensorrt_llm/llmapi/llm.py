"""Mirrors tensorrt_llm/llmapi/llm.py: `BaseLLM` (constructor kwargs check, `generate_async`
with `_prepare_sampling_params` and `_check_arguments`, `get_stats_async`, `shutdown()`, the
private `_executor` with `is_shutdown()` that health checks read), `_TrtLLM` (the TensorRT
engine backend, `tensorrt_llm._tensorrt_engine.LLM`) and `_TorchLLM` / `LLM` (the PyTorch
backend, `tensorrt_llm.LLM`, which loads a Hugging Face checkpoint).

What each piece mirrors (function in the real llm.py unless said otherwise):
- `__init__` of both: unknown keyword -> ValueError (`BaseLlmArgs` forbids extra fields);
  `_TorchLLM._validate_args_for_torch_backend`: a TensorRT-only argument -> ValueError.
- `_TrtLLM._build_model`: `guided_decoding_backend="xgrammar"` builds the grammar from the
  LLM's tokenizer (`_xgrammar_tokenizer_info(self.tokenizer)`), so it needs one: with
  `skip_tokenizer_init=True` the double refuses at construction (the real one fails there
  too, on the None tokenizer; its exact error was not read).
- `generate_async`: RuntimeError("LLM is shutting down") once shut down.
- `_prepare_sampling_params`: ValueError when `end_id` is None and there is no tokenizer; on
  the TensorRT backend, `logprobs` turns on `return_generation_logits` and marks it
  `_generation_logits_auto_enabled` (logprobs are computed from the generation logits).
- `_check_arguments`, TensorRT backend: prompt + max_tokens > the engine's max_seq_len ->
  ValueError, but ONLY without chunked prefill (`not self.args.enable_chunked_prefill`); with
  it the check is skipped and the adapter's own limit is the only guard. `logprobs` without
  `gather_generation_logits=True` given to the constructor -> ValueError. Context logits
  (`return_context_logits`) from an engine built without `gather_context_logits` ->
  ValueError (upstream checks this for `prompt_logprobs`, which auto-enables
  `return_context_logits`; for the flag alone its error was not read: a stand-in).
  PyTorch backend: the max_num_tokens check only without chunked prefill.
- `get_stats_async(timeout)`: `self._executor.aget_stats(timeout=...)`, an `IterationResult`
  of per-iteration stats (`kvCacheStats`: usedNumBlocks, maxNumBlocks, freeNumBlocks,
  tokensPerBlock, and the block-reuse totals since the start allocTotalBlocks,
  allocNewBlocks, reusedBlocks, missedBlocks, cacheHitRate, as
  `_torch/pyexecutor/py_executor.py::_update_iter_stats` copies them from the KV-cache
  manager; `inflightBatchingStats`: numScheduledRequests, numContextRequests,
  numGenRequests, numPausedRequests; numActiveRequests, numQueuedRequests). Reuse is
  counted in whole prompt blocks matching an earlier prompt's block for block, only with
  `KvCacheConfig.enable_block_reuse` (upstream's default: on); partial reuse is not
  modelled. Knob `stats_missed_blocks=False` drops missedBlocks and cacheHitRate (some
  releases' PyTorch backend copies only reusedBlocks). The PyTorch backend reports them
  only with `enable_iter_perf_stats=True` (`TorchLlmArgs`, default False); the TensorRT
  backend's C++ executor always does.
- `shutdown()`: `self._executor.shutdown(); self._executor = None`.

Not read upstream, and so only a conservative stand-in (the adapters never rely on them):
what the runtime does with a request longer than max_seq_len that chunked prefill let
through, and with guided decoding requested when no backend was configured; the double
fails such a request with RequestError at its first step.

Test knobs (not in the real API) are marked "knob"."""

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

from tensorrt_llm.executor.result import GenerationResult, IterationResult
from tensorrt_llm.llmapi.llm_args import CudaGraphConfig, KvCacheConfig, SchedulerConfig
from tensorrt_llm.sampling_params import SamplingParams

RequestOutput = GenerationResult  # the real one subclasses GenerationResult


class _empty_async_iterable:  # noqa: N801 - upstream's `empty_async_iterable` (llmapi/utils.py)
    def __aiter__(self):
        return self

    async def __anext__(self):
        raise StopAsyncIteration


# Subsets of the pydantic args' fields; the real constructors raise on any other keyword.
_COMMON_KWARGS = {
    "backend",
    "enable_chunked_prefill",
    "gather_generation_logits",
    "guided_decoding_backend",
    "kv_cache_config",
    "max_batch_size",
    "max_beam_width",
    "max_num_tokens",
    "max_seq_len",
    "scheduler_config",
}
_TRT_ONLY_KWARGS = {"build_config", "workspace", "batching_type"}
_TORCH_ONLY_KWARGS = {"enable_iter_perf_stats", "sampler_type", "attn_backend", "cuda_graph_config"}
# TorchLlmArgs.sampler_type (`SamplerType`): "auto" picks TorchSampler for these models.
_SAMPLER_TYPES = {"auto", "TorchSampler", "TRTLLMSampler"}


def _sampler_types(version: str) -> set[str]:
    """TRTLLMSampler is gone from 1.3.0rc26 on (`_torch/pyexecutor/sampler.py`)."""
    from tensorrt_llm._lines import at_least

    return (
        _SAMPLER_TYPES - {"TRTLLMSampler"} if at_least(version, (1, 3, 0), 26) else _SAMPLER_TYPES
    )


class _FakeExecutor:
    """The GenerationExecutor surface the LLM API and the adapter touch."""

    def __init__(self) -> None:
        self.doing_shutdown = False
        self._error_queue: list[BaseException] = []  # background errors, oldest first
        self.dead = False  # a background error was raised: no response comes any more
        self.aborted_ids: list[int] = []
        self.shutdown_calls = 0

    def is_shutdown(self) -> bool:
        return self.doing_shutdown

    def shutdown(self) -> None:
        self.shutdown_calls += 1
        self.doing_shutdown = True

    def abort_request(self, request_id: int) -> None:
        self.aborted_ids.append(request_id)


class BaseLLM:
    instances: ClassVar[list["BaseLLM"]] = []  # knob: every LLM built in this import
    _valid_kwargs: ClassVar[set[str]] = _COMMON_KWARGS

    def __init__(
        self,
        model,
        tokenizer=None,
        tokenizer_mode="auto",
        skip_tokenizer_init=False,
        trust_remote_code=False,
        tensor_parallel_size=1,
        dtype="auto",
        revision=None,
        tokenizer_revision=None,
        **kwargs: Any,
    ) -> None:
        self._check_kwargs(kwargs)
        kv = kwargs.get("kv_cache_config")
        if kv is not None and not isinstance(kv, KvCacheConfig):
            raise TypeError(f"kv_cache_config must be KvCacheConfig, got {type(kv)}")
        scheduler = kwargs.get("scheduler_config")
        if scheduler is not None and not isinstance(scheduler, SchedulerConfig):
            raise TypeError(f"scheduler_config must be SchedulerConfig, got {type(scheduler)}")
        backend = kwargs.get("guided_decoding_backend")
        if backend not in (None, "xgrammar", "llguidance"):
            raise ValueError(f"Unsupported guided decoding backend {backend}")
        config = json.loads((Path(model) / "config.json").read_text())  # FileNotFoundError
        self._read_model(model, config, kwargs)
        self.args = SimpleNamespace(
            model=str(model),
            tokenizer=None if skip_tokenizer_init else (tokenizer or str(model)),
            skip_tokenizer_init=skip_tokenizer_init,
            tensor_parallel_size=tensor_parallel_size,
            dtype=dtype,
            **kwargs,
        )
        # Without skip_tokenizer_init the real LLM loads a tokenizer (from `tokenizer`, else
        # the model dir).
        self.tokenizer = None if skip_tokenizer_init else object()
        if backend == "xgrammar" and self.tokenizer is None:
            raise ValueError("guided decoding with xgrammar needs the LLM's tokenizer")
        self._executor: _FakeExecutor | None = _FakeExecutor()
        self._next_id = 0

        # knobs
        self.script: list[int] = list(range(1000, 1100))  # token ids "decoded", in order
        self.tokens_per_step = 1  # tokens per streamed response
        self.include_end_id_in_output = False  # whether end_id shows up in token_ids
        self.steps_after_abort = 1  # steps of tokens still produced after abort()
        self.step_delay = 0.0
        self.requests: list[GenerationResult] = []  # every request, in order
        self.next_request_error: str | None = None  # the next request fails with this
        self.tokens_per_block = 32
        self.max_num_blocks = 64
        self.stats_as_json = False  # items of get_stats_async as JSON strings (older releases)
        self.stats_calls = 0
        self.vocab_size = 64  # knob: the width of `context_logits_for`'s logits
        self.hang = False  # knob: the executor stops answering (every step blocks)
        self.abort_with_logprobs_crashes = True  # knob: upstream issue 10810 (see result.py)
        self.stats_missed_blocks = True  # knob: False as the releases that omit missedBlocks
        self.paused_requests = 0  # knob: numPausedRequests of the next iterations' stats
        self._seen_blocks: set[tuple[int, ...]] = set()  # prompt-block prefixes cached
        self._reused_blocks = 0
        self._missed_blocks = 0
        self._iter_stats_result: IterationResult | None = None
        self._iteration = 0
        self.shutdown_calls = 0
        BaseLLM.instances.append(self)

    # -- overridden per backend --------------------------------------------------------
    def _check_kwargs(self, kwargs: dict) -> None:
        for key in kwargs:
            if key not in self._valid_kwargs:
                raise ValueError(f"{self.__class__.__name__} got invalid argument: {key}")

    def _read_model(self, model, config: dict, kwargs: dict) -> None:
        raise NotImplementedError

    @property
    def _on_trt_backend(self) -> bool:
        return False

    @property
    def _reports_stats(self) -> bool:
        return True

    # -- the real public surface -------------------------------------------------------
    def generate_async(
        self,
        inputs,
        sampling_params: SamplingParams | None = None,
        lora_request=None,
        prompt_adapter_request=None,
        streaming: bool = False,
        kv_cache_retention_config=None,
        disaggregated_params=None,
        _postproc_params=None,
        scheduling_params=None,
        cache_salt=None,
    ) -> GenerationResult:
        if self._executor is None or self._executor.is_shutdown():
            raise RuntimeError("LLM is shutting down")
        sampling_params = self._prepare_sampling_params(sampling_params)
        if not (isinstance(inputs, list) and all(isinstance(t, int) for t in inputs)):
            raise TypeError(f"The inputs must be type str or list of int, but got {type(inputs)}")
        self._check_arguments(len(inputs), 0, sampling_params)
        self._maybe_initialize_iteration_results()
        result = GenerationResult(self._next_id, inputs, sampling_params, streaming, self)
        result._request_error, self.next_request_error = self.next_request_error, None
        if result._request_error is None:
            result._request_error = self._unsupported(len(inputs), sampling_params)
        self._next_id += 1
        self.requests.append(result)
        return result

    def get_stats_async(self, timeout: float | None = 2):
        """`llm.py::get_stats_async` -> `executor.py::GenerationExecutor.aget_stats`: the ONE
        IterationResult with its timeout set (its sticky `_done` is not reset here), or an
        empty iterable before the first request."""
        self.stats_calls += 1
        if self._iter_stats_result is None:
            return _empty_async_iterable()
        self._iter_stats_result.set_timeout(timeout)
        return self._iter_stats_result

    def shutdown(self) -> None:
        self.shutdown_calls += 1
        if self._executor is not None:
            self._executor.shutdown()
            self._executor = None

    # -- the real private helpers ------------------------------------------------------
    def _prepare_sampling_params(self, sampling_params: SamplingParams | None) -> SamplingParams:
        if sampling_params is None:
            sampling_params = SamplingParams()
        if not isinstance(sampling_params, SamplingParams):
            raise TypeError(
                "The sampling_params must be type SamplingParams or None, but got "
                f"{type(sampling_params)}"
            )
        if sampling_params.end_id is None and self.tokenizer is None:
            raise ValueError(
                "tokenizer is required to reset end_id if it is None, or you can explicitly "
                "specify the end_id for sampling_params"
            )
        sp = sampling_params
        if self._on_trt_backend and sp.logprobs and not sp.return_generation_logits:
            sampling_params.return_generation_logits = True
            sampling_params._generation_logits_auto_enabled = True
        return sampling_params

    def _check_arguments(self, prompt_len: int, query_len: int, sp: SamplingParams) -> None:
        raise NotImplementedError

    def _maybe_initialize_iteration_results(self) -> None:
        """`executor.py::GenerationExecutor._maybe_initialize_iteration_results`: the only
        place the stats iterable is made undone again."""
        if self._iter_stats_result is None:
            self._iter_stats_result = IterationResult(self.stats_as_json)
        else:
            self._iter_stats_result.mark_undone()

    # -- the double's engine -----------------------------------------------------------
    @property
    def _top_k_logprobs(self) -> bool:
        """Whether logprobs hold the top k (see result.py::fake_logprobs)."""
        return True

    def _abort_crashes(self, result: GenerationResult) -> bool:
        """Upstream issue 10810: the cancel of a streaming request with logprobs kills the
        executor when generation logits are gathered."""
        return bool(
            self.abort_with_logprobs_crashes
            and self.args.__dict__.get("gather_generation_logits")
            and result._streaming
            and result.sampling_params.logprobs
        )

    def _grammar_error(self, guided) -> str | None:
        """A stand-in for xgrammar refusing a JSON schema (its exact messages were not
        read): not JSON, not an object or boolean, or an unknown "type"."""
        if guided is None or guided.json is None:
            return None
        schema = guided.json
        try:
            if isinstance(schema, str):
                schema = json.loads(schema)
        except ValueError as exc:
            return f"Failed to compile the JSON schema grammar: {exc}"
        if not isinstance(schema, dict | bool):
            return "Failed to compile the JSON schema grammar: the schema is not an object"
        known = {"object", "array", "string", "number", "integer", "boolean", "null"}
        kind = schema.get("type") if isinstance(schema, dict) else None
        if isinstance(kind, str) and kind not in known:
            return f"Failed to compile the JSON schema grammar: unsupported type {kind!r}"
        return None

    def _unsupported(self, prompt_len: int, sp: SamplingParams) -> str | None:
        if prompt_len + sp.max_tokens > self._max_seq_len:
            return f"prompt ({prompt_len}) + max_tokens ({sp.max_tokens}) > max_seq_len"
        if (
            sp.guided_decoding is not None
            and self.args.__dict__.get("guided_decoding_backend") is None
        ):
            return "guided decoding is not enabled"
        return None

    def _look_up_prompt_blocks(self, prompt: list[int]) -> None:
        """A request's context phase: its whole prompt blocks are reused while they match a
        cached prefix, the rest are missed (and cached for later requests)."""
        kv = self.args.__dict__.get("kv_cache_config")
        reuse = kv is None or kv.enable_block_reuse
        size = self.tokens_per_block
        blocks = -(-len(prompt) // size)
        matching = True
        for i in range(blocks):
            prefix = tuple(prompt[: (i + 1) * size])
            full = len(prefix) == (i + 1) * size
            if reuse and matching and full and prefix in self._seen_blocks:
                self._reused_blocks += 1
                continue
            matching = False
            self._missed_blocks += 1
            if reuse and full:
                self._seen_blocks.add(prefix)

    def _record_iteration(self) -> None:
        """One executor iteration: queue its stats, as the runtime does each step."""
        if not self._reports_stats:
            return
        live = [r for r in self.requests if r._holds_kv]
        used = sum(-(-r._kv_tokens() // self.tokens_per_block) for r in live)
        used = min(used, self.max_num_blocks)
        kv = {
            "maxNumBlocks": self.max_num_blocks,
            "freeNumBlocks": self.max_num_blocks - used,
            "usedNumBlocks": used,
            "tokensPerBlock": self.tokens_per_block,
            "allocTotalBlocks": self._reused_blocks + self._missed_blocks,
            "allocNewBlocks": self._missed_blocks,
            "reusedBlocks": self._reused_blocks,
        }
        if self.stats_missed_blocks:
            looked_up = self._reused_blocks + self._missed_blocks
            kv["missedBlocks"] = self._missed_blocks
            kv["cacheHitRate"] = self._reused_blocks / looked_up if looked_up else 0.0
        self._iter_stats_result.put(
            {
                "iter": self._iteration,
                "numActiveRequests": len(live),
                "numQueuedRequests": 0,
                "kvCacheStats": kv,
                "inflightBatchingStats": {
                    "numScheduledRequests": len(live),
                    "numContextRequests": 0,
                    "numGenRequests": len(live),
                    "numPausedRequests": self.paused_requests,
                },
            }
        )
        self._iteration += 1

    def context_logits_for(self, prompt_ids: list[int]):
        """knob: the prompt's logits [len(prompt_ids), vocab_size] a request with
        `return_context_logits` gets: a fixed function of position and token, so a test
        can compute the expected logprobs itself."""
        import torch

        pos = torch.arange(len(prompt_ids), dtype=torch.float32)[:, None]
        vocab = torch.arange(self.vocab_size, dtype=torch.float32)[None, :]
        ids = torch.tensor(prompt_ids, dtype=torch.float32)[:, None]
        return torch.sin(pos * 0.7 + vocab * 0.3 + ids * 0.01) * 3.0

    def fail_background(self, error: BaseException) -> None:
        """knob: the executor's worker dies: `error` joins the executor's `_error_queue`; the
        next step of ONE running request raises it after shutting the executor down
        (`executor.py::_handle_background_error`), every other one blocks."""
        self._executor._error_queue.append(error)

    def fail_request(self, result: GenerationResult, message: str) -> None:
        """knob: the next step of this running request raises RequestError(message)."""
        result._request_error = message


class _TrtLLM(BaseLLM):
    _valid_kwargs = _COMMON_KWARGS | _TRT_ONLY_KWARGS

    def _read_model(self, model, config: dict, kwargs: dict) -> None:
        if "pretrained_config" not in config or "build_config" not in config:
            raise ValueError(f"{model} is not a TensorRT-LLM engine directory")
        self._max_seq_len = int(config["build_config"]["max_seq_len"])
        self._gathers_context = bool(config["build_config"].get("gather_context_logits"))

    @property
    def _on_trt_backend(self) -> bool:
        return True

    def _check_arguments(self, prompt_len: int, query_len: int, sp: SamplingParams) -> None:
        if not self.args.__dict__.get("enable_chunked_prefill") and (
            prompt_len + query_len + (sp.max_tokens or 0) > self._max_seq_len
        ):
            raise ValueError(
                f"The sum of prompt length ({prompt_len}) and query length ({query_len}) "
                f"max_tokens ({sp.max_tokens}) should not exceed max_seq_len ({self._max_seq_len})"
            )
        if sp.logprobs and not self.args.__dict__.get("gather_generation_logits"):
            raise ValueError(
                f"`sampling_params.logprobs={sp.logprobs}` requires "
                "`gather_generation_logits=True` to be passed explicitly to the `LLM()` "
                "constructor."
            )
        if sp.return_context_logits and not self._gathers_context:
            raise ValueError("context logits require an engine built with gather_context_logits")


class _TorchLLM(BaseLLM):
    _valid_kwargs = _COMMON_KWARGS | _TORCH_ONLY_KWARGS

    def _check_kwargs(self, kwargs: dict) -> None:
        trt_only = [k for k in kwargs if k in _TRT_ONLY_KWARGS]
        if trt_only:
            raise ValueError(
                "The following arguments are specific to TensorRT backend and cannot be used "
                f"with PyTorch backend: {trt_only}."
            )
        super()._check_kwargs(kwargs)

    def _read_model(self, model, config: dict, kwargs: dict) -> None:
        sampler = kwargs.get("sampler_type", "auto")
        import tensorrt_llm

        if sampler not in _sampler_types(tensorrt_llm.__version__):
            raise ValueError(
                f"Input should be 'TRTLLMSampler', 'TorchSampler' or 'auto': {sampler}"
            )
        self._sampler = "TorchSampler" if sampler == "auto" else sampler
        graphs = kwargs.get("cuda_graph_config")
        if graphs is not None and not isinstance(graphs, CudaGraphConfig):
            raise TypeError(f"cuda_graph_config must be CudaGraphConfig, got {type(graphs)}")
        if "pretrained_config" in config:
            raise ValueError(f"{model} is a TensorRT engine; the PyTorch backend loads checkpoints")
        self._max_seq_len = int(kwargs.get("max_seq_len") or config["max_position_embeddings"])
        self._max_num_tokens = int(kwargs.get("max_num_tokens") or 8192)

    @property
    def _reports_stats(self) -> bool:
        return bool(self.args.__dict__.get("enable_iter_perf_stats"))

    @property
    def _top_k_logprobs(self) -> bool:
        # TRTLLMSampler.update_requests: the sampled token's logprob alone, rank 1.
        return self._sampler != "TRTLLMSampler"

    def _check_arguments(self, prompt_len: int, query_len: int, sp: SamplingParams) -> None:
        if not self.args.__dict__.get("enable_chunked_prefill") and (
            prompt_len + query_len > self._max_num_tokens
        ):
            raise ValueError(
                f"The sum of prompt length ({prompt_len}), query length ({query_len}) should "
                f"not exceed max_num_tokens ({self._max_num_tokens})"
            )


class LLM(_TorchLLM):
    """`tensorrt_llm.LLM`: the PyTorch backend."""
