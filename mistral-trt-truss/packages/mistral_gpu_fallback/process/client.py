"""The PyTorch engine in a process of its own: the server-side half (`ProcessEngine`).

Why: the PyTorch engine's step loop is Python (admission, sampling, bookkeeping) and the
server's event loop is Python (HTTP, detokenizing, SSE). In one process they share one
GIL, and under load the server's time to first token and throughput fall behind the
engine's (docs/performance.md). As in vLLM's engine core, the model and its step loop run
in a child process (`worker.py`) and the server keeps only this proxy. The messages are
the typed ones of `ipc.py` (msgspec Structs in MessagePack; nothing is pickled):

- `generate` sends an Add (key, request id, prompt ids, SamplingOptions) and reads the
  request's deltas from an asyncio queue, as the in-process engine's `generate` does.
- The child sends ONE Step per engine step holding every request's new token ids, finish
  reason, logprobs (prompt logprobs on a first step, when asked) or error. One reader
  thread here receives it and hands the whole step to each event loop with a single
  `call_soon_threadsafe` (`base.deliver`), so the event loop wakes once per step, not
  once per token.
- KV-cache usage and the running count ride on the Steps (and on a Gauges message when
  they change between steps); limits, info and the EOS id come once, in Ready.
- A request the child refuses (its prompt, its response_format schema) raises
  `EngineRequestError` from its stream; a request that fails in the engine raises
  `EngineError`; the other requests go on.
- Heartbeat: the child sends a Beat (with its engine's own `stalled_for`) every
  `ipc.HEARTBEAT_S`; every message heard counts as a sign of life. `stalled_for` here is
  the longer of the silence since the last message and the child's own report, while a
  request is pending: a SIGSTOPped or wedged child that says nothing is noticed too.
- If the child dies (a crash, an OOM kill, SIGKILL), every live request fails with
  `EngineError` and `is_healthy()` turns False: the frontend then drains and stops the
  server, and Kubernetes restarts the pod. So does a message that is not one of
  `ipc.FromEngine`: the child is killed rather than trusted further.
- `shutdown` asks the child to stop (its pending streams end with EngineError), waits,
  and kills it after `SHUTDOWN_TIMEOUT_S`.
- Shared by several front-ends (`sharing.py`): the owner starts the child as above, with
  a socket for the others; a guest (`ProcessEngine.join`) connects to it and has no child
  of its own: it sees the engine's end as the connection's end, and its `shutdown` only
  leaves (the engine serves on until the owner stops it).

The child is a fresh interpreter (`python -m mistral_gpu_fallback.process.worker`), which is
multiprocessing's `spawn` semantics (CUDA cannot be forked) without re-running the
server's `__main__` in the child. Its log lines go to the server's stderr, in its format
(JSON lines under Truss), prefixed `[engine process]`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from mistral_gpu_fallback.process import ipc
from mistral_gpu_fallback.process.ipc import HEARTBEAT_S
from mistral_gpu_fallback.process.sharing import SharedEngine
from mistral_serving.engines.base import (
    EngineError,
    EngineInfo,
    EngineLimits,
    EngineRequestError,
    Item,
    SamplingOptions,
    StreamQueue,
    TokenDelta,
    deliver,
    read_stream,
)
from mistral_serving.settings import GpuFallbackSettings, Settings, TorchEngineSettings

log = logging.getLogger(__name__)

SHUTDOWN_TIMEOUT_S = 30.0  # then the child is killed
SILENT_S = 4 * HEARTBEAT_S  # a child not heard from for this long is stopped or wedged
_POLL_S = 0.25  # how often a silent socket is checked for the child having exited
JOIN_TIMEOUT_S = 120.0  # a guest waits this long for the owner's engine process to listen
GUESTS_MARGIN_S = 10.0  # past the drain's grace, for guests to close their streams
_LEAVE_S = 5.0  # a guest that leaves waits this long for the engine process to let go


def wants_own_process(settings: GpuFallbackSettings) -> bool:
    """`engine_process: on` runs a PyTorch engine (or the replay engine, for benchmarks)
    in a process of its own. Off by default: on the H200 it served the same throughput as
    in-process and a later first token (docs/performance.md), so it is there for
    isolation, not speed."""
    return settings.engine_process == "on"


def open_process_engine(
    model_dir: Path, settings: Settings, eos_token_id: int, config: dict[str, Any] | None
) -> ProcessEngine:
    """The engine in its own process: started here, or, with several front-end processes
    (`sharing.py`), started here for the others to join (the owner) or joined (a guest)."""
    shared = SharedEngine.from_environ()
    if shared is None:
        return ProcessEngine.start(model_dir, settings, eos_token_id, config)
    if shared.role == "guest":
        return ProcessEngine.join(shared.address)
    wait_s = settings.drain_grace_seconds + GUESTS_MARGIN_S
    return ProcessEngine.start(model_dir, settings, eos_token_id, config, shared.address, wait_s)


def _child_env() -> dict[str, str]:
    """The server's environment, with its import path (the server may have extended
    sys.path at run time) so the child imports the same packages."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    return env


def _logs_json() -> bool:
    """Whether the server logs JSON lines (Truss does): the child then does too."""
    return any("json" in type(h.formatter).__name__.lower() for h in logging.getLogger().handlers)


def _exit_description(code: int | None) -> str:
    if code is None:
        return "has not exited"
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-code).name}"
        return f"was killed by signal {-code}"
    return f"exited with code {code}"


@dataclass(eq=False)
class _Stream:
    loop: asyncio.AbstractEventLoop
    queue: StreamQueue


class ProcessEngine:
    """The `Engine` interface over a PyTorch engine running in a child process."""

    def __init__(
        self,
        proc: subprocess.Popen[Any] | None,
        conn: Connection,
        ready: ipc.Ready,
        stop_wait_s: float = SHUTDOWN_TIMEOUT_S,
    ) -> None:
        self._proc = proc  # None: a guest, whose engine process is the owner's child
        self._conn = conn
        self._stop_wait_s = stop_wait_s
        self.limits: EngineLimits = ready.limits
        details: dict[str, object] = dict(ready.details)
        details["engine_process"] = proc.pid if proc else "shared"
        self.info = EngineInfo(ready.name, details)
        self.eos_token_id: int = ready.eos_token_id
        self._vocab = ready.vocab_size
        self._keys = itertools.count()
        self._lock = threading.Lock()  # the streams, the failure, closing
        self._send_lock = threading.Lock()  # sends from any event loop thread
        self._streams: dict[int, _Stream] = {}
        self._failure: str | None = None  # why the engine can no longer serve
        self._closing = False
        self._kv_usage = 0.0
        self._n_running = 0
        # Heartbeat (reader thread writes, anyone reads): when the child was last heard
        # from, and the stall its last "beat" reported (0.0 once a step arrives).
        self._heard_at = time.monotonic()
        self._child_stall = 0.0
        self._reader = threading.Thread(
            target=self._read, name="engine-process-reader", daemon=True
        )
        self._reader.start()

    @classmethod
    def start(
        cls,
        model_dir: Path,
        settings: TorchEngineSettings,
        eos_token_id: int,
        config: dict[str, Any] | None = None,
        guests_address: str | None = None,
        guests_wait_s: float = 0.0,
    ) -> ProcessEngine:
        """Start the child, have it load the engine, and wait until it is ready. A failure
        to load (a bad checkpoint, out of memory) raises one `EngineError` naming it.
        `config` is the checkpoint's config.json (the Artifact's): the child then reads
        none (without it, a bare directory, the child reads it). With `guests_address`
        the child also serves guest front-ends joining there, and a shutdown waits up to
        `guests_wait_s` for them to leave first."""
        ours, theirs = socket.socketpair()
        try:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "mistral_gpu_fallback.process.worker",
                    str(theirs.fileno()),
                ],
                pass_fds=[theirs.fileno()],
                stdin=subprocess.DEVNULL,
                env=_child_env(),
            )
        finally:
            theirs.close()  # the child holds its own copy; ours would hide its EOF
        conn = Connection(ours.detach())
        try:
            start = ipc.Start(
                model_dir=str(Path(model_dir).resolve()),
                settings_json=settings.model_dump_json(),
                eos_token_id=eos_token_id,
                log_level=logging.getLogger().getEffectiveLevel(),
                log_json=_logs_json(),
                config=config,
                guests_address=guests_address,
                guests_wait_s=guests_wait_s,
            )
            conn.send_bytes(ipc.encode(start))
            ready = cls._wait_ready(proc, conn)
        except BaseException:
            conn.close()
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            raise
        log.info("the engine runs in its own process (pid %d)", proc.pid)
        return cls(proc, conn, ready, SHUTDOWN_TIMEOUT_S + guests_wait_s)

    @classmethod
    def join(cls, address: str, timeout_s: float = JOIN_TIMEOUT_S) -> ProcessEngine:
        """Join the engine process another front-end (the owner) started, at `address`:
        wait up to `timeout_s` for its socket, then for its engine to be ready (as long
        as the load takes). Raises `EngineError` if it never listens or ends first."""
        deadline = time.monotonic() + timeout_s
        while True:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(address)
                break
            except (FileNotFoundError, ConnectionRefusedError) as exc:
                sock.close()
                if time.monotonic() >= deadline:
                    raise EngineError(
                        f"the shared engine process did not listen within {timeout_s:.0f}s "
                        f"({type(exc).__name__})"
                    ) from None
                time.sleep(0.1)
        conn = Connection(sock.detach())
        try:
            conn.send_bytes(ipc.encode(ipc.Join()))
            ready = cls._wait_ready(None, conn)
        except BaseException:
            conn.close()
            raise
        log.info("joined the shared engine process")
        return cls(None, conn, ready)

    @staticmethod
    def _wait_ready(proc: subprocess.Popen[Any] | None, conn: Connection) -> ipc.Ready:
        while True:
            try:
                if conn.poll(_POLL_S):
                    message = ipc.decode_from_engine(conn.recv_bytes())
                    if isinstance(message, ipc.Ready):
                        return message
                    why = (
                        message.describe()
                        if isinstance(message, ipc.Failed)
                        else f"it sent a {type(message).__name__.lower()} before it was ready"
                    )
                    raise EngineError(f"the engine process could not start: {why}")
                if proc is not None and proc.poll() is not None:
                    break  # it exited without a word (a descendant may hold its socket open)
            except (EOFError, OSError):  # it closed the socket without a word: it is exiting
                if proc is None:
                    raise EngineError(
                        "the shared engine process ended before it was ready "
                        "(the owner front-end's log says why)"
                    ) from None
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(SHUTDOWN_TIMEOUT_S)
                break
            except ipc.IpcError as exc:
                raise EngineError(f"the engine process could not start: {exc}") from None
        assert proc is not None  # a guest leaves the loop only by raising
        raise EngineError(
            f"the engine process {_exit_description(proc.returncode)} while loading "
            "(its log above says why)"
        )

    # ---- the Engine interface (event loop side) ----

    async def generate(
        self, request_id: str, prompt_ids: list[int], sampling: SamplingOptions
    ) -> AsyncIterator[TokenDelta]:
        queue: StreamQueue = asyncio.Queue()
        stream = _Stream(asyncio.get_running_loop(), queue)
        key = next(self._keys)
        with self._lock:
            if self._failure is not None or self._closing:
                raise EngineError(self._failure or "the engine shut down")
            self._streams[key] = stream
        finished = False
        try:
            self._send(ipc.Add(key, request_id, list(prompt_ids), sampling))
            async for delta in read_stream(stream.queue, "the engine process"):
                finished = delta.finish_reason is not None
                yield delta
        except (EngineError, EngineRequestError):
            finished = True  # the engine already let go of it
            raise
        finally:
            with self._lock:
                self._streams.pop(key, None)
            if not finished:  # the consumer went away (client disconnect): free the slot
                self.abort(request_id)

    def abort(self, request_id: str) -> None:
        with contextlib.suppress(EngineError):  # a dead engine holds no request anyway
            self._send(ipc.Abort(request_id))

    def is_healthy(self) -> bool:
        alive = self._proc is None or self._proc.poll() is None  # a guest: its reader tells
        return self._failure is None and not self._closing and alive

    def kv_cache_usage(self) -> float:
        return self._kv_usage

    def num_running(self) -> int:
        return self._n_running

    def stalled_for(self) -> float:
        if not self._streams or self._closing or self._failure is not None:
            return 0.0  # idle, or already known dead (is_healthy says so)
        silence = max(0.0, time.monotonic() - self._heard_at)
        reported = self._child_stall + silence if self._child_stall > 0 else 0.0
        return max(silence, reported)

    @property
    def vocab_size(self) -> int:
        """Rows of the model's embedding (may exceed the tokenizer's vocabulary)."""
        return self._vocab

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def shutdown(self) -> None:
        """Stop the child (pending streams end with EngineError) and wait for it; kill it
        if it has not exited in time (SHUTDOWN_TIMEOUT_S, plus the wait for guests of a
        shared engine). A guest only leaves. Safe to call again."""
        with self._lock:
            if self._closing:
                return
            self._closing = True
        proc = self._proc
        if proc is None:
            self._leave()
            return
        if time.monotonic() - self._heard_at > SILENT_S:
            # Stopped or wedged (no beat): it cannot read "shutdown"; waiting is pointless.
            log.warning("the engine process has been silent: killing it")
            proc.kill()
        with contextlib.suppress(EngineError):
            self._send(ipc.Shutdown())
        try:
            proc.wait(self._stop_wait_s)
        except subprocess.TimeoutExpired:
            log.warning("the engine process did not stop in %.0fs: killing it", self._stop_wait_s)
            proc.kill()
            proc.wait()
        self._reader.join(timeout=SHUTDOWN_TIMEOUT_S)  # it reads the child's last words
        self._fail_all("the engine shut down")
        if not self._reader.is_alive():
            self._conn.close()

    def _leave(self) -> None:
        """A guest's shutdown: say so, close the connection, end what is pending."""
        with contextlib.suppress(EngineError):
            self._send(ipc.Shutdown())
        self._reader.join(timeout=_LEAVE_S)  # the engine process closes its end: EOF
        with contextlib.suppress(OSError):
            self._conn.close()  # it did not: the reader sees the end at its next poll
        self._reader.join(timeout=SHUTDOWN_TIMEOUT_S)
        self._fail_all("the engine shut down")

    # ---- the reader thread ----

    def _send(self, message: ipc.ToEngine) -> None:
        with self._send_lock:  # sends come from any event loop thread; so does encoding
            try:
                data = ipc.encode(message)
            except (OverflowError, TypeError, ValueError) as exc:  # e.g. an int past 64 bits
                raise EngineError(f"cannot send this to the engine process: {exc!r}") from exc
            try:
                self._conn.send_bytes(data)
            except (OSError, ValueError) as exc:  # ValueError: closed by shutdown
                raise EngineError(self._failure or "the engine process is gone") from exc

    def _read(self) -> None:
        why = None
        try:
            while True:
                if not self._conn.poll(_POLL_S):
                    if self._proc is not None and self._proc.poll() is not None:
                        break  # exited, yet no EOF: a descendant holds its socket open
                    continue
                message = ipc.decode_from_engine(self._conn.recv_bytes())
                self._heard_at = time.monotonic()
                if isinstance(message, ipc.Step):
                    self._kv_usage, self._n_running = message.kv_cache_usage, message.num_running
                    self._child_stall = 0.0  # a step finished: progress
                    self._dispatch(message.events)
                elif isinstance(message, ipc.Beat):
                    self._child_stall = message.stalled_for
                elif isinstance(message, ipc.Gauges):
                    self._kv_usage, self._n_running = message.kv_cache_usage, message.num_running
                elif isinstance(message, ipc.Fatal):
                    why = message.text
        except (EOFError, OSError):
            pass  # the child exited
        except ipc.IpcError as exc:  # not a message of ours: trust the child no further
            log.error("%s; killing the engine process", exc)
            why = "it sent an unreadable message"
            self._kill()
        except Exception:  # noqa: BLE001 - a message we cannot act on: treat as dead
            log.exception("unusable message from the engine process")
            self._kill()
        self._kv_usage, self._n_running = 0.0, 0
        if self._closing:
            return
        if self._proc is None:  # a guest: the owner's child, not ours to wait for
            failure = "the shared engine process closed its connection"
        else:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(5)
            failure = f"the engine process {_exit_description(self._proc.returncode)}"
        failure += f": {why}" if why else ""
        log.error("%s; failing its requests and reporting unhealthy", failure)
        self._fail_all(failure)

    def _kill(self) -> None:
        """Stop trusting the engine process: kill it (ours), or leave it (a guest's)."""
        with contextlib.suppress(OSError):
            if self._proc is not None:
                self._proc.kill()
            else:
                self._conn.close()

    def _dispatch(self, events: list[ipc.Event]) -> None:
        """One step's events to their streams' event loops (one wake-up per loop)."""
        items: list[tuple[asyncio.AbstractEventLoop, StreamQueue, Item]] = []
        with self._lock:
            streams = self._streams
            for event in events:
                if ipc.is_last(event):
                    stream = streams.pop(event.key, None)
                else:
                    stream = streams.get(event.key)
                if stream is None:
                    continue  # its consumer is gone
                items.append((stream.loop, stream.queue, ipc.event_item(event)))
        deliver(items)

    def _fail_all(self, why: str) -> None:
        with self._lock:
            if self._failure is None:
                self._failure = why
            streams, self._streams = self._streams, {}
        deliver((s.loop, s.queue, EngineError(why)) for s in streams.values())
