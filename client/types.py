"""The client's data at its edges: sampling parameters, usage, completions."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, Literal

Api = Literal["predict", "openai"]
Message = dict[str, str]


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Usage:
        prompt = int(data.get("prompt_tokens") or 0)
        completion = int(data.get("completion_tokens") or 0)
        total = data.get("total_tokens")
        return cls(prompt, completion, int(total) if total is not None else prompt + completion)


@dataclass(frozen=True)
class Completion:
    output: str
    finish_reason: str | None
    usage: Usage | None
    raw: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "output": self.output,
            "finish_reason": self.finish_reason,
            "usage": asdict(self.usage) if self.usage else None,
        }


@dataclass(frozen=True)
class SamplingParams:
    """Every sampling field of the predict route. ``None`` means "the server's default".

    On the OpenAI routes ``max_new_tokens`` is sent as ``max_tokens``; ``top_k`` and
    ``repetition_penalty`` go as the extra fields vLLM and trtllm-serve accept;
    ``streaming_interval`` exists only on the predict route and is not sent there.
    """

    max_new_tokens: int | None = None
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    stop: list[str] | None = None
    seed: int | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    streaming_interval: int | None = None

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    def set_fields(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}
