"""The engine watchdog: a hung engine is noticed, and the pod is replaced.

An engine that stops making progress while requests wait (a SIGSTOPped or wedged engine
process, a step blocked in a slow compile, a TensorRT-LLM executor whose responses and
stats stopped arriving) is still "healthy" by `is_healthy()`: its thread or process is
alive. Every engine reports `stalled_for()` (`engines/base.py`): seconds without progress
while it had work pending. The watchdog reads it:

- past `engine_stall_unready_seconds` readiness answers 503 (`stall()` returns the reason),
  so the Service sends no new requests here; it comes back on its own if the engine
  moves again;
- past `engine_stall_exit_seconds` a thread of its own logs one line with the reason,
  stops the engine (bounded: a wedged engine may not stop) and ends the process with
  status 1, so Kubernetes restarts the container. It cannot go through the drain: the
  in-flight requests wait on the very engine that hangs.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from mistral_serving.engines.base import Engine
from mistral_serving.ops.shutdown import exit_now

log = logging.getLogger(__name__)

EXIT_STATUS = 1
ENGINE_STOP_S = 10.0  # how long the exit waits for the hung engine to stop


def _exit_process(engine: Engine, reason: str) -> None:
    """Stop the engine (at most ENGINE_STOP_S), log the reason as the last line, exit 1."""
    stopper = threading.Thread(target=engine.shutdown, name="watchdog-engine-stop", daemon=True)
    stopper.start()
    stopper.join(ENGINE_STOP_S)
    exit_now(EXIT_STATUS, reason)


class Watchdog:
    def __init__(
        self,
        engine: Engine,
        unready_s: float,
        exit_s: float,
        exit_fn: Callable[[Engine, str], None] = _exit_process,
    ) -> None:
        self.engine = engine
        self.unready_s = unready_s
        self.exit_s = exit_s
        self._exit_fn = exit_fn
        # Often enough to act within a quarter of the shorter limit, at most once a second.
        self.poll_s = min(1.0, unready_s / 4, exit_s / 4)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._unready_logged = False

    def stall(self) -> str | None:
        """Why readiness must fail now (the engine stalled past the first limit), or None."""
        stalled = self.engine.stalled_for()
        if stalled < self.unready_s:
            return None
        return (
            f"the engine made no progress for {stalled:.1f}s with requests pending "
            f"(engine_stall_unready_seconds={self.unready_s:g})"
        )

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="engine-watchdog", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            stalled = self.engine.stalled_for()
            if stalled >= self.exit_s:
                reason = (
                    f"engine stalled: no progress for {stalled:.1f}s with requests pending "
                    f"(engine_stall_exit_seconds={self.exit_s:g}); exiting with status "
                    f"{EXIT_STATUS} so that the container is replaced"
                )
                self._exit_fn(self.engine, reason)
                return
            if stalled >= self.unready_s and not self._unready_logged:
                self._unready_logged = True
                log.warning("%s: readiness fails until it moves again", self.stall() or "stalled")
            elif stalled < self.unready_s and self._unready_logged:
                self._unready_logged = False
                log.warning("the engine makes progress again: readiness restored")
