"""Admission: bounded slots and queue, FIFO hand-off, idempotent release, refusals
(Overloaded / Draining / ClientGone), and the running / waiting gauges."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import CollectorRegistry

from mistral_serving.generation.admission import Admission, ClientGone, Draining, Overloaded, Ticket
from mistral_serving.ops.metrics import Metrics

POLL = 0.01


def make(max_inflight: int, max_waiting: int) -> tuple[Admission, CollectorRegistry]:
    registry = CollectorRegistry()
    return Admission(max_inflight, max_waiting, Metrics(registry)), registry


def gauge(registry: CollectorRegistry, name: str) -> float | None:
    return registry.get_sample_value(f"mtt:num_requests_{name}")


def rejected(registry: CollectorRegistry, reason: str) -> float:
    return registry.get_sample_value("mtt:request_rejected_total", {"reason": reason}) or 0.0


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_acquire_and_release_track_running() -> None:
    adm, reg = make(2, 0)

    async def main() -> None:
        a = await adm.acquire()
        b = await adm.acquire()
        assert isinstance(a, Ticket)
        assert (adm.inflight, gauge(reg, "running")) == (2, 2)
        a.release()
        assert (adm.inflight, gauge(reg, "running")) == (1, 1)
        b.release()
        assert (adm.inflight, gauge(reg, "running")) == (0, 0)

    asyncio.run(main())


def test_release_is_idempotent() -> None:
    adm, reg = make(1, 4)

    async def main() -> None:
        t = await adm.acquire()
        t.release()
        t.release()
        assert adm.inflight == 0  # not -1
        assert gauge(reg, "running") == 0
        # A double release must not hand a second slot out either.
        held = await adm.acquire()
        waiter = asyncio.ensure_future(adm.acquire(poll_s=POLL))
        await settle()
        t.release()
        await asyncio.sleep(3 * POLL)
        assert not waiter.done()
        assert adm.inflight == 1
        held.release()
        (await waiter).release()
        assert adm.inflight == 0

    asyncio.run(main())


def test_full_slots_and_queue_are_overloaded() -> None:
    adm, reg = make(1, 1)

    async def main() -> None:
        held = await adm.acquire()
        waiter = asyncio.ensure_future(adm.acquire(poll_s=POLL))
        await settle()
        assert (adm.waiting, gauge(reg, "waiting")) == (1, 1)
        with pytest.raises(Overloaded):
            await adm.acquire()
        assert rejected(reg, "queue_full") == 1
        held.release()
        (await waiter).release()

    asyncio.run(main())


def test_no_queue_refuses_at_once() -> None:
    adm, reg = make(1, 0)

    async def main() -> None:
        held = await adm.acquire()
        with pytest.raises(Overloaded):
            await adm.acquire()
        held.release()
        (await adm.acquire()).release()

    asyncio.run(main())
    assert rejected(reg, "queue_full") == 1


def test_slots_are_handed_to_waiters_in_arrival_order() -> None:
    adm, reg = make(1, 5)
    order: list[int] = []

    async def worker(i: int) -> None:
        ticket = await adm.acquire(poll_s=POLL)
        order.append(i)
        await asyncio.sleep(0.005)
        ticket.release()

    async def main() -> None:
        held = await adm.acquire()
        tasks = []
        for i in range(4):
            tasks.append(asyncio.ensure_future(worker(i)))
            await settle()
        assert (adm.waiting, gauge(reg, "waiting")) == (4, 4)
        held.release()
        # The slot went straight to the first waiter: still one in flight, not zero.
        assert adm.inflight == 1
        await asyncio.gather(*tasks)

    asyncio.run(main())
    assert order == [0, 1, 2, 3]
    assert adm.inflight == 0
    assert (gauge(reg, "running"), gauge(reg, "waiting")) == (0, 0)


def test_newcomer_does_not_jump_the_queue() -> None:
    adm, _ = make(1, 5)

    async def main() -> None:
        held = await adm.acquire()
        first = asyncio.ensure_future(adm.acquire(poll_s=POLL))
        await settle()
        held.release()  # handed to `first`, which has not resumed yet
        late = asyncio.ensure_future(adm.acquire(poll_s=POLL))
        ticket = await first
        await settle()
        assert not late.done()
        ticket.release()
        (await late).release()
        assert adm.inflight == 0

    asyncio.run(main())


def test_draining_refuses_new_and_waiting_requests() -> None:
    adm, reg = make(1, 5)

    async def main() -> None:
        held = await adm.acquire()
        waiter = asyncio.ensure_future(adm.acquire(poll_s=POLL))
        await settle()
        adm.draining = True
        with pytest.raises(Draining):
            await adm.acquire()
        with pytest.raises(Draining):
            await asyncio.wait_for(waiter, 60)
        assert (adm.waiting, gauge(reg, "waiting")) == (0, 0)
        held.release()
        assert adm.inflight == 0

    asyncio.run(main())
    assert rejected(reg, "draining") == 2  # the new request and the dropped waiter


def test_waiting_client_that_leaves_is_dropped() -> None:
    adm, reg = make(1, 5)
    gone = False

    async def is_disconnected() -> bool:
        return gone

    async def main() -> None:
        nonlocal gone
        held = await adm.acquire()
        waiter = asyncio.ensure_future(adm.acquire(is_disconnected, poll_s=POLL))
        await asyncio.sleep(3 * POLL)
        assert not waiter.done()  # still connected: still waiting
        gone = True
        with pytest.raises(ClientGone):
            await asyncio.wait_for(waiter, 60)
        assert (adm.waiting, gauge(reg, "waiting")) == (0, 0)
        held.release()
        assert adm.inflight == 0  # nobody was handed the slot

    asyncio.run(main())


def test_cancelled_waiter_leaves_the_queue() -> None:
    adm, reg = make(1, 5)

    async def main() -> None:
        held = await adm.acquire()
        waiter = asyncio.ensure_future(adm.acquire(poll_s=POLL))
        await settle()
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert (adm.waiting, gauge(reg, "waiting")) == (0, 0)
        held.release()
        assert (adm.inflight, gauge(reg, "running")) == (0, 0)

    asyncio.run(main())


def test_waiter_cancelled_after_hand_off_passes_the_slot_on() -> None:
    adm, _ = make(1, 5)

    async def main() -> None:
        held = await adm.acquire()
        a = asyncio.ensure_future(adm.acquire(poll_s=10))
        await settle()
        b = asyncio.ensure_future(adm.acquire(poll_s=10))
        await settle()
        held.release()  # hands the slot to `a` ...
        a.cancel()  # ... which is cancelled before it can take it
        with pytest.raises(asyncio.CancelledError):
            await a
        ticket = await asyncio.wait_for(b, 60)  # the slot went on to `b`, not lost
        assert adm.inflight == 1
        ticket.release()
        assert adm.inflight == 0

    asyncio.run(main())


def test_full_means_acquire_would_refuse_at_once() -> None:
    """`full` lets the frontend answer 503 before reading the body: it must agree with
    what `acquire` would do."""
    adm, _ = make(1, 1)

    async def main() -> None:
        assert not adm.full
        held = await adm.acquire()
        assert not adm.full  # a queue place is free
        waiter = asyncio.ensure_future(adm.acquire(poll_s=POLL))
        await settle()
        assert adm.full
        with pytest.raises(Overloaded):
            await adm.acquire()
        held.release()  # handed to the waiter: still one running, nobody waiting
        ticket = await waiter
        assert not adm.full
        ticket.release()

    asyncio.run(main())


def test_full_with_no_queue() -> None:
    adm, _ = make(2, 0)

    async def main() -> None:
        a = await adm.acquire()
        assert not adm.full
        b = await adm.acquire()
        assert adm.full
        a.release()
        assert not adm.full
        b.release()

    asyncio.run(main())
