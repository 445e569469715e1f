"""Checked by `make typecheck`, never run: each wire format satisfies the `WireFormat`
protocol the frontend drives, and each format's call satisfies `Call` (frozen dataclasses
against the protocol's read-only members)."""

from __future__ import annotations

from mistral_serving.protocols import Call, WireFormat
from mistral_serving.protocols.anthropic.format import MessagesCall, MessagesFormat
from mistral_serving.protocols.openai.chat import ChatCall, ChatCompletionsFormat
from mistral_serving.protocols.openai.completions import CompletionCall, CompletionsFormat
from mistral_serving.protocols.predict import PredictCall, PredictFormat
from mistral_serving.protocols.responses.format import ResponsesCall, ResponsesFormat


def formats(
    predict: PredictFormat,
    chat: ChatCompletionsFormat,
    completions: CompletionsFormat,
    responses: ResponsesFormat,
    messages: MessagesFormat,
) -> list[WireFormat]:
    return [predict, chat, completions, responses, messages]


def calls(
    predict: PredictCall,
    chat: ChatCall,
    completion: CompletionCall,
    response: ResponsesCall,
    message: MessagesCall,
) -> list[Call]:
    return [predict, chat, completion, response, message]
