"""Wire formats, one per route: `predict` (the Truss route of the original article),
`openai/` (chat completions and text completions, over a shared base), `responses/` (the
Responses API) and `anthropic/` (Anthropic's Messages); `answers.py` and `sse.py` hold what
the chat-shaped ones share. Each owns its format end to end: body -> one `GenerationRequest`; the answer, the stream's encoding and
the error body, all built from the generation's `Outcome`. `http/frontend.py` drives them
through the `WireFormat` interface below."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

from mistral_serving.errors import RequestError
from mistral_serving.generation.outcome import Outcome
from mistral_serving.generation.service import Generation, GenerationRequest


@dataclass(frozen=True)
class ParseContext:
    """What parsing may depend on besides the body."""

    default_max_tokens: int  # when the body names none (OpenAI chat)


class Call(Protocol):
    """One parsed request: what to generate, and how the answer must be shaped.

    Read-only members: a format's call is a frozen dataclass, and a protocol's plain
    attribute would demand a settable one."""

    @property
    def gen(self) -> GenerationRequest: ...

    @property
    def stream(self) -> bool: ...


class WireFormat(Protocol):
    @property
    def route(self) -> str:
        """The metrics/log label."""
        ...

    @property
    def stream_media_type(self) -> str: ...

    def parse(self, body: dict[str, Any], ctx: ParseContext) -> Call: ...

    def response_body(self, call: Any, outcome: Outcome, answer_id: str) -> Any:
        """The whole answer; `answer_id` is unique to this request in the process."""
        ...

    def stream_events(
        self, call: Any, generation: Generation, answer_id: str
    ) -> AsyncIterator[str]:
        """The stream's body, from the generation's chunks and then its outcome; must end
        by raising `TruncatedStream` when the answer was cut (drain, abort) and the format
        has no way to say so in-band."""
        ...

    def error_body(self, err: RequestError) -> dict[str, Any]: ...


class TruncatedStream(Exception):
    """The answer was cut short: the HTTP body must not end like a complete one."""
