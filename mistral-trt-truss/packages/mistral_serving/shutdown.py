"""Graceful shutdown: on SIGTERM stop admitting, let in-flight requests finish for up to
`drain_grace_seconds`, then abort what is left so the server can exit.

uvicorn (under the Truss server) handles SIGTERM by closing its listener and waiting for
open responses (Truss allows 3600 s), so without this a long stream would hold the pod
until Kubernetes' SIGKILL. We chain in front of uvicorn's handler.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)


class Drainer:
    def __init__(
        self, grace_seconds: float, stop_admitting: Callable[[], None], abort_all: Callable[[], int]
    ) -> None:
        self.grace_seconds = grace_seconds
        self._stop_admitting = stop_admitting
        self._abort_all = abort_all
        self.draining = False
        self._installed = False

    def install(self) -> None:
        """Chain our SIGTERM handler before the current one (uvicorn's). Must run on the
        main thread with the server's event loop running (signal handlers live there)."""
        if self._installed or threading.current_thread() is not threading.main_thread():
            return
        loop = asyncio.get_running_loop()
        previous = signal.getsignal(signal.SIGTERM)

        def on_sigterm(signum: int, frame: object) -> None:
            loop.call_soon_threadsafe(self.begin)
            if callable(previous):
                previous(signum, frame)

        signal.signal(signal.SIGTERM, on_sigterm)
        self._installed = True

    def begin(self) -> None:
        """Start draining (idempotent); call on the event loop."""
        if self.draining:
            return
        self.draining = True
        self._stop_admitting()
        log.info("SIGTERM: draining; in-flight requests have %.0fs to finish", self.grace_seconds)
        asyncio.get_running_loop().call_later(self.grace_seconds, self._grace_over)

    def engine_died(self) -> None:
        """The engine can no longer serve: stop the process (through the same drain) so
        that Kubernetes restarts the container; an unready pod would otherwise stay up,
        serving nothing, until someone notices."""
        if self.draining:
            return
        log.error("the engine is dead: shutting down so that the container is restarted")
        os.kill(os.getpid(), signal.SIGTERM)
        self.begin()

    def _grace_over(self) -> None:
        aborted = self._abort_all()
        if aborted:
            log.warning("drain grace period over: aborted %d unfinished requests", aborted)
