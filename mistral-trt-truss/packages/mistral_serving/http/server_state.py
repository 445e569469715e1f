"""The server's lifecycle state, in `X-Server-State` on every 503 and `/health` answer.

A prober, a gateway or a client can then tell why a pod refused without parsing a body:

- `starting`: loading the model (nothing is served yet);
- `ready`: serving (a 503 then means this pod is saturated: try another);
- `draining`: SIGTERM: finishing what it has, taking nothing new;
- `dead`: the engine died or stalled, or the load failed: the process is on its way out
  (or, for a stall, back to `ready` if the engine moves again).

trtllm-serve says the same on its 503s (`x-trtllm-server-state`, starting and ready); this
server adds the two states it also has.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

STATE_HEADER = "X-Server-State"
STARTING, READY, DRAINING, DEAD = "starting", "ready", "draining", "dead"
STATES = (STARTING, READY, DRAINING, DEAD)
# Answers that always carry the state, whatever their status.
HEALTH_PATHS = frozenset({"/health", "/health/generate"})

_KEY = STATE_HEADER.lower().encode()

Scope = dict[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

# Where the process's state is read for answers made below the ASGI app (the connection
# limits' own 503s); set once by the server that serves it.
_current: Callable[[], str] | None = None


def publish(state: Callable[[], str]) -> None:
    global _current
    _current = state


def state_headers() -> list[tuple[bytes, bytes]]:
    """The header for a 503 written outside the app (none before a server published)."""
    return [] if _current is None else [(_KEY, _current().encode())]


class StateHeader:
    """ASGI middleware: stamps the state on 503s and health answers, read when the answer
    starts; an answer that already says one (the deep probe's verdict) keeps it, once."""

    def __init__(self, app: ASGIApp, state: Callable[[], str]) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        health = scope.get("path") in HEALTH_PATHS

        async def stamped(message: Message) -> None:
            if message["type"] == "http.response.start" and (health or message["status"] == 503):
                headers = list(message.get("headers", ()))
                said = [v for k, v in headers if k.lower() == _KEY]
                headers = [h for h in headers if h[0].lower() != _KEY]
                headers.append((_KEY, said[0] if said else self.state().encode()))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, stamped)
