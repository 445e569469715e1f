"""Test double of the `tensorrt_llm` package (see ../README.md). Not the real thing.

`tensorrt_llm.LLM` is the PyTorch backend (`llmapi/llm.py::LLM`, a `_TorchLLM`), as in the
real package since 1.0; the TensorRT-engine LLM is `tensorrt_llm._tensorrt_engine.LLM`."""

from tensorrt_llm.llmapi.llm import LLM
from tensorrt_llm.sampling_params import SamplingParams

# The release line we target; tests set another value to check version handling.
__version__ = "1.2.1"

__all__ = ["LLM", "SamplingParams", "__version__"]
