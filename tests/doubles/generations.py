"""A generation's surface (`mistral_serving.generation.service.Generation`) for the wire
formats' tests: the given chunks, then an outcome, or an error raised mid-stream, as the
service's generation raises it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, cast

from mistral_serving.generation.outcome import Outcome
from mistral_serving.generation.service import Chunk, Generation
from mistral_serving.protocols.openai.base import OpenAIRoute
from mistral_serving.protocols.openai.chat import ChatCompletionsFormat
from mistral_serving.protocols.openai.completions import CompletionsFormat


class ScriptedGeneration:
    def __init__(
        self,
        chunks: Sequence[Chunk | str],
        outcome: Outcome,
        error: Exception | None = None,
    ) -> None:
        self._chunks = [c if isinstance(c, Chunk) else Chunk(c) for c in chunks]
        self._final = outcome
        self._error = error
        self.prompt_tokens = outcome.prompt_tokens
        self.completion_tokens = 0
        self.outcome: Outcome | None = None

    async def _run(self) -> AsyncIterator[Chunk]:
        for i, chunk in enumerate(self._chunks):
            self.completion_tokens = i + 1
            yield chunk
        self.completion_tokens = self._final.completion_tokens
        if self._error is not None:
            self.outcome = self._final.because("invalid")
            raise self._error
        self.outcome = self._final

    def __aiter__(self) -> AsyncIterator[Chunk]:
        return self._run()

    async def aclose(self) -> None:
        pass


def scripted(
    chunks: Sequence[Chunk | str], outcome: Outcome, error: Exception | None = None
) -> Generation:
    """A ScriptedGeneration typed as what the formats take."""
    return cast(Generation, ScriptedGeneration(chunks, outcome, error))


def openai_format(
    chat: bool,
    model_name: str,
    token_bytes: Callable[[int], bytes],
    tool_format: str = "fallback_json",
) -> OpenAIRoute[Any]:
    """The chat or the completions route's format."""
    if chat:
        return ChatCompletionsFormat(model_name, token_bytes, tool_format)
    return CompletionsFormat(model_name, token_bytes)
