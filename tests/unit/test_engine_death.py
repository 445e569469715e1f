"""A dead engine takes the process down (through the drain) so Kubernetes restarts it."""

from __future__ import annotations

import asyncio
import signal

from mistral_serving import shutdown
from mistral_serving.shutdown import Drainer


def test_engine_death_sends_sigterm_once_and_drains(monkeypatch):
    kills: list[tuple[int, int]] = []
    monkeypatch.setattr(shutdown.os, "kill", lambda pid, sig: kills.append((pid, sig)))
    stopped: list[bool] = []

    async def main() -> None:
        drainer = Drainer(0.01, lambda: stopped.append(True), lambda: 0)
        drainer.engine_died()
        drainer.engine_died()  # readiness probes keep asking: one shutdown only
        await asyncio.sleep(0.05)
        assert drainer.draining

    asyncio.run(main())
    assert [sig for _, sig in kills] == [signal.SIGTERM]
    assert stopped == [True]
