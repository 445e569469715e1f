"""The real server with probes, for bench/burst_ttft.py (run in the app folder in place of
`python -m mistral_serving.http.server`): each finished request's record times, and the
engine's admission groups (the replay engine's steps that carried a first token, the
static engine's prefills: when, how many prompts, how long), as JSON lines appended to
$BURST_PROBE_OUT. Nothing else changes; the times are time.monotonic() (CLOCK_MONOTONIC,
the clock the client's perf_counter reads on Linux)."""

from __future__ import annotations

import json
import os
import runpy
import sys
import threading
import time
from typing import Any

OUT = open(os.environ["BURST_PROBE_OUT"], "a", buffering=1)  # noqa: SIM115 - the process's
LOCK = threading.Lock()
TIMES = ("arrived_at", "parsed_at", "admitted_at", "submitted_at", "first_token_at",
         "stream_started_at", "ended_at")  # fmt: skip


def write(row: dict) -> None:
    with LOCK:
        OUT.write(json.dumps(row) + "\n")


def probe_records() -> None:
    from mistral_serving.ops import telemetry

    real = telemetry.Telemetry.finished

    def finished(self: Any, record: Any, ending: Any, prompt: str | None = None) -> None:
        real(self, record, ending, prompt)
        write({"probe": "request", "id": record.request_id, "route": record.route,
               "finish": record.finish_reason, **{k: getattr(record, k) for k in TIMES}})  # fmt: skip

    telemetry.Telemetry.finished = finished  # type: ignore[method-assign]


def probe_replay() -> None:
    """Each replay step that delivered some request's first token: when, and how many."""
    import weakref

    from mistral_gpu_fallback import replay

    real = replay.deliver
    seen: weakref.WeakSet = weakref.WeakSet()  # the queues (one per request) served before

    def deliver(items: list) -> None:
        firsts = 0
        for _, queue, _ in items:
            if queue not in seen:
                seen.add(queue)
                firsts += 1
        if firsts:
            write({"probe": "group", "engine": "replay", "at": time.monotonic(), "prompts": firsts})
        real(items)

    replay.deliver = deliver


def probe_static() -> None:
    """Each prefill of the static (GPU) engine: when it started, its prompts, its time."""
    from mistral_gpu_fallback.static import engine

    real = engine.StaticTorchEngine._prefill_rows

    def prefill_rows(self: Any, seqs: list) -> None:
        t0 = time.monotonic()
        real(self, seqs)
        write({"probe": "group", "engine": "static", "at": t0, "prompts": len(seqs),
               "seconds": time.monotonic() - t0,
               "tokens": sum(len(s.prompt) for s in seqs)})  # fmt: skip

    engine.StaticTorchEngine._prefill_rows = prefill_rows  # type: ignore[method-assign]


if __name__ == "__main__":
    sys.path[0] = os.getcwd()  # as `python -m` would: the app folder (truss_server) first
    probe_records()
    # The static engine's module imports torch: probed only when it may serve.
    probe_replay() if os.environ.get("MTT_ENGINE") == "replay" else probe_static()
    runpy.run_module("mistral_serving.http.server", run_name="__main__", alter_sys=True)
