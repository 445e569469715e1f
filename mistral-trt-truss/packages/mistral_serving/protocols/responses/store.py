"""Stored responses: what `previous_response_id` continues and `GET /v1/responses/{id}`
reads. Bounded three ways (settings `responses_store_max_entries`, `_max_bytes`,
`_max_age_seconds`); past a bound the oldest go first. A response not here (never stored,
dropped, deleted, or stored by another process) is a miss, which the route answers with a
404 naming the id: a continuation never starts from a wrong or partial history.

The store is this process's memory, as vLLM's is: a fleet needs the gateway to send a
conversation's requests to the replica that stored it (docs/responses-api.md, "A fleet").
Everything here runs on the event loop: no locks.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from mistral_serving.text.chat import Message, ToolCallsMessage


@dataclass(frozen=True)
class StoredResponse:
    body: dict[str, Any]  # the Response object as it was answered
    conversation: tuple[Message, ...]  # its input and output, without its instructions
    size: int  # bytes counted against the store's bound
    stored_at: float  # on the store's clock


def conversation_bytes(messages: Sequence[Message]) -> int:
    """What a conversation weighs: its texts in UTF-8 (calls' names and arguments too)."""
    total = 0
    for m in messages:
        total += len(m.content.encode())
        if isinstance(m, ToolCallsMessage):
            total += sum(len(c.name) + len(c.arguments.encode()) + len(c.id) for c in m.tool_calls)
    return total


class ResponseStore:
    def __init__(
        self,
        max_entries: int,
        max_bytes: int,
        max_age_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.max_age_s = max_age_s
        self._clock = clock
        self._items: collections.OrderedDict[str, StoredResponse] = collections.OrderedDict()
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._items)

    def put(
        self, response_id: str, body: dict[str, Any], conversation: tuple[Message, ...], size: int
    ) -> bool:
        """Keep it (dropping the oldest past a bound); False when it cannot be kept at all."""
        if self.max_entries == 0 or size > self.max_bytes:
            return False
        self._expire()
        self._drop(response_id)
        self._items[response_id] = StoredResponse(body, conversation, size, self._clock())
        self.bytes += size
        while len(self._items) > self.max_entries or self.bytes > self.max_bytes:
            self._drop(next(iter(self._items)))
        return True

    def get(self, response_id: str) -> StoredResponse | None:
        self._expire()
        return self._items.get(response_id)

    def delete(self, response_id: str) -> bool:
        self._expire()
        return self._drop(response_id)

    def _drop(self, response_id: str) -> bool:
        gone = self._items.pop(response_id, None)
        if gone is None:
            return False
        self.bytes -= gone.size
        return True

    def _expire(self) -> None:
        """Drop what is older than the age bound (the oldest are first in the order)."""
        horizon = self._clock() - self.max_age_s
        while self._items:
            oldest = next(iter(self._items.values()))
            if oldest.stored_at > horizon:
                return
            self._drop(next(iter(self._items)))
