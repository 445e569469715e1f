# Mirrors tensorrt_llm/executor/utils.py: the per-request error type.


class RequestError(RuntimeError):
    """The error raised when the request is failed."""
