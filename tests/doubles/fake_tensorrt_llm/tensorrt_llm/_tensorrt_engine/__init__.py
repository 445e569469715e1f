# Mirrors tensorrt_llm/_tensorrt_engine/__init__.py: the TensorRT-engine LLM class, which
# exists only in the lines that still have the TensorRT-engine backend (up to 1.2.x).
import tensorrt_llm
from tensorrt_llm._lines import has_engine_backend

if not has_engine_backend(tensorrt_llm.__version__):
    raise ModuleNotFoundError(
        "No module named 'tensorrt_llm._tensorrt_engine'", name="tensorrt_llm._tensorrt_engine"
    )

from tensorrt_llm.llmapi.llm import _TrtLLM as LLM  # noqa: E402

__all__ = ["LLM"]
