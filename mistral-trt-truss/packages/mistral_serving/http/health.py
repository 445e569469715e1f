"""`GET /health/generate`: the deep probe, one generated token within a deadline.

A plain `/health` says the process serves and the engine has not died or stalled with work
pending; it cannot see an engine that hangs while idle. This one asks the engine for one
greedy token (straight to it: neither the queue nor the request metrics see it) within
`health_generate_timeout_seconds`: 200 with the seconds it took, else 503 whose
`X-Server-State` says `dead`. Concurrent probes share one generation, so a flood of them
costs one token. Not ready (starting, draining, dead): 503 with that state, nothing asked.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from fastapi.responses import JSONResponse

from mistral_serving.http.server_state import DEAD, READY, STATE_HEADER

if TYPE_CHECKING:
    from mistral_serving.http.frontend import Frontend

log = logging.getLogger(__name__)


class DeepProbe:
    def __init__(self, frontend: Frontend) -> None:
        self.frontend = frontend
        self._running: asyncio.Future[float] | None = None  # the shared generation

    async def answer(self) -> JSONResponse:
        state = self.frontend.state()
        service = self.frontend.service
        if state != READY or service is None:
            return JSONResponse({"status": state}, status_code=503)
        timeout = self.frontend.settings.health_generate_timeout_seconds
        if self._running is None:
            self._running = asyncio.ensure_future(service.probe(timeout))
            self._running.add_done_callback(self._done)
        try:
            # Shielded: a prober that leaves does not cancel the others' generation.
            seconds = await asyncio.shield(self._running)
        except Exception as exc:  # any failure of the engine to give a token is the verdict
            reason = f"no token within {timeout:g}s" if isinstance(exc, TimeoutError) else str(exc)
            log.warning("deep health probe failed: %s", reason)
            body = {"status": DEAD, "reason": reason}
            return JSONResponse(body, status_code=503, headers={STATE_HEADER: DEAD})
        return JSONResponse({"status": READY, "seconds": round(seconds, 4)})

    def _done(self, task: asyncio.Future[float]) -> None:
        self._running = None
        if not task.cancelled():
            task.exception()  # retrieved: a failure is reported to its probers, not the loop
