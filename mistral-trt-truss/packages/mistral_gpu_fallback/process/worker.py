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

import collections
import contextlib
import itertools
import json
import logging
import os
import signal
import socket
import struct
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
# A front-end that takes nothing written to it for this long, or lets this much wait for
# it, is cut off (a guest is also killed, so that the launcher notices): its writes must
# never hold the engine's step thread, which serves every front-end.
OUTBOX_STALL_S = 10.0
OUTBOX_MAX_BYTES = 256 * 2**20
# A message begun must arrive whole within this; a longer one is not ours.
FRAME_TIMEOUT_S = 10.0
MAX_FRAME_BYTES = 256 * 2**20
FLUSH_S = 5.0  # how long an exit waits for what is still queued to a front-end


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

    def __init__(
        self, conn: Connection, engine: ServedEngine | None = None, guest: bool = False
    ) -> None:
        self._conn = conn
        self._lock = threading.Lock()  # the engine thread, the main thread, the monitor
        self.pending: list[ipc.Event] = []
        self.engine = engine  # set once loaded: the gauges are read from it
        self.gauges = (0.0, 0)  # the last values sent
        # key -> the engine's request id, until the request's last event: what to abort
        # when a guest front-end leaves with requests still running.
        self.live: dict[int, str] = {}
        # Frames wait here for this front-end's own writer thread: a front-end that stops
        # reading holds only that thread, never the engine's step thread.
        self._guest = guest
        self._frames: collections.deque[bytes] = collections.deque()
        self._queued = 0
        self._writing_since: float | None = None
        self._idle = threading.Condition()
        self._closed = False
        self.cut = False
        threading.Thread(target=self._write_all, name="outbox-writer", daemon=True).start()

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
        frame = ipc.encode(message)
        with self._idle:
            if self.cut or self._closed:
                return
            self._frames.append(frame)
            self._queued += len(frame)
            self._idle.notify_all()
            overfull = self._queued > OUTBOX_MAX_BYTES
        if overfull:
            self.cut_off(f"{OUTBOX_MAX_BYTES} bytes waited for it")

    def _write_all(self) -> None:
        """The writer thread: frames in order, each write blocking only this thread."""
        while True:
            with self._idle:
                while not self._frames and not self._closed and not self.cut:
                    self._idle.wait()
                if not self._frames or self.cut:
                    return
                frame = self._frames.popleft()
                self._writing_since = time.monotonic()
            try:
                self._conn.send_bytes(frame)
            except (OSError, ValueError):  # gone (the main thread reads its EOF) or closed
                with self._idle:
                    self.cut = True
                    self._frames.clear()
                    self._idle.notify_all()
                return
            with self._idle:
                self._queued -= len(frame)
                self._writing_since = None
                self._idle.notify_all()

    def stalled(self, now: float) -> bool:
        """A write to it has waited OUTBOX_STALL_S: it stopped reading."""
        since = self._writing_since
        return since is not None and now - since >= OUTBOX_STALL_S and not self.cut

    def cut_off(self, why: str) -> None:
        """Stop writing to this front-end: what waits is dropped, its connection shut (so
        a blocked write fails and the main thread reads its end, and lets it go), and a
        guest's process is killed: hung, it would never notice, nor would the launcher."""
        with self._idle:
            if self.cut:
                return
            self.cut = True
            self._frames.clear()
            self._idle.notify_all()
        pid = _peer_pid(self._conn)
        log.error("a front-end (pid %s) stopped reading (%s): cutting it off", pid, why)
        with contextlib.suppress(OSError):
            dup = socket.socket(fileno=os.dup(self._conn.fileno()))
            dup.shutdown(socket.SHUT_RDWR)
            dup.close()
        if self._guest and pid and pid not in (os.getpid(), os.getppid()):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)

    def flush(self, timeout_s: float) -> None:
        """Wait (at most `timeout_s`) until what is queued is written, then stop the
        writer: the process is about to close the connection or exit."""
        deadline = time.monotonic() + timeout_s
        with self._idle:
            while (self._frames or self._writing_since is not None) and not self.cut:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._idle.wait(left)
            self._closed = True
            self._idle.notify_all()


def _peer_pid(conn: Connection) -> int | None:
    """The process at the other end of a Unix socket (its credentials, from the kernel)."""
    try:
        dup = socket.socket(fileno=os.dup(conn.fileno()))
    except OSError:
        return None
    try:
        creds = dup.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except OSError:
        return None
    finally:
        dup.close()
    pid, _, _ = struct.unpack("3i", creds)
    return pid if pid > 0 else None


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
        now = time.monotonic()
        for outbox in self.outboxes:
            if outbox.stalled(now):
                outbox.cut_off(f"no write to it went through in {OUTBOX_STALL_S:g}s")
            outbox.send_gauges_if_changed()

    def flush(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        for outbox in self.outboxes:
            outbox.flush(max(0.0, deadline - time.monotonic()))


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
    def flush(self, timeout_s: float) -> None: ...


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
            outbox.flush(FLUSH_S)
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
        outbox.flush(FLUSH_S)
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
        fanout.flush(FLUSH_S)  # the streams' last events, before the connections close
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


class _Frames:
    """A front-end's messages as they arrive, read without ever blocking on one that has
    only partly arrived (the main thread serves every front-end's intake): the framing of
    `multiprocessing.connection.Connection` (a 4-byte big-endian length, or -1 and an
    8-byte one), parsed here from what the socket has."""

    def __init__(self, conn: Connection) -> None:
        self._sock = socket.socket(fileno=os.dup(conn.fileno()))
        self._buf = bytearray()
        self.since: float | None = None  # when the message now partly here began

    def read(self) -> tuple[list[bytes], bool]:
        """The messages complete so far, and whether the input has ended (the messages
        before its end come first). OSError from the socket; `frames` raises IpcError
        for a length no message of ours has."""
        ended = False
        while True:
            try:
                chunk = self._sock.recv(1 << 16, socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                break
            if not chunk:
                ended = True
                break
            self._buf += chunk
            if len(chunk) < 1 << 16:
                break
        return self.frames(), ended

    def frames(self) -> list[bytes]:
        frames = []
        while (frame := self._take()) is not None:
            frames.append(frame)
        if not self._buf:
            self.since = None
        elif frames or self.since is None:
            self.since = time.monotonic()
        return frames

    def _take(self) -> bytes | None:
        buf = self._buf
        if len(buf) < 4:
            return None
        (size,) = struct.unpack("!i", buf[:4])
        head = 4
        if size == -1:
            if len(buf) < 12:
                return None
            (size,) = struct.unpack("!Q", buf[4:12])
            head = 12
        if not 0 <= size <= MAX_FRAME_BYTES:
            raise ipc.IpcError(f"a message of {size} bytes announced")
        if len(buf) < head + size:
            return None
        frame = bytes(buf[head : head + size])
        del buf[: head + size]
        return frame

    def overdue(self, now: float) -> bool:
        return self.since is not None and now - self.since >= FRAME_TIMEOUT_S

    def close(self) -> None:
        self._sock.close()


class _Peer:
    """One front-end's connection. Index 0 is the owner (the server that started this
    process); the others are guests that joined on the shared engine's socket."""

    def __init__(self, conn: Connection, index: int, outbox: Outbox) -> None:
        self.conn, self.index, self.outbox = conn, index, outbox
        self.frames = _Frames(conn)
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
        self._owner_gone = False  # the owner broke the protocol or left: stop
        self._listener: socket.socket | None = None
        self._leave_by: float | None = None  # set by the owner's Shutdown

    def serve(self, listener: socket.socket | None, guests_wait_s: float) -> None:
        """Until the owner says Shutdown (then until the guests have left, or for at most
        `guests_wait_s`: their streams drain on their own clocks) or its connection
        ends."""
        self._listener = listener
        self._guests_wait_s = guests_wait_s
        while not self._owner_gone:
            leave_by = self._leave_by
            if leave_by is not None and (not self.peers or time.monotonic() >= leave_by):
                if self.peers:
                    log.warning("%d front-end(s) still joined: stopping", len(self.peers))
                return
            waitables: list[Any] = [*self.peers, *([self._listener] if self._listener else [])]
            for ready in wait(waitables, self._timeout()):
                if ready is self._listener:
                    self._accept(ready)
                    continue
                peer = self.peers.get(ready)  # type: ignore[call-overload]
                if peer is not None:
                    self._intake(peer)
                if self._owner_gone:
                    return
            now = time.monotonic()
            for peer in [p for p in self.peers.values() if p.frames.overdue(now)]:
                log.error(
                    "front-end %d: a message did not arrive whole within %gs",
                    peer.index,
                    FRAME_TIMEOUT_S,
                )
                self._leave(peer)

    def _timeout(self) -> float | None:
        """Until the next thing to check: the owner's leave-by, a partial message's bound."""
        ends = [p.frames.since + FRAME_TIMEOUT_S for p in self.peers.values() if p.frames.since]
        if self._leave_by is not None:
            ends.append(self._leave_by)
        return max(0.0, min(ends) - time.monotonic()) if ends else None

    def _accept(self, listener: socket.socket) -> None:
        try:
            sock, _ = listener.accept()
        except OSError:
            return
        conn = Connection(sock.detach())
        peer = _Peer(conn, next(self._indexes), Outbox(conn, self.engine, guest=True))
        self.peers[conn] = peer

    def _intake(self, peer: _Peer) -> None:
        """Every whole message the peer has sent, handled in order; then its end."""
        try:
            frames, ended = peer.frames.read()
        except OSError:
            frames, ended = [], True
        except ipc.IpcError as exc:
            self._unreadable(peer, exc)
            return
        for frame in frames:
            if peer.conn not in self.peers or self._owner_gone:
                return  # it left (or broke the protocol) with an earlier message
            try:
                message = ipc.decode_to_engine(frame)
            except ipc.IpcError as exc:
                self._unreadable(peer, exc)
                return
            if isinstance(message, ipc.Shutdown) and peer is self.owner:
                self._owner_shutdown()
            else:
                self._handle(peer, message)
        if ended and not self._owner_gone:
            if peer is self.owner:
                if peer.conn in self.peers:
                    log.warning("the server closed the connection: shutting the engine down")
                    self._owner_gone = True
            elif peer.conn in self.peers:
                self._leave(peer)

    def _unreadable(self, peer: _Peer, exc: ipc.IpcError) -> None:
        """Not our server speaking: stop rather than guess."""
        if peer is self.owner:
            log.error("%s: shutting the engine down", exc)
            self._owner_gone = True
        else:
            log.error("front-end %d: %s: closing its connection", peer.index, exc)
            self._leave(peer)

    def _owner_shutdown(self) -> None:
        del self.peers[self.owner.conn]  # its requests have ended: it drained first
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        if self.peers:
            log.info(
                "waiting up to %.0fs for %d front-end(s) to leave",
                self._guests_wait_s,
                len(self.peers),
            )
        self._leave_by = time.monotonic() + self._guests_wait_s

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
        peer.outbox.flush(0.0)  # its writer stops; what it had not taken is dropped
        peer.frames.close()
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
