"""`LocalServer.start` picks a free port that the server binds only seconds later: a port
another process took meanwhile (uvicorn then logs "address already in use" and exits 1)
is retried on a new one, and any other failure is not retried."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest

from mistral_build import local_server

# Binds the port as uvicorn does; on failure, uvicorn's own line and status. Answers the
# readiness probe with 200 otherwise.
FAKE_SERVER = r"""
import http.server, sys
port = int(sys.argv[1])
class Ready(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/v1/models/model" else 404)
        self.end_headers()
try:
    server = http.server.HTTPServer(("127.0.0.1", port), Ready)
except OSError:
    print(f"[Errno 98] error while attempting to bind on address ('127.0.0.1', {port}): "
          "address already in use", flush=True)
    sys.exit(1)
server.serve_forever()
"""


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        yield held.getsockname()[1]


def fake_launch(script: str) -> object:
    def launch(
        context_dir: Path,
        port: int,
        settings: dict[str, str],
        log: IO | int,
        extra_env: dict[str, str] | None = None,
        command: list[str] | None = None,
    ) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-c", script, str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    return launch


def test_a_port_taken_before_the_server_binds_it_is_retried_on_another(
    monkeypatch: pytest.MonkeyPatch, taken_port: int, tmp_path: Path
) -> None:
    picked = iter([taken_port])
    monkeypatch.setattr(local_server, "launch_server", fake_launch(FAKE_SERVER))
    real_free_port = local_server.free_port
    monkeypatch.setattr(local_server, "free_port", lambda: next(picked, None) or real_free_port())
    server = local_server.LocalServer.start(tmp_path, {}, log_path=tmp_path / "log", timeout=120)
    try:
        assert server.port != taken_port
        assert local_server.PORT_TAKEN not in server.log()  # the log is the ready server's
    finally:
        server.kill()


def test_a_server_that_fails_for_another_reason_is_not_retried(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    launched: list[int] = []
    launch = fake_launch("import sys; print('load failed: no artifact'); sys.exit(1)")

    def counting(*args: object, **kwargs: object) -> subprocess.Popen:
        launched.append(1)
        return launch(*args, **kwargs)  # type: ignore[operator]

    monkeypatch.setattr(local_server, "launch_server", counting)
    with pytest.raises(RuntimeError, match="load failed: no artifact"):
        local_server.LocalServer.start(tmp_path, {}, log_path=tmp_path / "log", timeout=120)
    assert launched == [1]


def test_a_port_that_stays_taken_fails_after_three_tries(
    monkeypatch: pytest.MonkeyPatch, taken_port: int, tmp_path: Path
) -> None:
    monkeypatch.setattr(local_server, "launch_server", fake_launch(FAKE_SERVER))
    monkeypatch.setattr(local_server, "free_port", lambda: taken_port)
    with pytest.raises(RuntimeError, match="address already in use"):
        local_server.LocalServer.start(tmp_path, {}, log_path=tmp_path / "log", timeout=120)
