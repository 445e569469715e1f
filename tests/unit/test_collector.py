"""collector.py: the objects loading made are frozen out of later collections, and every
collection's pause lands in the histogram, by generation, once per histogram."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry

from mistral_serving.ops.collector import freeze_loaded_objects, time_collections
from mistral_serving.ops.metrics import Metrics


@pytest.fixture
def quiet_gc() -> Iterator[None]:
    """Only the test's own collections run (no automatic ones to miscount), and the
    callbacks it adds are removed afterwards."""
    before = list(gc.callbacks)
    was_enabled = gc.isenabled()
    gc.disable()
    yield
    gc.callbacks[:] = before
    if was_enabled:
        gc.enable()


def count(metrics: Metrics, generation: int) -> float:
    """How many pauses of this generation the histogram holds."""
    counts = {
        s.labels["generation"]: s.value
        for m in metrics.gc_pause.collect()
        for s in m.samples
        if s.name.endswith("_count")
    }
    return counts.get(str(generation), 0.0)


def test_every_collection_is_timed_by_generation(quiet_gc: None) -> None:
    metrics = Metrics(CollectorRegistry())
    flush = time_collections(metrics.gc_pause)
    flush()
    counts = [count(metrics, g) for g in range(3)]
    gc.collect(0)
    gc.collect(2)
    flush()
    assert count(metrics, 0) >= counts[0] + 1
    assert count(metrics, 2) == counts[2] + 1


def test_a_collection_takes_no_metric_lock(quiet_gc: None) -> None:
    """A collection can start inside a metric update that holds its lock (one lock for all
    values in prometheus_client's multiprocess mode, not reentrant): the callback notes
    the pause and the histogram takes it later, never inside the collection."""
    metrics = Metrics(CollectorRegistry())
    flush = time_collections(metrics.gc_pause)
    flush()
    before = count(metrics, 2)
    values = metrics.gc_pause.labels("2")._sum._lock  # what an observe takes
    collecting = threading.Thread(target=gc.collect, args=(2,))
    with values:  # held, as by the code a collection interrupts
        collecting.start()
        collecting.join(60)  # a bound, not a measurement: it takes milliseconds
        assert not collecting.is_alive(), "the collection waited on a metric's lock"
    assert count(metrics, 2) == before
    flush()
    assert count(metrics, 2) == before + 1


def test_a_second_call_does_not_count_twice(quiet_gc: None) -> None:
    metrics = Metrics(CollectorRegistry())
    flush = time_collections(metrics.gc_pause)
    assert time_collections(metrics.gc_pause) is not flush
    flush()
    before = count(metrics, 2)
    gc.collect(2)
    flush()
    assert count(metrics, 2) == before + 1


def test_loaded_objects_are_frozen_and_new_garbage_is_still_collected(quiet_gc: None) -> None:
    class Node:
        pass

    survivor = Node()
    survivor.me = survivor  # a cycle that is still referenced
    try:
        frozen = freeze_loaded_objects()
        assert frozen == gc.get_freeze_count() > 0
        assert gc.is_tracked(survivor)
        garbage = Node()
        garbage.me = garbage
        del garbage
        assert gc.collect() >= 1  # the new cycle: later collections still work
    finally:
        gc.unfreeze()
