"""Graceful shutdown, and the two ways the server ends at once.

On SIGTERM stop admitting (readiness and /health go false at once, new requests get a
503 that says `draining`), let in-flight requests finish for up to `drain_grace_seconds`,
then abort what is left so the server can exit.

uvicorn (under the Truss server) handles SIGTERM by closing its listener and waiting for
open responses (Truss allows 3600 s), so without this a long stream would hold the pod
until Kubernetes' SIGKILL. We chain in front of uvicorn's handler, and call it only
`drain_listen_seconds` later: until then the listener stays open, so a probe or a request
a load balancer sent before it saw the pod go sees `draining` instead of a refused
connection (as the router's own endpoint picker drains: NotServing at once, serving on).

`exit_now` ends the process with a status and one reason as the last log line (the
watchdog's exit and a failed load use it); `exit_if_load_fails` makes a failed load do so
before Truss can see it fail (see there).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

log = logging.getLogger(__name__)


Handler = Callable[[int, FrameType | None], Any]


class Drainer:
    def __init__(
        self,
        grace_seconds: float,
        stop_admitting: Callable[[], None],
        abort_all: Callable[[], int],
        listen_seconds: float = 0.0,
    ) -> None:
        self.grace_seconds = grace_seconds
        # The listener's close waits this long after SIGTERM (never past the grace period).
        self.listen_seconds = min(listen_seconds, grace_seconds)
        self._stop_admitting = stop_admitting
        self._abort_all = abort_all
        self.draining = False
        self._installed = False
        self._signalled = False
        self._closed = False
        self._close_now = False  # a dead engine: nothing to wait for

    def install(self) -> None:
        """Chain our SIGTERM handler before the current one (uvicorn's). Must run on the
        main thread with the server's event loop running (signal handlers live there)."""
        if self._installed or threading.current_thread() is not threading.main_thread():
            return
        loop = asyncio.get_running_loop()
        previous = signal.getsignal(signal.SIGTERM)
        chained: Handler | None = previous if callable(previous) else None

        def on_sigterm(signum: int, frame: FrameType | None) -> None:
            loop.call_soon_threadsafe(self.begin)
            if chained is None:
                return
            # A second SIGTERM, or a dead engine's, closes at once.
            wait = 0.0 if self._signalled or self._close_now else self.listen_seconds
            self._signalled = True
            if wait <= 0:
                self._close(chained, signum, frame)
            else:
                loop.call_soon_threadsafe(
                    loop.call_later, wait, self._close, chained, signum, frame
                )

        signal.signal(signal.SIGTERM, on_sigterm)
        self._installed = True

    def _close(self, chained: Handler, signum: int, frame: FrameType | None) -> None:
        """The previous handler (uvicorn's: the listener closes), once."""
        if not self._closed:
            self._closed = True
            chained(signum, frame)

    def begin(self) -> None:
        """Start draining (idempotent); call on the event loop."""
        if self.draining:
            return
        self.draining = True
        self._stop_admitting()
        log.info(
            "SIGTERM: draining (unready); in-flight requests have %.0fs to finish, the "
            "listener closes in %.0fs",
            self.grace_seconds,
            0 if self._close_now else self.listen_seconds,
        )
        asyncio.get_running_loop().call_later(self.grace_seconds, self._grace_over)

    def engine_died(self) -> None:
        """The engine can no longer serve: stop the process (through the same drain) so
        that Kubernetes restarts the container; an unready pod would otherwise stay up,
        serving nothing, until someone notices."""
        if self.draining:
            return
        log.error("the engine is dead: shutting down so that the container is restarted")
        self._close_now = True
        os.kill(os.getpid(), signal.SIGTERM)
        self.begin()

    def _grace_over(self) -> None:
        aborted = self._abort_all()
        if aborted:
            log.warning("drain grace period over: aborted %d unfinished requests", aborted)


LOAD_FAILED_STATUS = 1


def exit_now(status: int, reason: str) -> None:
    """Log `reason` as the process's last line and end it with `status`, now: no drain,
    no lifespan shutdown (what would run them waits on what failed).

    No other thread's line may follow the reason: logging is disabled first, then every
    handler's lock is taken and kept (a thread already past the level check blocks on it
    until the process ends), and only then is the reason written."""
    record = log.makeRecord(log.name, logging.ERROR, __file__, 0, "%s", (reason,), None)
    logging.disable(logging.CRITICAL)
    handlers = _all_handlers()
    for handler in handlers:
        handler.acquire()  # never released: the process ends below
    for handler in _handlers_of(log):
        if record.levelno >= handler.level:
            handler.emit(record)
    for handler in handlers:
        handler.flush()
    os._exit(status)


def _handlers_of(logger: logging.Logger) -> list[logging.Handler]:
    """The handlers a record on `logger` reaches, as `Logger.callHandlers` walks them."""
    found: list[logging.Handler] = []
    current: logging.Logger | None = logger
    while current is not None:
        found.extend(current.handlers)
        current = current.parent if current.propagate else None
    return found


def _all_handlers() -> list[logging.Handler]:
    """Every handler on the root logger and on any named logger, each once."""
    loggers = [logging.getLogger()] + [
        item
        for item in logging.Logger.manager.loggerDict.values()
        if isinstance(item, logging.Logger)
    ]
    seen: dict[int, logging.Handler] = {}
    for logger in loggers:
        for handler in logger.handlers:
            seen.setdefault(id(handler), handler)
    return list(seen.values())


def exit_if_load_fails(
    model_wrapper: Any,
    reason: Callable[[BaseException], str],
    expected: tuple[type[BaseException], ...] = (),
) -> None:
    """Truss 0.18.36's `ModelWrapper.load` marks a failed load FAILED, and any readiness or
    liveness probe that lands then (`BasetenEndpoints.check_healthy`, for
    `/v1/models/{name}`, `/loaded` and `/ping`) SIGKILLs the process (exit 137, the
    traceback last) before Truss's own `_shutdown_if_load_fails` poll (every 0.5 s) stops
    the server. So the load thread exits first: `_load_impl` (Truss's retries included)
    is wrapped, and on failure the process logs the traceback (unless the failure is one
    of the `expected` refusals, whose reason says it all), then "load failed: <why>", and
    exits with status 1 while the status still says LOADING (probes get 503)."""
    load_impl = model_wrapper._load_impl

    def load_or_exit() -> None:
        try:
            load_impl()
        except Exception as exc:  # noqa: BLE001 - every failure ends the process the same way
            if not _raised_from(exc, expected):
                log.exception("Exception while loading model")
            exit_now(LOAD_FAILED_STATUS, f"load failed: {reason(exc)}")

    model_wrapper._load_impl = load_or_exit


def _raised_from(exc: BaseException, kinds: tuple[type[BaseException], ...]) -> bool:
    """Whether `exc`, or an exception it was raised from (a retry wraps the cause), is
    one of `kinds`."""
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            return False
        if isinstance(seen, kinds):
            return True
        seen = seen.__cause__ or seen.__context__
    return False
