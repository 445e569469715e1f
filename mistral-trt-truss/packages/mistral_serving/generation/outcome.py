"""How one request ended, and what it produced: the one account of a request's end.

The service makes it when a generation ends (or fails); the frontend makes one for a
request refused before generating, and may say why a stream it cut ended (its client
left or stopped reading). Wire formats build their answers from it, and the request's
record is closed with it, once (`Telemetry.finished`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from mistral_serving.engines.base import TokenLogprob

# Ends of a generation: the engine's (stop, length), the server's (abort: cut by a drain
# or a client gone; timeout: the request's deadline), and failures (invalid: the
# request's fault found by the engine; error).
GENERATED = frozenset({"stop", "length"})


@dataclass(frozen=True)
class Outcome:
    reason: str  # stop, length, abort, timeout, invalid, error; or a refusal's (errors.py)
    text: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    logprobs: tuple[TokenLogprob, ...] | None = None  # the output's, when asked
    stop_sequence: str | None = None  # the stop string that ended it (reason stop)

    @property
    def complete(self) -> bool:
        """The answer ended as the model or the request's limits said (stop, length)."""
        return self.reason in GENERATED

    @property
    def usage(self) -> dict[str, int]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
        }

    def because(self, reason: str) -> Outcome:
        """The same output, ended for another reason (a cut stream says why it was cut)."""
        return dataclasses.replace(self, reason=reason)
