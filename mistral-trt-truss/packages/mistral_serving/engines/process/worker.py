"""The engine process: the PyTorch engine (model, KV cache, step loop, sampling, the
structured-output matcher) in a process of its own, so the server's event loop and the
step loop do not share one GIL. With `engine: replay` (benchmarks only) it runs the replay
engine instead, so the serving layer can be measured over this IPC without a model. The
server side is `client.py`, which starts this module as `python -m
mistral_serving.engines.process.worker FD` (a fresh interpreter, as multiprocessing's
`spawn` method: CUDA cannot be forked) with one end of a socket pair as FD.

The messages are the typed ones of `ipc.py` (MessagePack, length-framed by a
`multiprocessing.connection.Connection`): a Start, then Add / Abort / Shutdown from the
server; Ready or Failed, then Step / Gauges / Beat / Fatal from here.

The engine process ignores SIGINT and SIGTERM: the server decides when it stops (a Ctrl-C
or a pod's SIGTERM reaches the server, which drains and then sends Shutdown). If the
server dies, the socket reads EOF and the engine process shuts down too; so does an
unreadable message from it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from mistral_serving.collector import freeze_loaded_objects, thaw_loaded_objects
from mistral_serving.engines.base import EngineError, Item, TokenDelta
from mistral_serving.engines.process import ipc
from mistral_serving.settings import Settings

if TYPE_CHECKING:
    from mistral_serving.engines.base import EngineInfo, EngineLimits, Loop, SamplingOptions, Sink

log = logging.getLogger("mistral_serving.engines.process.worker")  # not __main__ when run as -m

GAUGE_POLL_S = 0.05  # how often the gauges (and the engine's health) are checked
HEARTBEAT_S = ipc.HEARTBEAT_S
_SHUTDOWN_JOIN_S = 30.0


class _RequestOut:
    """Stands in for one request's asyncio.Queue: what the engine puts becomes an event."""

    __slots__ = ("key", "outbox")

    def __init__(self, key: int, outbox: Outbox) -> None:
        self.key, self.outbox = key, outbox

    def put_nowait(self, item: Item) -> None:
        if isinstance(item, TokenDelta):
            self.outbox.pending.append(ipc.delta_event(self.key, item))
        else:
            self.outbox.pending.append(ipc.error_event(self.key, item))


class Outbox:
    """Stands in for the event loop the engine delivers to. The engine hands over a
    whole step in one `call_soon_threadsafe` (`base.deliver`), so each step becomes one
    message to the server, with the gauges read as it is sent."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._lock = threading.Lock()  # the engine thread, the main thread, the monitor
        self.pending: list[ipc.Event] = []
        self.engine: ServedEngine | None = None  # set once loaded: the gauges are read from it
        self.gauges = (0.0, 0)  # the last values sent

    def call_soon_threadsafe(self, callback: Callable[..., object], *args: Any) -> None:
        with self._lock:
            callback(*args)  # base.put_all: every item to its _RequestOut
            events, self.pending = self.pending, []
            self.gauges = self._read_gauges()
            self._send(ipc.Step(events, *self.gauges))

    def send_error(self, key: int, exc: BaseException) -> None:
        with self._lock:
            self._send(ipc.Step([ipc.error_event(key, exc)], *self.gauges))

    def send_gauges_if_changed(self) -> None:
        with self._lock:
            now = self._read_gauges()
            if now != self.gauges:
                self.gauges = now
                self._send(ipc.Gauges(*now))

    def send(self, message: ipc.FromEngine) -> None:
        with self._lock:
            self._send(message)

    def _read_gauges(self) -> tuple[float, int]:
        engine = self.engine
        return (0.0, 0) if engine is None else (engine.kv_cache_usage(), engine.num_running())

    def _send(self, message: ipc.FromEngine) -> None:
        # OSError: the server is gone; the main thread reads EOF and shuts down.
        with contextlib.suppress(OSError):
            self._conn.send_bytes(ipc.encode(message))


class _Monitored(Protocol):
    """What the monitor reads of the engine (a ServedEngine; a double in tests)."""

    def is_healthy(self) -> bool: ...
    def stalled_for(self) -> float: ...
    def shutdown(self) -> None: ...


class ServedEngine(_Monitored, Protocol):
    """What this process serves: the PyTorch engine (`TorchEngine`, guided), or the
    replay engine (benchmarks: the serving layer measured over this IPC)."""

    limits: EngineLimits
    info: EngineInfo
    eos_token_id: int

    @property
    def vocab_size(self) -> int: ...
    def submit(
        self,
        request_id: str,
        prompt_ids: list[int],
        sampling: SamplingOptions,
        loop: Loop,
        queue: Sink,
    ) -> None: ...
    def abort(self, request_id: str) -> None: ...
    def kv_cache_usage(self) -> float: ...
    def num_running(self) -> int: ...


class _MonitorOut(Protocol):
    def send(self, message: ipc.FromEngine) -> None: ...
    def send_gauges_if_changed(self) -> None: ...


def _monitor(engine: _Monitored, outbox: _MonitorOut, stopping: threading.Event) -> None:
    """Send the gauges when they change between steps (the last step of a batch leaves
    them stale), and report a dead step loop: its streams have already been failed by the
    engine; the server marks the engine unhealthy, and this process exits. Beat every
    HEARTBEAT_S with the engine's own `stalled_for` (a step loop wedged in a slow compile
    while this thread still runs)."""
    next_beat = time.monotonic()
    while not stopping.wait(GAUGE_POLL_S):
        # `stopping` is set before a deliberate shutdown stops the loop.
        if not engine.is_healthy() and not stopping.is_set():
            engine.shutdown()  # waits for the dying loop to fail its streams, frees memory
            outbox.send(ipc.Fatal("the engine's step loop died (see the engine log)"))
            os._exit(1)
        outbox.send_gauges_if_changed()
        if time.monotonic() >= next_beat:
            next_beat = time.monotonic() + HEARTBEAT_S
            outbox.send(ipc.Beat(engine.stalled_for()))


class _JsonLines(logging.Formatter):
    """One JSON object a line, with the keys of the server's own log lines."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "asctime": self.formatTime(record),
            "levelname": record.levelname,
            "message": f"[engine process] {record.getMessage()}",
        }
        if record.exc_info:
            entry["exc_info"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def _configure_logging(level: int, as_json: bool) -> None:
    """Log to stderr (the server's), in the server's format: JSON lines when it logs JSON."""
    handler = logging.StreamHandler()
    handler.setFormatter(
        _JsonLines()
        if as_json
        else logging.Formatter("%(asctime)s %(levelname)s [engine process] %(name)s: %(message)s")
    )
    logging.basicConfig(level=level, handlers=[handler])


def serve(conn: Connection) -> int:
    """Load the engine the Start message asks for, then serve requests until Shutdown or
    EOF."""
    start = ipc.decode_to_engine(conn.recv_bytes())
    if not isinstance(start, ipc.Start):
        raise ipc.IpcError(f"the first message must be a start, not {type(start).__name__}")
    _configure_logging(start.log_level, start.log_json)
    outbox = Outbox(conn)
    try:
        from mistral_serving.engines.factory import start_guided_torch_engine, start_replay_engine
        from mistral_serving.tokenizer import load_tokenizer

        model_dir = Path(start.model_dir)
        settings = Settings.model_validate_json(start.settings_json)
        tokenizer = load_tokenizer(model_dir)
        if tokenizer.eos_id != start.eos_token_id:
            raise EngineError(
                f"the tokenizer in {model_dir} has EOS {tokenizer.eos_id}, "
                f"the server's has {start.eos_token_id}"
            )
        engine: ServedEngine
        if settings.engine == "replay":  # benchmarks only: the serving layer over this IPC
            engine = start_replay_engine(settings, tokenizer)
        else:
            engine = start_guided_torch_engine(model_dir, settings, tokenizer, start.config)
    except BaseException as exc:  # noqa: BLE001 - any start-up failure goes to the server
        log.exception("the engine could not start")
        outbox.send(ipc.Failed(type(exc).__name__, str(exc)))
        return 1
    outbox.engine = engine
    freeze_loaded_objects()  # this process's step loop: no full walk of torch's objects
    info = engine.info
    outbox.send(
        ipc.Ready(
            engine.limits,
            info.name,
            {k: _detail(v) for k, v in info.details.items()},
            engine.eos_token_id,
            engine.vocab_size,
        )
    )
    stopping = threading.Event()
    threading.Thread(
        target=_monitor, args=(engine, outbox, stopping), name="engine-monitor", daemon=True
    ).start()
    try:
        _serve_requests(conn, engine, outbox)
    finally:
        stopping.set()
        engine.shutdown()  # pending streams end with EngineError("the engine shut down")
        thaw_loaded_objects()  # else nanobind reports the frozen objects as leaked at exit
    return 0


def _detail(value: object) -> ipc.Detail:
    """An info detail as the Ready message carries it: plain values as they are."""
    return value if value is None or isinstance(value, str | int | float | bool) else str(value)


def _serve_requests(conn: Connection, engine: ServedEngine, outbox: Outbox) -> None:
    while True:
        try:
            message = ipc.decode_to_engine(conn.recv_bytes())
        except (EOFError, OSError):
            log.warning("the server closed the connection: shutting the engine down")
            return
        except ipc.IpcError as exc:  # not our server speaking: stop rather than guess
            log.error("%s: shutting the engine down", exc)
            return
        if isinstance(message, ipc.Add):
            key = message.key
            try:
                engine.submit(
                    message.request_id,
                    message.prompt_ids,
                    message.sampling,
                    outbox,
                    _RequestOut(key, outbox),
                )
            except Exception as exc:  # noqa: BLE001 - refused: this request's error
                outbox.send_error(key, exc)
        elif isinstance(message, ipc.Abort):
            engine.abort(message.request_id)
        elif isinstance(message, ipc.Shutdown):
            return


def main(argv: list[str]) -> int:
    # The server decides when this process ends (see the module docstring).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    fd = int(argv[0])
    os.set_inheritable(fd, False)  # our own subprocesses must not hold the server's socket
    conn = Connection(fd)
    started = time.monotonic()
    try:
        return serve(conn)
    except BaseException:  # noqa: BLE001 - last resort: say why on stderr
        traceback.print_exc()
        return 1
    finally:
        conn.close()
        log.info("engine process exiting after %.1fs", time.monotonic() - started)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
