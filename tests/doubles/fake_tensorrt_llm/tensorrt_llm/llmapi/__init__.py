# Mirrors the names tensorrt_llm/llmapi/__init__.py exports that the adapter uses.
from tensorrt_llm.executor import CompletionOutput, RequestError
from tensorrt_llm.llmapi.llm import RequestOutput
from tensorrt_llm.llmapi.llm_args import KvCacheConfig
from tensorrt_llm.sampling_params import SamplingParams

__all__ = ["CompletionOutput", "KvCacheConfig", "RequestError", "RequestOutput", "SamplingParams"]
