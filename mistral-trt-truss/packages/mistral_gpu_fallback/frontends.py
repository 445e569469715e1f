"""Several front-end processes over one engine process (`frontend_processes` above 1).

Why: one Python process serving HTTP falls behind a fast engine under bursts of request
starts (docs/performance.md); as with vLLM's API-server count, several processes share
the port and the engine. This module is the launcher, the process `python -m
mistral_serving.http.server` runs: it binds the port once and starts `frontend_processes`
front-end processes (each the whole server of `server.py`, a fresh interpreter) that
inherit the bound socket, so the kernel hands each new connection to one of them. The
first is the owner: it starts the engine process and has it listen on a Unix socket in a
directory of this launcher's (mode 0700); the others join it there (`engines/process/
sharing.py`). Each takes connections only once it has loaded (`server.py`), so none lands
on a front-end still joining. `/metrics` from any of them sums all (prometheus_client's
multiprocess mode, in a directory of the launcher's).

The launcher holds no model and serves nothing. It
- forwards SIGTERM and SIGINT to every front-end (each drains its own streams; the owner
  stops the engine once the others have left);
- when one front-end ends without being asked (a crash, a dead engine, a failed load),
  stops the others and exits with a failure status, so that Kubernetes restarts the pod
  (a pod serving from fewer processes than it was given would go unnoticed);
- exits 0 when asked to stop and every front-end stopped cleanly (exited 0, or by the
  signal it was sent), and removes its directory; kills (with its process group, the
  engine process included) a front-end that has not stopped within the drain's grace
  plus a margin, and then exits 1.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import FrameType

from mistral_gpu_fallback.process.sharing import SharedEngine
from mistral_serving.http.listen_socket import LISTEN_FD_ENV
from mistral_serving.ops.metrics import MULTIPROC_DIR_ENV

log = logging.getLogger(__name__)

_POLL_S = 0.2
_PR_SET_PDEATHSIG = 1


def bind(host: str, port: int) -> socket.socket:
    """The port, bound as uvicorn binds it (its `Config.bind_socket`); each front-end's
    uvicorn listens on it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family=family)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def _die_with_parent() -> None:
    """In the child before it runs: SIGTERM it if the launcher dies (Linux), so no
    front-end outlives a launcher killed with SIGKILL."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def run(count: int, host: str, port: int, stop_timeout_s: float) -> int:
    """Run `count` front-end processes on `host:port` until they end; the exit status.
    Once stopping, front-ends still running after `stop_timeout_s` are killed, with
    their process groups (the owner's holds the engine process)."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    workdir = Path(tempfile.mkdtemp(prefix="mtt-"))  # mode 0700: the engine's socket is here
    metrics_dir = workdir / "metrics"
    metrics_dir.mkdir()
    try:
        sock = bind(host, port)
    except OSError as exc:
        shutil.rmtree(workdir, ignore_errors=True)
        # uvicorn's own words for it (a launcher that retries on a new port reads them).
        reason = (exc.strerror or str(exc)).lower()
        log.error("cannot start: error while attempting to bind on %s:%d: %s", host, port, reason)
        return 2
    address = str(workdir / "engine.sock")
    env = dict(os.environ)
    env |= {LISTEN_FD_ENV: str(sock.fileno()), MULTIPROC_DIR_ENV: str(metrics_dir)}
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for index in range(count):
            shared = SharedEngine("owner" if index == 0 else "guest", address)
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "mistral_serving.http.server"],
                    env=env | shared.environ(),
                    pass_fds=[sock.fileno()],
                    stdin=subprocess.DEVNULL,
                    # Its own session: a terminal's Ctrl-C reaches the launcher, which
                    # forwards it once (twice would make uvicorn skip its graceful stop).
                    start_new_session=True,
                    preexec_fn=_die_with_parent if sys.platform == "linux" else None,  # noqa: PLW1509 - one thread here
                )
            )
        log.info(
            "%d front-end processes (pids %s) on %s:%d over one engine process",
            count,
            " ".join(str(p.pid) for p in procs),
            host,
            port,
        )
        sock.close()  # the front-ends hold it
        return _supervise(procs, metrics_dir, stop_timeout_s)
    finally:
        sock.close()
        for proc in procs:  # only after an error in this function: they have all ended
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        shutil.rmtree(workdir, ignore_errors=True)


def _supervise(
    procs: list[subprocess.Popen[bytes]], metrics_dir: Path, stop_timeout_s: float
) -> int:
    stopping = False
    kill_at: float | None = None  # once stopping: when the stragglers are killed
    asked: set[int] = set()  # the signals forwarded: a front-end may end by one (uvicorn
    status = 0  # raises the signal it caught again once it has stopped)

    def stop(signum: int) -> None:
        for proc in procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signum)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        if not stopping:
            log.info("%s: stopping the front-end processes", signal.Signals(signum).name)
        stopping = True
        asked.add(signum)
        stop(signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    ended: set[int] = set()
    while len(ended) < len(procs):
        time.sleep(_POLL_S)
        if stopping and kill_at is None:
            kill_at = time.monotonic() + stop_timeout_s
        if kill_at is not None and time.monotonic() > kill_at:
            kill_at = float("inf")
            status = status or 1
            for proc in procs:
                if proc.poll() is None:
                    log.error("front-end pid %d did not stop in time: killing it", proc.pid)
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)  # its own session and group
        for index, proc in enumerate(procs):
            code = proc.poll()
            if code is None or proc.pid in ended:
                continue
            ended.add(proc.pid)
            _mark_dead(proc.pid, metrics_dir)
            if not stopping:
                log.error(
                    "front-end process %d (pid %d) %s unasked: stopping the others so that "
                    "the pod is restarted",
                    index,
                    proc.pid,
                    _ended(code),
                )
                stopping = True
                status = code if code > 0 else 1
                asked.add(signal.SIGTERM)
                stop(signal.SIGTERM)
            elif code != 0 and -code not in asked and status == 0:
                log.error("front-end process %d (pid %d) %s", index, proc.pid, _ended(code))
                status = code if code > 0 else 1
    return status


def _ended(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-code).name}"
    return f"exited with status {code}"


def _mark_dead(pid: int, metrics_dir: Path) -> None:
    """Its live gauges (requests running and waiting) no longer count in `/metrics`."""
    from prometheus_client import multiprocess

    with contextlib.suppress(OSError):
        multiprocess.mark_process_dead(pid, str(metrics_dir))  # type: ignore[no-untyped-call]
