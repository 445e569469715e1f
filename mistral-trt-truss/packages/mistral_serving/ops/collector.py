"""Python's garbage collector in a serving process.

A full collection stops the whole process (the event loop and the engine thread wait on
the GIL) for as long as it takes to walk every tracked object, and after loading a model
server most of those objects are imports and module state that will never be garbage.
`freeze_loaded_objects()` moves them out of the collector's sight once loading is done (as
vLLM's server does), so later collections walk only what requests allocate;
`time_collections()` puts every pause into a histogram, so a stall at a burst of arrivals
shows up in `/metrics` instead of only in a profiler.
"""

from __future__ import annotations

import collections
import gc
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from prometheus_client import Histogram

log = logging.getLogger(__name__)

_timed: set[int] = set()  # ids of histograms already fed, so a second call adds nothing


def freeze_loaded_objects() -> int:
    """Collect once, then exclude every surviving object from later collections.
    Returns how many objects were frozen."""
    started = time.perf_counter()
    gc.collect()
    gc.freeze()
    frozen = gc.get_freeze_count()
    log.info("gc: %d objects frozen after loading (%.2f s)", frozen, time.perf_counter() - started)
    return frozen


def thaw_loaded_objects() -> None:
    """Undo `freeze_loaded_objects` once the engine has shut down: frozen objects are never
    collected, so at interpreter exit nanobind (triton's bindings, which torch imports)
    reports each of its types, functions and instances as leaked (~100 lines)."""
    gc.unfreeze()


FLUSH_S = 0.5  # how often the pauses noted are put into the histogram


def time_collections(histogram: Histogram) -> Callable[[], None]:
    """Observe every collection's duration, labelled by generation (0, 1, 2). Returns
    the flush (a thread of its own calls it every FLUSH_S).

    The collector's callback only notes the pause: a collection can start inside any
    allocation, also one made while a metric's lock is held (with several front-end
    processes prometheus_client's values share one lock, and it is not reentrant), so
    observing there could wait on that lock for ever."""
    if id(histogram) in _timed:
        return lambda: None
    _timed.add(id(histogram))
    by_generation = [histogram.labels(str(g)) for g in range(3)]
    noted: collections.deque[tuple[int, float]] = collections.deque(maxlen=100_000)
    started = 0.0

    def callback(phase: str, info: dict[str, Any]) -> None:
        nonlocal started
        if phase == "start":
            started = time.perf_counter()
        else:
            noted.append((info["generation"], time.perf_counter() - started))

    def flush() -> None:
        while noted:
            generation, seconds = noted.popleft()
            by_generation[generation].observe(seconds)

    def flush_often() -> None:
        while True:
            time.sleep(FLUSH_S)
            flush()

    gc.callbacks.append(callback)
    threading.Thread(target=flush_often, name="gc-pauses", daemon=True).start()
    return flush
