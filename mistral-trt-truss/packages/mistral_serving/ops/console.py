"""What a person running the server sees: human log lines on a terminal and JSON lines
for a log collector (`log_format`), one "ready on http://HOST:PORT" line once the model is
loaded and the port listens, and a quiet Ctrl-C."""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import sys
from collections.abc import Callable
from typing import IO, Any, NoReturn, Protocol

log = logging.getLogger(__name__)

# Truss's own switch between its JSON and plain log formats (`_truss_shared/log_config.py`),
# read each time it builds its logging config.
TRUSS_PLAIN_LOGS_ENV = "DISABLE_JSON_LOGGING"
READY = "ready on"


def use_log_format(log_format: str, stream: IO[str] | None = None) -> str:
    """Set the process's log format, `text` or `json`, before Truss configures logging,
    and say which: `auto` is text when `stream` (stderr, where the server logs) is a
    terminal. Child processes (the engine process) inherit it."""
    if log_format == "auto":
        stream = sys.stderr if stream is None else stream
        log_format = "text" if stream.isatty() else "json"
    if log_format == "text":
        os.environ[TRUSS_PLAIN_LOGS_ENV] = "1"
    else:
        os.environ.pop(TRUSS_PLAIN_LOGS_ENV, None)
    return log_format


class LogLines(logging.Filter):
    """uvicorn's "Uvicorn running on ..." comes before the model is loaded (the "ready on"
    line replaces it), and its ANSI-coloured copy of a message (`color_message`) is no
    field for a JSON line."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name.startswith("uvicorn") and str(record.msg).startswith("Uvicorn running"):
            return False
        record.__dict__.pop("color_message", None)
        return True


def with_line_filter(log_config: dict[str, Any]) -> dict[str, Any]:
    """`log_config` (a `logging.config.dictConfig` mapping) with `LogLines` on every
    handler."""
    log_config.setdefault("filters", {})["mtt_lines"] = {"()": LogLines}
    for handler in log_config.get("handlers", {}).values():
        handler["filters"] = [*handler.get("filters", []), "mtt_lines"]
    return log_config


def url_of(host: str, port: int) -> str:
    """Where a client on this machine reaches a server listening on `host`."""
    if host in ("0.0.0.0", ""):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class _Listener(Protocol):
    started: bool
    should_exit: bool


async def announce_ready(server: _Listener, loaded: Callable[[], bool], url: str) -> None:
    """Log "ready on URL" once, when the port listens and the model is loaded."""
    while not (server.started and loaded()):
        if server.should_exit:
            return
        await asyncio.sleep(0.1)
    log.info("%s %s", READY, url)


def quiet_exit(status: int) -> NoReturn:
    """End the process after a clean stop, without the interpreter's teardown: the exit
    handlers run (child processes are stopped, logs flushed), but nanobind's extension
    modules (triton, xgrammar) would print their "leaked instances" report, dozens of
    lines that read like a crash, while the interpreter is finalized."""
    atexit._run_exitfuncs()  # logging's shutdown among them, last
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(status)
