"""Test double of the `tensorrt_llm` package (see ../README.md). Not the real thing."""

from tensorrt_llm.sampling_params import SamplingParams

# The release line we target; tests set another value to check version handling.
__version__ = "1.2.1"

__all__ = ["SamplingParams", "__version__"]
