# Mirrors the names tensorrt_llm/llmapi/__init__.py exports that the adapters use.
from tensorrt_llm.executor import CompletionOutput, RequestError
from tensorrt_llm.llmapi.llm import LLM, RequestOutput
from tensorrt_llm.llmapi.llm_args import (
    CapacitySchedulerPolicy,
    CudaGraphConfig,
    KvCacheConfig,
    SchedulerConfig,
)
from tensorrt_llm.sampling_params import GuidedDecodingParams, SamplingParams

__all__ = [
    "LLM",
    "CapacitySchedulerPolicy",
    "CompletionOutput",
    "CudaGraphConfig",
    "GuidedDecodingParams",
    "KvCacheConfig",
    "RequestError",
    "RequestOutput",
    "SamplingParams",
    "SchedulerConfig",
]
