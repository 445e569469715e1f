"""Request bodies and answers for the two APIs, independent of any HTTP library."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from client.errors import ClientError
from client.streams import OpenAIStreamParser, PredictStreamParser
from client.types import Api, Completion, Message, SamplingParams, Usage

PREDICT_PATH = "/v1/models/model:predict"
READY_PATH = "/v1/models/model"
CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"

_OPENAI_NAMES = {"max_new_tokens": "max_tokens"}
_PREDICT_ONLY = {"streaming_interval"}


@dataclass(frozen=True)
class RequestSpec:
    path: str
    body: dict[str, Any]
    stream: bool
    chat: bool
    api: Api


def build_request(
    api: Api,
    *,
    prompt: str | list[int] | None = None,
    messages: list[Message] | None = None,
    sampling: SamplingParams | None = None,
    stream: bool = False,
    model: str | None = None,
    include_usage: bool = True,
    extra: dict[str, Any] | None = None,
) -> RequestSpec:
    """The path and JSON body for one generation request."""
    if (prompt is None) == (messages is None):
        raise ValueError("give exactly one of prompt or messages")
    params = (sampling or SamplingParams()).set_fields()
    chat = messages is not None
    if api == "predict":
        body: dict[str, Any] = {"messages": messages} if chat else {"prompt": prompt}
        body.update(params)
        body["streaming"] = stream
        path = PREDICT_PATH
    elif api == "openai":
        body = {"model": model or "model"}
        body.update({"messages": messages} if chat else {"prompt": prompt})
        for key, value in params.items():
            if key in _PREDICT_ONLY:
                continue
            body[_OPENAI_NAMES.get(key, key)] = value
        body["stream"] = stream
        if stream and include_usage:
            body["stream_options"] = {"include_usage": True}
        path = CHAT_PATH if chat else COMPLETIONS_PATH
    else:
        raise ValueError(f"unknown api {api!r}: use 'predict' or 'openai'")
    if extra:
        body.update(extra)
    return RequestSpec(path, body, stream, chat, api)


def parse_completion(spec: RequestSpec, payload: Any) -> Completion:
    """A non-streaming answer as a :class:`Completion`."""
    if not isinstance(payload, dict):
        raise ClientError(f"unexpected answer (not a JSON object): {str(payload)[:200]}")
    usage_raw = payload.get("usage")
    usage = Usage.from_dict(usage_raw) if isinstance(usage_raw, dict) else None
    if spec.api == "predict":
        if "output" not in payload:
            raise ClientError(f"unexpected answer (no 'output'): {str(payload)[:200]}")
        return Completion(payload["output"], payload.get("finish_reason"), usage, payload)
    choices = payload.get("choices") or []
    if not choices:
        raise ClientError(f"unexpected answer (no 'choices'): {str(payload)[:200]}")
    choice = choices[0]
    if spec.chat:
        text = (choice.get("message") or {}).get("content") or ""
    else:
        text = choice.get("text") or ""
    return Completion(text, choice.get("finish_reason"), usage, payload)


def stream_parser(
    spec: RequestSpec, errors: str = "strict"
) -> PredictStreamParser | OpenAIStreamParser:
    if spec.api == "predict":
        return PredictStreamParser(errors)
    return OpenAIStreamParser(chat=spec.chat)
