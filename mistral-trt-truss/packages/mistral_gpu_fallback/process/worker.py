"""The engine process: the PyTorch engine (model, KV cache, step loop, sampling, the
structured-output matcher) in a process of its own, so the server's event loop and the
step loop do not share one GIL. With `engine: replay` (benchmarks only) it runs the replay
engine instead, so the serving layer can be measured over this IPC without a model. The
server side is `client.py`, which starts this module as `python -m
mistral_gpu_fallback.process.worker FD` (a fresh interpreter, as multiprocessing's
`spawn` method: CUDA cannot be forked) with one end of a socket pair as FD.

The messages are the typed ones of `ipc.py` (MessagePack, length-framed by a
`multiprocessing.connection.Connection`): a Start, then Add / Abort / Shutdown from the
server; Ready or Failed, then Step / Gauges / Beat / Fatal from here.

The engine process ignores SIGINT and SIGTERM: the server decides when it stops (a Ctrl-C
or a pod's SIGTERM reaches the server, which drains and then sends Shutdown). If the
server dies, the socket reads EOF and the engine process shuts down too; so does an
unreadable message from it.

Shared by several front-ends (`sharing.py`; Start names a Unix socket): guest front-ends
connect there and say Join; each gets Ready and then serves as the owner does. Each
front-end's requests are its own: its steps carry only its events, and a guest that
leaves (Shutdown, EOF, an unreadable message) has its requests aborted while the others
go on. A Shutdown from the owner waits for the guests to leave (they drain on their own
SIGTERM) for at most the Start's `guests_wait_s`; the owner's EOF stops the engine at once.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from mistral_gpu_fallback.process import ipc
from mistral_serving.engines.base import EngineError, Item, TokenDelta
from mistral_serving.ops.collector import freeze_loaded_objects, thaw_loaded_objects
from mistral_serving.settings import Settings

if TYPE_CHECKING:
    from mistral_serving.engines.base import EngineInfo, EngineLimits, Loop, SamplingOptions, Sink

log = logging.getLogger("mistral_gpu_fallback.process.worker")  # not __main__ when run as -m

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
            event = ipc.delta_event(self.key, item)
        else:
            event = ipc.error_event(self.key, item)
        self.outbox.pending.append(event)
        if ipc.is_last(event):
            self.outbox.live.pop(self.key, None)


class Outbox:
    """Stands in for the event loop the engine delivers to, one per front-end connection.
    The engine hands over a whole step in one `call_soon_threadsafe` per loop
    (`base.deliver`), so each step becomes one message to each front-end with requests
    in it, with the gauges read as it is sent."""

    def __init__(self, conn: Connection, engine: ServedEngine | None = None) -> None:
        self._conn = conn
        self._lock = threading.Lock()  # the engine thread, the main thread, the monitor
        self.pending: list[ipc.Event] = []
        self.engine = engine  # set once loaded: the gauges are read from it
        self.gauges = (0.0, 0)  # the last values sent
        # key -> the engine's request id, until the request's last event: what to abort
        # when a guest front-end leaves with requests still running.
        self.live: dict[int, str] = {}

    def call_soon_threadsafe(self, callback: Callable[..., object], *args: Any) -> None:
        with self._lock:
            callback(*args)  # base.put_all: every item to its _RequestOut
            events, self.pending = self.pending, []
            self.gauges = self._read_gauges()
            self._send(ipc.Step(events, *self.gauges))

    def send_error(self, key: int, exc: BaseException) -> None:
        with self._lock:
            self.live.pop(key, None)
            self._send(ipc.Step([ipc.error_event(key, exc)], *self.gauges))

    def take_live(self) -> list[str]:
        """The engine ids of the requests still running, forgotten here (to abort them)."""
        with self._lock:
            ids, self.live = list(self.live.values()), {}
        return ids

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
        # OSError: that front-end is gone; the main thread reads its EOF.
        with contextlib.suppress(OSError):
            self._conn.send_bytes(ipc.encode(message))


class Fanout:
    """The outboxes of every front-end that has joined: what the monitor's gauges, beats
    and a fatal error go to. Replaced, never mutated, so the monitor thread reads a list
    that no other thread changes under it."""

    def __init__(self, outboxes: list[Outbox]) -> None:
        self.outboxes = outboxes

    def add(self, outbox: Outbox) -> None:
        self.outboxes = [*self.outboxes, outbox]

    def remove(self, outbox: Outbox) -> None:
        self.outboxes = [o for o in self.outboxes if o is not outbox]

    def send(self, message: ipc.FromEngine) -> None:
        for outbox in self.outboxes:
            outbox.send(message)

    def send_gauges_if_changed(self) -> None:
        for outbox in self.outboxes:
            outbox.send_gauges_if_changed()


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
    # Listening before the load: a guest that connects early waits in the backlog.
    listener = _listen(start.guests_address) if start.guests_address else None
    try:
        engine = _load(start)
    except BaseException as exc:  # noqa: BLE001 - any start-up failure goes to the server
        log.exception("the engine could not start")
        outbox.send(ipc.Failed(type(exc).__name__, str(exc)))
        _close(listener, start.guests_address)
        return 1
    outbox.engine = engine
    freeze_loaded_objects()  # this process's step loop: no full walk of torch's objects
    info = engine.info
    ready = ipc.Ready(
        engine.limits,
        info.name,
        {k: _detail(v) for k, v in info.details.items()},
        engine.eos_token_id,
        engine.vocab_size,
    )
    outbox.send(ready)
    fanout = Fanout([outbox])
    stopping = threading.Event()
    threading.Thread(
        target=_monitor, args=(engine, fanout, stopping), name="engine-monitor", daemon=True
    ).start()
    try:
        _Requests(engine, ready, fanout, _Peer(conn, 0, outbox)).serve(
            listener, start.guests_wait_s
        )
    finally:
        stopping.set()
        _close(listener, start.guests_address)
        engine.shutdown()  # pending streams end with EngineError("the engine shut down")
        thaw_loaded_objects()  # else nanobind reports the frozen objects as leaked at exit
    return 0


def _load(start: ipc.Start) -> ServedEngine:
    from mistral_gpu_fallback.plugin import start_replay_engine
    from mistral_serving.engines.factory import start_guided_torch_engine
    from mistral_serving.text.tokenizer import load_tokenizer

    model_dir = Path(start.model_dir)
    settings = Settings.model_validate_json(start.settings_json)
    tokenizer = load_tokenizer(model_dir)
    if tokenizer.eos_id != start.eos_token_id:
        raise EngineError(
            f"the tokenizer in {model_dir} has EOS {tokenizer.eos_id}, "
            f"the server's has {start.eos_token_id}"
        )
    if settings.engine == "replay":  # benchmarks only: the serving layer over this IPC
        return start_replay_engine(settings, tokenizer)
    return start_guided_torch_engine(model_dir, settings, tokenizer, start.config)


def _listen(address: str) -> socket.socket:
    """The Unix socket guest front-ends join on (`sharing.py`); its directory is the
    launcher's own (mode 0700), so only this user's processes can reach it."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(address)  # left by an earlier engine process that was killed
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(address)
    listener.listen(64)
    return listener


def _close(listener: socket.socket | None, address: str | None) -> None:
    if listener is not None:
        listener.close()
        with contextlib.suppress(OSError):
            os.unlink(address or "")


def _detail(value: object) -> ipc.Detail:
    """An info detail as the Ready message carries it: plain values as they are."""
    return value if value is None or isinstance(value, str | int | float | bool) else str(value)


class _Peer:
    """One front-end's connection. Index 0 is the owner (the server that started this
    process); the others are guests that joined on the shared engine's socket."""

    def __init__(self, conn: Connection, index: int, outbox: Outbox) -> None:
        self.conn, self.index, self.outbox = conn, index, outbox
        self.joined = index == 0  # a guest is served once it has said Join

    def engine_id(self, request_id: str) -> str:
        """The request's id in the engine: each front-end names its own requests, so a
        guest's are made distinct from the others' (aborts go by id)."""
        return request_id if self.index == 0 else f"{request_id}@{self.index}"


class _Requests:
    """The main thread's loop: each front-end's Add / Abort / Shutdown to the engine."""

    def __init__(
        self, engine: ServedEngine, ready: ipc.Ready, fanout: Fanout, owner: _Peer
    ) -> None:
        self.engine, self.ready, self.fanout, self.owner = engine, ready, fanout, owner
        self.peers: dict[Connection, _Peer] = {owner.conn: owner}
        self._indexes = itertools.count(1)
        self._owner_gone = False  # the owner broke the protocol: stop, as for its EOF

    def serve(self, listener: socket.socket | None, guests_wait_s: float) -> None:
        """Until the owner says Shutdown (then until the guests have left, or for at most
        `guests_wait_s`: their streams drain on their own clocks) or its connection
        ends."""
        leave_by: float | None = None
        while True:
            if leave_by is not None and (not self.peers or time.monotonic() >= leave_by):
                if self.peers:
                    log.warning("%d front-end(s) still joined: stopping", len(self.peers))
                return
            waitables: list[Any] = [*self.peers, *([listener] if listener else [])]
            timeout = None if leave_by is None else max(0.0, leave_by - time.monotonic())
            for ready in wait(waitables, timeout):
                if ready is listener:
                    self._accept(listener)
                    continue
                peer = self.peers.get(ready)  # type: ignore[call-overload]
                if peer is None:
                    continue
                message = self._receive(peer)
                if message is None:
                    if peer is self.owner:
                        return
                    continue
                if isinstance(message, ipc.Shutdown) and peer is self.owner:
                    del self.peers[peer.conn]  # its requests have ended: it drained first
                    if listener is not None:
                        listener.close()
                        listener = None
                    if self.peers:
                        log.info(
                            "waiting up to %.0fs for %d front-end(s) to leave",
                            guests_wait_s,
                            len(self.peers),
                        )
                    leave_by = time.monotonic() + guests_wait_s
                else:
                    self._handle(peer, message)
                if self._owner_gone:
                    return

    def _accept(self, listener: socket.socket) -> None:
        try:
            sock, _ = listener.accept()
        except OSError:
            return
        conn = Connection(sock.detach())
        peer = _Peer(conn, next(self._indexes), Outbox(conn, self.engine))
        self.peers[conn] = peer

    def _receive(self, peer: _Peer) -> ipc.ToEngine | None:
        """The peer's next message, or None once it has gone (then it is let go)."""
        try:
            return ipc.decode_to_engine(peer.conn.recv_bytes())
        except (EOFError, OSError):
            if peer is self.owner:
                log.warning("the server closed the connection: shutting the engine down")
            else:
                self._leave(peer)
            return None
        except ipc.IpcError as exc:  # not our server speaking: stop rather than guess
            if peer is self.owner:
                log.error("%s: shutting the engine down", exc)
            else:
                log.error("front-end %d: %s: closing its connection", peer.index, exc)
                self._leave(peer)
            return None

    def _handle(self, peer: _Peer, message: ipc.ToEngine) -> None:
        if not peer.joined:
            if not isinstance(message, ipc.Join):
                log.error("a front-end sent a %s before joining", type(message).__name__)
                self._leave(peer)
                return
            peer.joined = True
            peer.outbox.send(self.ready)
            self.fanout.add(peer.outbox)
            log.info("front-end %d joined", peer.index)
        elif isinstance(message, ipc.Add):
            key = message.key
            engine_id = peer.engine_id(message.request_id)
            peer.outbox.live[key] = engine_id
            try:
                self.engine.submit(
                    engine_id,
                    message.prompt_ids,
                    message.sampling,
                    peer.outbox,
                    _RequestOut(key, peer.outbox),
                )
            except Exception as exc:  # noqa: BLE001 - refused: this request's error
                peer.outbox.send_error(key, exc)
        elif isinstance(message, ipc.Abort):
            self.engine.abort(peer.engine_id(message.request_id))
        elif isinstance(message, ipc.Shutdown):  # a guest leaving
            self._leave(peer)
        else:  # a second Start or Join
            log.error("front-end %d sent a %s", peer.index, type(message).__name__)
            self._leave(peer)

    def _leave(self, peer: _Peer) -> None:
        """A guest is gone: its requests are aborted, the others go on. The owner that
        breaks the protocol stops the engine instead (nobody else would)."""
        if peer is self.owner:
            log.error("the server broke the protocol: shutting the engine down")
            self._owner_gone = True
            return
        self.peers.pop(peer.conn, None)
        self.fanout.remove(peer.outbox)
        for engine_id in peer.outbox.take_live():
            self.engine.abort(engine_id)
        peer.conn.close()
        if peer.joined:
            log.info("front-end %d left", peer.index)


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
