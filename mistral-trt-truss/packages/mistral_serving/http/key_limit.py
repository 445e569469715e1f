"""An optional per-API-key concurrency limit (`max_inflight_per_key`): 429 for a quota.

A key that already has that many generation requests running or waiting gets 429 with
`Retry-After`, before its body is read: the tenant is over its share of this replica, and
it is the client that should slow down. A saturated replica answers 503 instead
(frontend.py), which a gateway may retry on another pod. Counted per process (as the other
admission limits: a fleet-wide quota per tenant is the router's flow control's, by
fairness id) and keyed by a digest of the token, never the token itself. Only requests the API-key guard (outside
this one) let through reach it, so only keys it accepted are ever counted.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from mistral_serving.http.auth import presented_key, send_json

RETRY_AFTER_SECONDS = 1

Scope = dict[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class KeyConcurrency:
    """ASGI middleware: a key's requests are counted from their start to the end of their
    answer (a stream's last byte: the app's call returns only then)."""

    def __init__(
        self,
        app: ASGIApp,
        limit: int,
        route_of: Callable[[str], str | None],
        error_json: Callable[[str | None, int, str, str | None], bytes],
        count: Callable[[str], None] = lambda route: None,
    ) -> None:
        self.app = app
        self.limit = limit
        self.route_of = route_of
        self.error_json = error_json
        self.count = count  # a refusal, by route
        self.held: dict[bytes, int] = {}  # digest of a key -> its requests in progress

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = self._route(scope)
        token = presented_key(scope) if route is not None else None
        if route is None or token is None:
            await self.app(scope, receive, send)
            return
        key = hashlib.sha256(token).digest()
        held = self.held.get(key, 0)
        if held >= self.limit:
            self.count(route)
            await self._refuse(route, send)
            return
        self.held[key] = held + 1
        try:
            await self.app(scope, receive, send)
        finally:
            left = self.held[key] - 1
            if left:
                self.held[key] = left
            else:
                del self.held[key]  # the table holds only keys with work in progress

    def _route(self, scope: Scope) -> str | None:
        if scope["type"] != "http" or scope.get("method") != "POST":
            return None
        return self.route_of(scope.get("path", ""))

    async def _refuse(self, route: str, send: Send) -> None:
        message = (
            f"this API key already has {self.limit} requests in progress (its limit); "
            "retry when one has finished"
        )
        body = self.error_json(route, 429, message, "rate_limit_exceeded")
        await send_json(send, 429, body, (b"retry-after", str(RETRY_AFTER_SECONDS).encode()))
