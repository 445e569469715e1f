"""Mirrors `_TrtLLM` / `BaseLLM` of tensorrt_llm/llmapi/llm.py: the constructor signature
and kwargs check, `generate_async` (its argument checks and errors), `shutdown()`, and the
private `_executor` with `is_shutdown()` that health checks read.

Test knobs (not in the real API) are marked "knob"."""

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

from tensorrt_llm.executor.result import GenerationResult
from tensorrt_llm.llmapi.llm_args import KvCacheConfig
from tensorrt_llm.sampling_params import SamplingParams

RequestOutput = GenerationResult  # the real one subclasses GenerationResult

# A subset of TrtLlmArgs' fields; the real constructor raises on any other keyword.
_VALID_KWARGS = {
    "backend",
    "build_config",
    "enable_chunked_prefill",
    "kv_cache_config",
    "max_batch_size",
    "max_beam_width",
    "max_num_tokens",
    "max_seq_len",
    "workspace",
}


class _FakeExecutor:
    """The GenerationExecutor surface the LLM API and the adapter touch."""

    def __init__(self) -> None:
        self.doing_shutdown = False
        self.background_error: BaseException | None = None
        self.aborted_ids: list[int] = []

    def is_shutdown(self) -> bool:
        return self.doing_shutdown

    def shutdown(self) -> None:
        self.doing_shutdown = True

    def abort_request(self, request_id: int) -> None:
        self.aborted_ids.append(request_id)


class _TrtLLM:
    instances: ClassVar[list["_TrtLLM"]] = []  # knob: every LLM built in this import

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
        for key in kwargs:
            if key not in _VALID_KWARGS:
                raise ValueError(f"{self.__class__.__name__} got invalid argument: {key}")
        kv = kwargs.get("kv_cache_config")
        if kv is not None and not isinstance(kv, KvCacheConfig):
            raise TypeError(f"kv_cache_config must be KvCacheConfig, got {type(kv)}")
        config_path = Path(model) / "config.json"
        config = json.loads(config_path.read_text())  # FileNotFoundError like the real one
        if "pretrained_config" not in config or "build_config" not in config:
            raise ValueError(f"{model} is not a TensorRT-LLM engine directory")
        self.args = SimpleNamespace(
            model=str(model),
            tokenizer=None if skip_tokenizer_init else tokenizer,
            skip_tokenizer_init=skip_tokenizer_init,
            tensor_parallel_size=tensor_parallel_size,
            **kwargs,
        )
        # Without skip_tokenizer_init the real LLM loads a tokenizer from the model dir.
        self.tokenizer = None if skip_tokenizer_init else object()
        self._max_seq_len = int(config["build_config"]["max_seq_len"])
        self._executor: _FakeExecutor | None = _FakeExecutor()
        self._next_id = 0

        # knobs
        self.script: list[int] = list(range(1000, 1100))  # token ids "decoded", in order
        self.tokens_per_step = 1  # tokens per streamed response
        self.include_end_id_in_output = False  # whether end_id shows up in token_ids
        self.step_delay = 0.0
        self.requests: list[GenerationResult] = []  # every request, in order
        self.next_request_error: str | None = None  # the next request fails with this
        self.shutdown_calls = 0
        _TrtLLM.instances.append(self)

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
        # _prepare_sampling_params
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
        if not (isinstance(inputs, list) and all(isinstance(t, int) for t in inputs)):
            raise TypeError(f"The inputs must be type str or list of int, but got {type(inputs)}")
        # _check_arguments (TensorRT backend, no chunked prefill)
        if len(inputs) + (sampling_params.max_tokens or 0) > self._max_seq_len:
            raise ValueError(
                f"The sum of prompt length ({len(inputs)}) and query length (0) max_tokens "
                f"({sampling_params.max_tokens}) should not exceed max_seq_len "
                f"({self._max_seq_len})"
            )
        result = GenerationResult(self._next_id, inputs, sampling_params, streaming, self)
        result._request_error, self.next_request_error = self.next_request_error, None
        self._next_id += 1
        self.requests.append(result)
        return result

    def shutdown(self) -> None:
        self.shutdown_calls += 1
        if self._executor is not None:
            self._executor.shutdown()
            self._executor = None

    # knobs ---------------------------------------------------------------------------
    def fail_background(self, error: BaseException) -> None:
        """The executor's worker dies: the next step of a running request raises `error`
        after the executor shut itself down (`executor.py::_handle_background_error`)."""
        self._executor.background_error = error
