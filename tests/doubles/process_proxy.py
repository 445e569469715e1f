"""The engine-process proxy (`ProcessEngine`) over a socket pair, with a stand-in child:
the tests play the child's side of the pipe themselves."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager
from multiprocessing.connection import Connection

from mistral_gpu_fallback.process import ipc
from mistral_gpu_fallback.process.client import ProcessEngine
from mistral_serving.engines.base import EngineLimits


class FakeProc:
    """Stands in for the child's Popen: alive until killed."""

    pid = 12345
    returncode: int | None = None

    def poll(self) -> int | None:
        return self.returncode

    def kill(self) -> None:
        self.returncode = -9

    def wait(self, timeout: float | None = None) -> int | None:
        return self.returncode


@contextmanager
def process_proxy(limits: EngineLimits) -> Iterator[tuple[ProcessEngine, Connection, FakeProc]]:
    """A proxy that believes its child is ready, the child's end of the pipe, the process."""
    ours, theirs = socket.socketpair()
    proc = FakeProc()
    ready = ipc.Ready(limits, "pytorch", {}, 2, 100)
    engine = ProcessEngine(proc, Connection(ours.detach()), ready)  # type: ignore[arg-type]
    child = Connection(theirs.detach())
    try:
        yield engine, child, proc
    finally:
        child.close()
        engine.shutdown()
