"""The body of `POST /v1/models/model:predict`, validated with pydantic.

Defaults are the article's exactly: max_new_tokens 2048 (clamped to what the engine
allows), temperature 0.9, top_k 1 (greedy), top_p 0 (off), streaming false,
streaming_interval 3. Unknown fields are refused, so a typo is a 400, not a silent default.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from mistral_serving.chat import ChatMessage

MAX_STOP_STRINGS = 16
StopString = Annotated[str, Field(min_length=1, max_length=256)]


class PredictRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    prompt: str | None = None
    messages: list[ChatMessage] | None = Field(None, min_length=1)
    max_new_tokens: int = Field(2048, ge=1)
    temperature: float = Field(0.9, ge=0.0, le=2.0)
    top_k: int = Field(1, ge=0, description="1: greedy; 0: off")
    top_p: float = Field(0.0, ge=0.0, le=1.0, description="0 or 1: off")
    streaming: bool = False
    streaming_interval: int = Field(3, ge=1, le=1024)
    stop: list[StopString] | None = Field(None, max_length=MAX_STOP_STRINGS)
    seed: int | None = Field(None, ge=0, le=2**63 - 1)
    repetition_penalty: float = Field(1.0, gt=0.0, le=10.0)
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)

    @field_validator("stop", mode="before")
    @classmethod
    def _one_stop_string(cls, v: object) -> object:
        return [v] if isinstance(v, str) else v

    @model_validator(mode="after")
    def _prompt_or_messages(self) -> PredictRequest:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of `prompt` or `messages`")
        return self


def describe_validation_error(exc: ValidationError) -> str:
    """One readable line per problem: `field: message`."""
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "body"
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown field"
        parts.append(f"{loc}: {msg}")
    return "; ".join(parts)
