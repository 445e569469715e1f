"""`POST /v1/models/model:predict`: the original Baseten article's body, defaults and answers.

Defaults are the original Baseten article's exactly: max_new_tokens 2048 (clamped to what the engine
allows), temperature 0.9, top_k 1 (greedy), top_p 0 (off), streaming false,
streaming_interval 3. `max_tokens` and `stream` are accepted as aliases (Baseten's
names); giving both names of one field is a 400. The non-streaming answer is
`{"output", "finish_reason", "usage"}`; the streaming answer is the text itself in UTF-8
chunks, and a stream cut short (drain, abort) ends without the closing chunk of HTTP's
chunked encoding, so a client can tell it from a complete answer. Errors are
`{"error": message}`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from pydantic import Field, model_validator

from mistral_serving.engines.base import SamplingOptions
from mistral_serving.errors import RequestError
from mistral_serving.generation.outcome import Outcome
from mistral_serving.generation.service import Generation, GenerationRequest
from mistral_serving.protocols import ParseContext, TruncatedStream
from mistral_serving.protocols.fields import (
    AdditivePenalty,
    MaxTokens,
    RepetitionPenalty,
    Seed,
    Stop,
    StrictModel,
    Temperature,
    TopK,
    top_p_or_off,
    validate,
)
from mistral_serving.text.chat import ChatMessage

ALIASES = {"max_tokens": "max_new_tokens", "stream": "streaming"}


class PredictMessage(ChatMessage):
    model_config = ChatMessage.model_config | {"strict": True}


class PredictRequest(StrictModel):
    prompt: str | None = None
    messages: list[PredictMessage] | None = Field(None, min_length=1, max_length=4096)
    max_new_tokens: MaxTokens = 2048
    temperature: Temperature = 0.9
    top_k: TopK = 1
    top_p: float = Field(0.0, ge=0.0, le=1.0, description="0 or 1: off")
    streaming: bool = False
    streaming_interval: int = Field(3, ge=1, le=1024)
    stop: Stop | None = None
    seed: Seed | None = None
    repetition_penalty: RepetitionPenalty = 1.0
    presence_penalty: AdditivePenalty = 0.0
    frequency_penalty: AdditivePenalty = 0.0

    @model_validator(mode="after")
    def _prompt_or_messages(self) -> PredictRequest:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of `prompt` or `messages`")
        return self


@dataclass(frozen=True)
class PredictCall:
    gen: GenerationRequest
    stream: bool


class PredictFormat:
    route = "predict"
    stream_media_type = "text/plain; charset=utf-8"

    def parse(self, body: dict[str, Any], ctx: ParseContext) -> PredictCall:
        body = _resolve_aliases(body)
        req = validate(PredictRequest, body)
        assert isinstance(req, PredictRequest)
        sampling = SamplingOptions(
            max_new_tokens=req.max_new_tokens,
            temperature=req.temperature,
            top_k=req.top_k,
            top_p=top_p_or_off(req.top_p),
            seed=req.seed,
            repetition_penalty=req.repetition_penalty,
            presence_penalty=req.presence_penalty,
            frequency_penalty=req.frequency_penalty,
        )
        messages = (
            tuple(ChatMessage(role=m.role, content=m.content) for m in req.messages)
            if req.messages is not None
            else None
        )
        gen = GenerationRequest(
            sampling=sampling,
            prompt=req.prompt,
            messages=messages,
            stop=tuple(req.stop or ()),
            interval=req.streaming_interval,
            param="messages" if messages is not None else "prompt",
        )
        return PredictCall(gen, req.streaming)

    def response_body(self, call: PredictCall, outcome: Outcome, answer_id: str) -> dict[str, Any]:
        return {"output": outcome.text, "finish_reason": outcome.reason, "usage": outcome.usage}

    async def stream_events(
        self, call: PredictCall, generation: Generation, answer_id: str
    ) -> AsyncIterator[str]:
        async for chunk in generation:
            if chunk.text:
                yield chunk.text
        outcome = generation.outcome
        if outcome is None or not outcome.complete:
            raise TruncatedStream(outcome.reason if outcome is not None else "abort")

    def error_body(self, err: RequestError) -> dict[str, Any]:
        return predict_error_body(err)


def predict_error_body(err: RequestError) -> dict[str, Any]:
    """The predict route's error body, the shape Truss gives an HTTPException: every
    refusal on this route, the server's body guard and API-key check included."""
    return {"error": err.message}


def _resolve_aliases(body: dict[str, Any]) -> dict[str, Any]:
    if not any(alias in body for alias in ALIASES):
        return body
    body = dict(body)
    for alias, name in ALIASES.items():
        if alias in body:
            if name in body:
                raise RequestError(
                    f"give either `{name}` or its alias `{alias}`, not both", param=alias
                )
            body[name] = body.pop(alias)
    return body
