"""Shared fixtures. End-to-end tests run the real Truss server (from the `truss` package)
with the dev model, started exactly as `make serve` starts it, on a free loopback port."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from mistral_build.dev_model import build_dev_model
from mistral_build.local_server import (
    dev_settings,
    launch_server,
    prepare_app_dir,
    render_build_context,
)
from mistral_build.paths import DEV_MODEL_DIR

READY_TIMEOUT_S = 180


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class RunningServer:
    url: str
    process: subprocess.Popen
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


def wait_ready(server: RunningServer, timeout: float = READY_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(
                f"server exited with {server.process.returncode}:\n{server.log()[-4000:]}"
            )
        try:
            if requests.get(f"{server.url}/v1/models/model", timeout=2).status_code == 200:
                return
        except requests.ConnectionError:
            pass
        time.sleep(0.25)
    raise TimeoutError(f"server not ready in {timeout}s:\n{server.log()[-4000:]}")


@pytest.fixture(scope="session")
def dev_model() -> Path:
    return build_dev_model(DEV_MODEL_DIR)


@pytest.fixture(scope="session")
def app_context(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Truss build context rendered once per session by truss's own code."""
    context = render_build_context(tmp_path_factory.mktemp("truss") / "context")
    prepare_app_dir(context)
    return context


@pytest.fixture(scope="session")
def start_server(
    dev_model: Path, app_context: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[..., RunningServer]]:
    """Factory: start a real Truss server with the dev model and extra settings
    (model_metadata keys), wait until ready. Servers are stopped at session end."""
    started: list[RunningServer] = []

    def start(
        wait: bool = True, extra_env: dict[str, str] | None = None, **settings: object
    ) -> RunningServer:
        port = free_port()
        values = dev_settings(dev_model) | {k: str(v) for k, v in settings.items()}
        log_path = tmp_path_factory.mktemp("server") / "server.log"
        proc = launch_server(app_context, port, values, log_path.open("w"), extra_env)
        server = RunningServer(f"http://127.0.0.1:{port}", proc, log_path)
        started.append(server)
        if wait:
            wait_ready(server)
        return server

    yield start
    for server in started:
        if server.process.poll() is None:
            os.killpg(server.process.pid, signal.SIGKILL)
            server.process.wait()


@pytest.fixture(scope="session")
def server(start_server: Callable[..., RunningServer]) -> RunningServer:
    """One shared server with default settings."""
    return start_server()


@pytest.fixture(scope="session")
def server_url(server: RunningServer) -> str:
    return server.url
