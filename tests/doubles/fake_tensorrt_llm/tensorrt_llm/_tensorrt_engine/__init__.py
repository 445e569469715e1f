# Mirrors tensorrt_llm/_tensorrt_engine/__init__.py: the TensorRT-engine LLM class.
from tensorrt_llm.llmapi.llm import _TrtLLM as LLM

__all__ = ["LLM"]
