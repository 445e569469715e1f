"""The small async interface every engine implements.

The service hands an engine prompt token ids and `SamplingOptions`, and reads an async
stream of `TokenDelta`s: the new token ids since the last delta, and on the last one a
finish reason. Text, stop strings and throttling live above the engine (`streaming.py`),
so every engine streams correctly the same way.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

FinishReason = Literal["stop", "length", "abort", "error"]


class EngineError(RuntimeError):
    """The engine failed a request (not the client's fault)."""


class EngineRequestError(ValueError):
    """The engine refused a request because of its inputs (the client's fault: a 4xx)."""


@dataclass(frozen=True)
class GuidedDecoding:
    """Constrain the output to JSON: any JSON object, or one valid for `json_schema`."""

    kind: Literal["json_object", "json_schema"]
    json_schema: str | None = None  # the schema as JSON text (kind json_schema)


@dataclass(frozen=True)
class TokenLogprob:
    """One generated token's log-probability, and the `top` most likely alternatives
    (token id, logprob), from the log-softmax of the logits the sampler saw."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class SamplingOptions:
    """What to generate, in the service's own terms (engine adapters map these)."""

    max_new_tokens: int
    temperature: float = 1.0
    top_k: int = 0  # 0: off; 1: greedy
    top_p: float = 1.0  # 1.0: off
    seed: int | None = None
    repetition_penalty: float = 1.0  # multiplicative, over prompt and output (HF semantics)
    presence_penalty: float = 0.0  # additive, over output tokens (OpenAI semantics)
    frequency_penalty: float = 0.0
    stop_token_ids: tuple[int, ...] = ()  # end generation on these (EOS is always one)
    ignore_eos: bool = False  # vLLM: EOS does not end generation (max_new_tokens does)
    min_tokens: int = 0  # vLLM: EOS and stop_token_ids cannot end it before this many tokens
    logprobs: int | None = None  # None: off; k: the chosen token's logprob and the top k
    guided: GuidedDecoding | None = None  # structured output (response_format)

    @property
    def greedy(self) -> bool:
        return self.top_k == 1 or self.temperature == 0.0


@dataclass(frozen=True)
class TokenDelta:
    token_ids: list[int]
    finish_reason: FinishReason | None = None
    logprobs: list[TokenLogprob] | None = None  # one per token_ids entry when asked


@dataclass(frozen=True)
class EngineLimits:
    max_input_len: int  # longest prompt, in tokens
    max_seq_len: int  # prompt + output, in tokens
    max_batch_size: int  # sequences decoded together


@dataclass
class EngineInfo:
    """What the engine reports about itself (logged at load, shown on metadata)."""

    name: str
    details: dict[str, object] = field(default_factory=dict)


@runtime_checkable
class Engine(Protocol):
    limits: EngineLimits
    info: EngineInfo
    eos_token_id: int

    def generate(
        self, request_id: str, prompt_ids: list[int], sampling: SamplingOptions
    ) -> AsyncIterator[TokenDelta]:
        """Stream new tokens. The last delta carries the finish reason. Closing the
        iterator early (client gone) must abort the request in the engine."""
        ...

    def abort(self, request_id: str) -> None:
        """Stop a running request; its stream ends with finish reason `abort`."""
        ...

    def is_healthy(self) -> bool:
        """False once the engine can no longer serve (its loop died, the GPU failed)."""
        ...

    def shutdown(self) -> None: ...
