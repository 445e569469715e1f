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

import gc
import logging
import time
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


def time_collections(histogram: Histogram) -> None:
    """Observe every collection's duration, labelled by generation (0, 1, 2)."""
    if id(histogram) in _timed:
        return
    _timed.add(id(histogram))
    by_generation = [histogram.labels(str(g)) for g in range(3)]
    started = 0.0

    def callback(phase: str, info: dict[str, Any]) -> None:
        nonlocal started
        if phase == "start":
            started = time.perf_counter()
        else:
            by_generation[info["generation"]].observe(time.perf_counter() - started)

    gc.callbacks.append(callback)
