from tensorrt_llm.executor.result import (
    CompletionOutput,
    GenerationResult,
    IterationResult,
    Logprob,
)
from tensorrt_llm.executor.utils import RequestError

__all__ = ["CompletionOutput", "GenerationResult", "IterationResult", "Logprob", "RequestError"]
