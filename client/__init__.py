"""Client for the mistral-trt-truss service: library, CLI (`python -m client`) and benchmark
(`python -m client bench`). Works against the Truss predict route and any OpenAI-compatible
server."""

from client.client import (
    DEFAULT_URL,
    AsyncClient,
    AsyncStreamingText,
    Client,
    RetryPolicy,
    StreamingText,
)
from client.errors import (
    BadRequestError,
    ClientConnectionError,
    ClientError,
    ClientTimeoutError,
    RateLimitedError,
    ServerError,
    ServiceUnavailableError,
    StreamError,
)
from client.types import Completion, SamplingParams, Usage

__all__ = [
    "DEFAULT_URL",
    "AsyncClient",
    "AsyncStreamingText",
    "BadRequestError",
    "Client",
    "ClientConnectionError",
    "ClientError",
    "ClientTimeoutError",
    "Completion",
    "RateLimitedError",
    "RetryPolicy",
    "SamplingParams",
    "ServerError",
    "ServiceUnavailableError",
    "StreamError",
    "StreamingText",
    "Usage",
]
