"""Bounded retries with exponential backoff.

Only failures where the request certainly did not start generating are retried: no
connection could be made, the server answered 503 (model still loading, or draining) or
429 (queue full; its Retry-After is honoured). A timeout while reading an answer, a 4xx or
any other 5xx is raised at once.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from client.errors import (
    ClientConnectionError,
    ClientError,
    RateLimitedError,
    ServiceUnavailableError,
)


@dataclass(frozen=True)
class RetryPolicy:
    retries: int = 3
    backoff: float = 0.5
    max_backoff: float = 8.0
    jitter: float = 0.1

    def retryable(self, error: ClientError) -> bool:
        return isinstance(error, ClientConnectionError | ServiceUnavailableError | RateLimitedError)

    def delay(
        self, attempt: int, retry_after: float | None = None, rng: random.Random | None = None
    ) -> float:
        """Seconds to sleep before retry number ``attempt + 1`` (attempt counts from 0).

        ``backoff * 2**attempt`` capped at ``max_backoff``, plus up to ``jitter`` of it at
        random; a server's Retry-After wins when it is longer (capped at 60 s).
        """
        base = min(self.max_backoff, self.backoff * (2**attempt))
        base += base * self.jitter * (rng or random).random()
        if retry_after is not None:
            base = max(base, min(retry_after, 60.0))
        return base
