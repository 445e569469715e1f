"""Admission control: a bounded number of requests in the engine and a bounded queue.

Past both bounds a request is refused at once (503 with Retry-After: this replica is
saturated) instead of queueing without limit; a waiting request whose client left is
dropped; while draining (SIGTERM) new requests are refused with 503. Slots are handed to
waiters by priority (higher first: the gateway's objective, `objective_priorities`), and
in arrival order within one priority.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
from collections.abc import Awaitable, Callable

from mistral_serving.ops.metrics import Metrics

RETRY_AFTER_SECONDS = 1


class Overloaded(Exception):
    """All slots and queue places are taken."""


class Draining(Exception):
    """The server is shutting down and takes no new requests."""


class ClientGone(Exception):
    """The client disconnected while waiting for a slot."""


class Ticket:
    """One held slot; `release()` may be called any number of times."""

    def __init__(self, admission: Admission) -> None:
        self._admission = admission
        self._held = True

    def release(self) -> None:
        if self._held:
            self._held = False
            self._admission._release()


class Admission:
    def __init__(self, max_inflight: int, max_waiting: int, metrics: Metrics) -> None:
        self.max_inflight = max_inflight
        self.max_waiting = max_waiting
        self._metrics = metrics
        self._inflight = 0
        # (-priority, arrival, future), sorted: the first is served next.
        self._waiters: list[tuple[int, int, asyncio.Future[None]]] = []
        self._arrivals = itertools.count()
        self.draining = False

    @property
    def inflight(self) -> int:
        return self._inflight

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    @property
    def full(self) -> bool:
        """No slot free and no queue place: `acquire` would refuse at once."""
        busy = self._inflight >= self.max_inflight or bool(self._waiters)
        return busy and len(self._waiters) >= self.max_waiting

    def refusal(self) -> Draining | Overloaded | None:
        """Why a new request would be refused at once (counted in `rejected`), or None:
        the one rule for `acquire` and for refusals decided before a body is read."""
        if self.draining:
            self._metrics.rejected.labels("draining").inc()
            return Draining()
        if self.full:
            self._metrics.rejected.labels("queue_full").inc()
            return Overloaded()
        return None

    async def acquire(
        self,
        is_disconnected: Callable[[], Awaitable[bool]] | None = None,
        poll_s: float = 0.5,
        priority: int = 0,
    ) -> Ticket:
        if (refused := self.refusal()) is not None:
            raise refused
        if self._inflight < self.max_inflight and not self._waiters:
            self._take()
            return Ticket(self)
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (-priority, next(self._arrivals), waiter)
        bisect.insort(self._waiters, entry, key=lambda e: e[:2])
        self._metrics.waiting.set(len(self._waiters))
        try:
            while True:
                done, _ = await asyncio.wait({waiter}, timeout=poll_s)
                if done:
                    return Ticket(self)  # _release handed us its slot
                if is_disconnected is not None and await is_disconnected():
                    raise ClientGone
                if self.draining:
                    self._metrics.rejected.labels("draining").inc()
                    raise Draining
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self._release()  # we were handed a slot but will not use it
            else:
                waiter.cancel()
                self._waiters.remove(entry)
            raise
        finally:
            self._metrics.waiting.set(len(self._waiters))

    def _take(self) -> None:
        self._inflight += 1
        self._metrics.running.set(self._inflight)

    def _release(self) -> None:
        while self._waiters:  # hand the slot straight to the next waiter
            _, _, waiter = self._waiters.pop(0)
            if not waiter.done():
                waiter.set_result(None)
                self._metrics.waiting.set(len(self._waiters))
                return
        self._inflight -= 1
        self._metrics.running.set(self._inflight)
