"""Checked by `make typecheck`, never run: each wire format satisfies the `WireFormat`
protocol the frontend drives, and each format's call satisfies `Call` (frozen dataclasses
against the protocol's read-only members)."""

from __future__ import annotations

from mistral_serving.protocols import Call, WireFormat
from mistral_serving.protocols.openai import OpenAICall, OpenAIFormat
from mistral_serving.protocols.predict import PredictCall, PredictFormat


def formats(predict: PredictFormat, openai: OpenAIFormat) -> list[WireFormat]:
    return [predict, openai]


def calls(predict: PredictCall, openai: OpenAICall) -> list[Call]:
    return [predict, openai]
