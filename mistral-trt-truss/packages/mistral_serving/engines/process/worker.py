"""The engine process: the PyTorch engine (model, KV cache, step loop, sampling, the
structured-output matcher) in a process of its own, so the server's event loop and the
step loop do not share one GIL. The server side is `process.py`, which starts this module
as `python -m mistral_serving.engines.process.worker FD` (a fresh interpreter, as multiprocessing's
`spawn` method: CUDA cannot be forked) with one end of a socket pair as FD.

Messages are pickled tuples over a `multiprocessing.connection.Connection` (length-framed).

Server -> engine process:
    spec dict (first message: model dir, settings, EOS id, log level)
    ("add", key, request_id, prompt_ids, SamplingOptions)
    ("abort", request_id)
    ("shutdown",)
Engine process -> server:
    ("ready", EngineLimits, info name, info details, eos_token_id, vocab_size) or
    ("failed", "Type: message")                       start-up failed; the process exits
    ("step", events, kv_cache_usage, num_running)     one per engine step
    ("gauges", kv_cache_usage, num_running)           when they change between steps
    ("beat", stalled_for)                             every HEARTBEAT_S: the engine's own
                                                      stalled_for (a stopped or wedged
                                                      process sends none: the server
                                                      counts the silence)
    ("fatal", message)                                the step loop died; the process exits

An event is (key, token_ids, finish_reason, logprobs, error, prompt_logprobs): logprobs
and prompt_logprobs as (token_id, logprob, top) tuples or None; error None or
("engine" | "request", message). The SamplingOptions of "add" carries `prompt_logprobs`.

The engine process ignores SIGINT and SIGTERM: the server decides when it stops (a Ctrl-C
or a pod's SIGTERM reaches the server, which drains and then sends "shutdown"). If the
server dies, the socket reads EOF and the engine process shuts down too.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pickle
import signal
import sys
import threading
import time
import traceback
from multiprocessing.connection import Connection
from pathlib import Path

from mistral_serving.collector import freeze_loaded_objects, thaw_loaded_objects
from mistral_serving.engines.base import (
    EngineError,
    EngineRequestError,
    TokenDelta,
)
from mistral_serving.settings import Settings

log = logging.getLogger("mistral_serving.engines.process.worker")  # not __main__ when run as -m

GAUGE_POLL_S = 0.05  # how often the gauges (and the engine's health) are checked
HEARTBEAT_S = 0.5  # how often a "beat" goes to the server, busy or idle
_SHUTDOWN_JOIN_S = 30.0


def encode(message: tuple) -> bytes:
    return pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)


def decode(data: bytes):
    return pickle.loads(data)  # noqa: S301 - our own child process over a private socket pair


def error_event(key: int, exc: BaseException) -> tuple:
    """What the server raises from that request's stream: EngineRequestError for its
    inputs (a 4xx), EngineError for anything else (as `base.read_stream` words it)."""
    if isinstance(exc, EngineRequestError):
        return (key, None, None, None, ("request", str(exc)), None)
    if isinstance(exc, EngineError):
        return (key, None, None, None, ("engine", str(exc)), None)
    return (key, None, None, None, ("engine", f"PyTorch engine failed: {exc!r}"), None)


def _lp_tuples(lps: list | None) -> list[tuple] | None:
    return None if lps is None else [(p.token_id, p.logprob, p.top) for p in lps]


class _RequestOut:
    """Stands in for one request's asyncio.Queue: what the engine puts becomes an event."""

    __slots__ = ("key", "outbox")

    def __init__(self, key: int, outbox: Outbox) -> None:
        self.key, self.outbox = key, outbox

    def put_nowait(self, item: TokenDelta | BaseException) -> None:
        if isinstance(item, TokenDelta):
            self.outbox.pending.append(
                (
                    self.key,
                    item.token_ids,
                    item.finish_reason,
                    _lp_tuples(item.logprobs),
                    None,
                    _lp_tuples(item.prompt_logprobs),
                )
            )
        else:
            self.outbox.pending.append(error_event(self.key, item))


class Outbox:
    """Stands in for the event loop the engine delivers to. The engine hands over a
    whole step in one `call_soon_threadsafe` (`base.deliver`), so each step becomes one
    message to the server, with the gauges read as it is sent."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._lock = threading.Lock()  # the engine thread, the main thread, the monitor
        self.pending: list[tuple] = []
        self.engine = None  # set once loaded: the gauges are read from it
        self.gauges = (0.0, 0)  # the last values sent

    def call_soon_threadsafe(self, callback, *args) -> None:
        with self._lock:
            callback(*args)  # base.put_all: every item to its _RequestOut
            events, self.pending = self.pending, []
            self.gauges = self._read_gauges()
            self._send(("step", events, *self.gauges))

    def send_error(self, key: int, exc: BaseException) -> None:
        with self._lock:
            self._send(("step", [error_event(key, exc)], *self.gauges))

    def send_gauges_if_changed(self) -> None:
        with self._lock:
            now = self._read_gauges()
            if now != self.gauges:
                self.gauges = now
                self._send(("gauges", *now))

    def send(self, message: tuple) -> None:
        with self._lock:
            self._send(message)

    def _read_gauges(self) -> tuple[float, int]:
        engine = self.engine
        return (0.0, 0) if engine is None else (engine.kv_cache_usage(), engine.num_running())

    def _send(self, message: tuple) -> None:
        # OSError: the server is gone; the main thread reads EOF and shuts down.
        with contextlib.suppress(OSError):
            self._conn.send_bytes(encode(message))


def _monitor(engine, outbox: Outbox, stopping: threading.Event) -> None:
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
            outbox.send(("fatal", "the PyTorch engine's step loop died (see the engine log)"))
            os._exit(1)
        outbox.send_gauges_if_changed()
        if time.monotonic() >= next_beat:
            next_beat = time.monotonic() + HEARTBEAT_S
            outbox.send(("beat", engine.stalled_for()))


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
    """Load the engine the spec asks for, then serve requests until shutdown or EOF."""
    spec = decode(conn.recv_bytes())
    _configure_logging(spec.get("log_level", logging.INFO), spec.get("log_json", False))
    outbox = Outbox(conn)
    try:
        from mistral_serving.engines.factory import start_guided_torch_engine
        from mistral_serving.tokenizer import load_tokenizer

        model_dir = Path(spec["model_dir"])
        settings = Settings(**spec["settings"])
        tokenizer = load_tokenizer(model_dir)
        if tokenizer.eos_id != spec["eos_token_id"]:
            raise EngineError(
                f"the tokenizer in {model_dir} has EOS {tokenizer.eos_id}, "
                f"the server's has {spec['eos_token_id']}"
            )
        engine = start_guided_torch_engine(model_dir, settings, tokenizer)
    except BaseException as exc:  # noqa: BLE001 - any start-up failure goes to the server
        log.exception("the engine could not start")
        message = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        outbox.send(("failed", message))
        return 1
    outbox.engine = engine
    freeze_loaded_objects()  # this process's step loop: no full walk of torch's objects
    info = engine.info
    outbox.send(
        (
            "ready",
            engine.limits,
            info.name,
            dict(info.details),
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


def _serve_requests(conn: Connection, engine, outbox: Outbox) -> None:
    while True:
        try:
            message = decode(conn.recv_bytes())
        except (EOFError, OSError):
            log.warning("the server closed the connection: shutting the engine down")
            return
        kind = message[0]
        if kind == "add":
            _, key, request_id, prompt_ids, sampling = message
            try:
                engine.submit(request_id, prompt_ids, sampling, outbox, _RequestOut(key, outbox))
            except Exception as exc:  # noqa: BLE001 - refused: this request's error
                outbox.send_error(key, exc)
        elif kind == "abort":
            engine.abort(message[1])
        elif kind == "shutdown":
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
