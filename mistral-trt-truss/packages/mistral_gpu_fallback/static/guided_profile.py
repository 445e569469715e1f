"""Where a structured-output step's time goes, for benchmarks. Off unless the environment
variable GUIDED_PROFILE_OUT names a file: without it the engine takes no timer and records
no event.

The static engine adds to it (seconds and counts, cumulative since the engine started):

- `fill`: xgrammar's batched bitmask fill for a step's constrained rows (host CPU; on a
  GPU it runs while the forward pass computes, until the logits are needed);
- `h2d`: the bitmask's copy to the device; `apply`: the masking kernel (CUDA events on a
  GPU, so the device's own time; the host clock elsewhere);
- `rowmask`: the per-row masks of constrained rows the batched path leaves to the sampler
  (`fallback_rows` counts them: logprobs, `min_tokens` pending, a failed batched fill);
- `accept`: the grammar state's advance, every constrained row's `accept_token`;
- `sample`: the rest of the step's sampling and delivery (on a GPU this includes waiting
  for the forward pass: the first host read of the logits);
- `step_constrained` / `step_plain`: each decode step's wall time, by whether its batch
  holds a constrained row (`rows_*` sums the rows, for the mean batch), and
  `steps_overlap_lost`: constrained steps that could not overlap the next step's launch
  with this one's host work (overlap_decode needs every row plain greedy).

It writes the totals as JSON to the file (atomically) at most every `INTERVAL` seconds
and whenever the batch empties: a benchmark reads it before and after a load and takes
the difference (bench/gpu/structured.py).
"""

from __future__ import annotations

import json
import os
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

ENV = "GUIDED_PROFILE_OUT"
INTERVAL = 0.2  # seconds between writes while steps run


class GuidedProfile:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.seconds: dict[str, float] = defaultdict(float)
        self.counts: dict[str, int] = defaultdict(int)
        self._pending: list[tuple[str, Any, Any]] = []  # CUDA (name, start, end) events
        self._written = 0.0

    def add(self, name: str, seconds: float, n: int = 1) -> None:
        self.seconds[name] += seconds
        self.counts[name] += n

    def count(self, name: str, n: int = 1) -> None:
        self.counts[name] += n

    @contextmanager
    def span(self, name: str, device: torch.device) -> Iterator[None]:
        """Time the work launched inside: the device's time on a GPU (events, read later,
        never waited for), else the host's."""
        if device.type == "cuda":
            start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            start.record()
            yield
            end.record()
            self._pending.append((name, start, end))
            return
        t0 = time.perf_counter()
        yield
        self.add(name, time.perf_counter() - t0)

    def timed(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        """`fn`, adding each call's host time to `name`."""

        def call(*args: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args)
            finally:
                self.add(name, time.perf_counter() - t0)

        return call

    def flush(self, force: bool = False) -> None:
        now = time.perf_counter()
        if not force and now - self._written < INTERVAL:
            return
        self._written = now
        waiting = []
        for name, start, end in self._pending:
            if force:
                end.synchronize()  # the batch is empty: nothing waits on this
            if end.query():
                self.add(name, start.elapsed_time(end) / 1e3)
            else:
                waiting.append((name, start, end))
        self._pending = waiting
        state = {"pid": os.getpid(), "seconds": dict(self.seconds), "counts": dict(self.counts)}
        tmp = self.path.with_name(self.path.name + f".{os.getpid()}.tmp")
        try:
            tmp.write_text(json.dumps(state))
            tmp.replace(self.path)
        except OSError:
            pass  # a benchmark's figure, never the engine's failure


def from_env() -> GuidedProfile | None:
    path = os.environ.get(ENV)
    return GuidedProfile(Path(path)) if path else None
