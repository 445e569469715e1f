"""What a person running the server sees, through the real Truss server: on a terminal
(`make serve MODEL=dev-mistral`, as the README shows it) human log lines, one "ready on
http://HOST:PORT" line once it answers, and a Ctrl-C that stops it without a traceback or
the extension modules' leak report; JSON lines without colour codes for a log collector; a
port already in use refused before the model loads, the last line naming the port."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import requests

from mistral_build.local_server import LocalServer, dev_settings, free_port, launch_server
from tests.e2e.util import PATIENCE_S, wait_for

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
READY_S = 300  # the README's "about 2 minutes" for a first `make serve`, with room


class Terminal:
    """A command with a pseudo-terminal as its stdin, stdout and stderr, in its own session
    (so a Ctrl-C to its process group reaches what a terminal's would)."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        master, slave = pty.openpty()
        self.master = master
        self.proc = subprocess.Popen(
            argv, cwd=ROOT, env=env, stdin=slave, stdout=slave, stderr=slave,
            start_new_session=True,
        )  # fmt: skip
        os.close(slave)
        self.output = ""

    def read_until(self, done: Callable[[str], bool], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not done(self.output):
            ready, _, _ = select.select([self.master], [], [], 0.5)
            if not ready:
                if self.proc.poll() is not None:
                    return done(self.output)
                continue
            try:
                data = os.read(self.master, 65536)
            except OSError:  # the other side closed: everything was read
                return done(self.output)
            if not data:
                return done(self.output)
            self.output += data.decode(errors="replace").replace("\r\n", "\n")
        return done(self.output)

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        os.close(self.master)


def fresh_env() -> dict[str, str]:
    drop = ("VIRTUAL_ENV", "PYTHONPATH", "MTT_", "PYTEST_", "DISABLE_JSON_LOGGING")
    return {k: v for k, v in os.environ.items() if not k.startswith(drop)}


def test_make_serve_on_a_terminal_logs_for_a_person_and_stops_quietly() -> None:
    port = free_port()
    term = Terminal(["make", "serve", "MODEL=dev-mistral", f"PORT={port}"], fresh_env())
    ready = f"ready on http://127.0.0.1:{port}"
    try:
        assert term.read_until(lambda out: ready in out, READY_S), term.output[-3000:]
        answer = requests.post(
            f"http://127.0.0.1:{port}/v1/models/model:predict",
            json={"prompt": "Hello", "max_new_tokens": 2},
            timeout=60,
        )
        assert answer.status_code == 200, answer.text
        before = len(term.output)
        os.killpg(term.proc.pid, signal.SIGINT)  # Ctrl-C
        term.read_until(lambda out: False, PATIENCE_S)  # to the end of its output
        term.proc.wait(PATIENCE_S)
    finally:
        term.close()
    log = term.output[term.output.index("Truss server on") :]  # build.py serve's, then the server's
    lines = [line for line in log.splitlines() if line.strip()]
    assert not [line for line in lines if line.lstrip().startswith("{")], lines[:5]
    assert not [line for line in lines if "\x1b[" in line]  # no colour codes either
    assert log.count(ready) == 1
    assert "Uvicorn running" not in log  # it said so before the model was loaded
    after = term.output[before:]
    assert "Traceback" not in after and "nanobind" not in after and "leaked" not in after, after
    assert "make: ***" not in after  # the server's exit status was 0: make says nothing
    assert [line for line in after.splitlines() if line.strip()][-1].endswith("INFO stopped")


def test_without_a_terminal_each_line_is_json_and_ready_is_said_once(
    start_server: Callable[..., LocalServer],
) -> None:
    server = start_server()
    # Said once the listener is up and the model loaded: a probe may answer a moment before.
    wait_for(lambda: "ready on" in server.log(), what="the ready line")
    log = server.log()
    records = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    assert len(records) > 5
    assert not [r for r in records if "color_message" in r]  # ANSI codes are no field
    said = [r["message"] for r in records if r["message"].startswith("ready on")]
    assert said == [f"ready on {server.url}"]
    assert not [r for r in records if r["message"].startswith("Uvicorn running")]


def test_log_format_text_is_asked_for_without_a_terminal(
    start_server: Callable[..., LocalServer],
) -> None:
    server = start_server(log_format="text")
    wait_for(lambda: "ready on" in server.log(), what="the ready line")
    lines = server.log().splitlines()
    assert not [line for line in lines if line.startswith("{")]
    assert [line for line in lines if re.fullmatch(rf".* INFO ready on {server.url}", line)]


def test_a_port_in_use_is_refused_before_loading_naming_the_port(
    dev_model: Path, app_context: Path, tmp_path: Path
) -> None:
    """It was found only after the load had started, and the last line was a RuntimeError
    about futures after interpreter shutdown."""
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    log_path = tmp_path / "server.log"
    try:
        with log_path.open("w") as log:
            settings = dev_settings(dev_model) | {"host": "127.0.0.1"}
            proc = launch_server(app_context, port, settings, log)
        try:
            status = proc.wait(PATIENCE_S)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    finally:
        taken.close()
    text = log_path.read_text()
    assert status == 2, text[-3000:]
    lines = [line for line in text.splitlines() if line.strip()]
    assert lines[-1] == (
        f"cannot start: port {port} on 127.0.0.1 is taken (address already in use): stop "
        "what listens there or choose another port"
    )
    assert "model.load" not in text  # nothing was loaded
