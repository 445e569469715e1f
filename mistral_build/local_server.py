"""`python build.py serve`: run the real Truss model server locally, without Docker.

It renders the Truss's Docker build context with truss's own code, lays it out the way
the Dockerfile does (`server/*`, `model/` and `config.yaml` in one app folder, `packages/`
on the Python path) and runs it through `python -m mistral_serving.http.server` (Truss's own
server with our additions) in the foreground, as the image does. The end-to-end tests,
`verify-gpu` and the benchmark scripts start the server through the same functions
(`LocalServer`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlparse

import yaml

from mistral_build.paths import CACHE_DIR, DEV_MODEL_DIR, TRUSS_DIR


def render_build_context(build_dir: Path, truss_dir: Path = TRUSS_DIR) -> Path:
    """The Docker build context exactly as `truss image build-context` makes it."""
    import truss

    shutil.rmtree(build_dir, ignore_errors=True)
    truss.load(str(truss_dir)).docker_build_setup(build_dir=build_dir)
    return build_dir


def prepare_app_dir(context_dir: Path) -> Path:
    """Lay the context out as the image does: /app = server/* + model/ + config.yaml."""
    app = context_dir / "app"
    shutil.rmtree(app, ignore_errors=True)
    shutil.copytree(context_dir / "server", app)
    shutil.copytree(context_dir / "model", app / "model")
    shutil.copyfile(context_dir / "config.yaml", app / "config.yaml")
    return app


def server_env(context_dir: Path, port: int, settings: dict[str, str]) -> dict[str, str]:
    env = dict(os.environ)
    env["INFERENCE_SERVER_PORT"] = str(port)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(context_dir / "packages"), env.get("PYTHONPATH", "")) if p
    )
    env["PYTHONUNBUFFERED"] = "1"
    for key, value in settings.items():
        env["MTT_" + key.upper()] = value
    return env


def dev_settings(artifact: Path = DEV_MODEL_DIR) -> dict[str, str]:
    """Settings for the CPU dev model (what `make serve MODEL=dev-mistral`, `build.py serve`
    without --artifact and the e2e tests use)."""
    return {
        "artifact": str(artifact),
        "engine": "pytorch",
        "device": "cpu",
        "cache_dir": str(CACHE_DIR / "artifacts"),
    }


SERVER_MODULE = "mistral_serving.http.server"  # the launcher: the image's command too


def server_command() -> list[str]:
    """The real Truss server through our launcher (run with the app folder as cwd),
    exactly as the image's command runs it."""
    return [sys.executable, "-m", SERVER_MODULE]


def launch_server(
    context_dir: Path,
    port: int,
    settings: dict[str, str],
    log: IO | int,
    extra_env: dict[str, str] | None = None,
    command: list[str] | None = None,
) -> subprocess.Popen:
    """The server as a child process (tests, benchmarks) in its own process group, output
    to `log`; `prepare_app_dir(context_dir)` must have run. `command`: another entry point
    run from the app folder (Truss's own `main.py`), else `server_command()`."""
    app = context_dir / "app"
    env = server_env(context_dir, port, settings) | (extra_env or {})
    return subprocess.Popen(
        command or server_command(),
        cwd=app,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(
    url: str, process: subprocess.Popen, timeout: float = 300.0, log_path: Path | None = None
) -> float:
    """Seconds until `GET /v1/models/model` answers 200; RuntimeError (with the log's tail)
    if the server exits first or is not ready in `timeout` seconds."""
    import requests

    def tail() -> str:
        return log_path.read_text(errors="replace")[-4000:] if log_path is not None else ""

    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode} while loading:\n{tail()}")
        try:
            if requests.get(url + "/v1/models/model", timeout=2).status_code == 200:
                return time.monotonic() - started
        except (requests.ConnectionError, requests.Timeout):  # not up yet, or a busy machine
            pass
        time.sleep(0.25)
    raise RuntimeError(f"server not ready in {timeout:.0f}s:\n{tail()}")


# uvicorn's words when its listener cannot bind (the server then exits with status 1).
PORT_TAKEN = "address already in use"
PORT_ATTEMPTS = 3


@dataclass
class LocalServer:
    """A real Truss server run as a child process on a free loopback port."""

    url: str
    port: int
    process: subprocess.Popen
    log_path: Path

    @classmethod
    def start(
        cls,
        context_dir: Path,
        settings: dict[str, str],
        extra_env: dict[str, str] | None = None,
        log_path: Path | None = None,
        wait: bool = True,
        timeout: float = 300.0,
        command: list[str] | None = None,
    ) -> LocalServer:
        """Launch (`prepare_app_dir(context_dir)` must have run) and, with `wait`, wait
        until ready. The port is free when picked but bound only seconds later, by the
        server: one another process took meanwhile is retried on a new port."""
        log_path = log_path or Path(tempfile.mkstemp(prefix="server-", suffix=".log")[1])
        settings = {"host": "127.0.0.1"} | settings  # tests and benchmarks: loopback only
        for attempt in range(1, PORT_ATTEMPTS + 1):
            port = free_port()
            with log_path.open("w") as log:  # the child holds its own copy of the file
                process = launch_server(context_dir, port, settings, log, extra_env, command)
            server = cls(f"http://127.0.0.1:{port}", port, process, log_path)
            if not wait:
                return server
            try:
                wait_ready(server.url, process, timeout, log_path)
            except BaseException as exc:
                server.kill()
                taken = isinstance(exc, RuntimeError) and PORT_TAKEN in server.log()
                if not taken or attempt == PORT_ATTEMPTS:
                    raise
            else:
                return server
        raise AssertionError("unreachable")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 120) -> int:
        """Signal the server and wait for it to exit (killed past `timeout`)."""
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.process.wait()

    def kill(self) -> None:
        """The server and everything it started (its process group)."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


def raw_post(url: str, path: str, body: dict[str, Any]) -> socket.socket:
    """A POST on a bare socket, left unread: the caller decides when the client goes away,
    without waiting for response headers (a queued request gets none)."""
    host = urlparse(url)
    data = json.dumps(body).encode()
    sock = socket.create_connection((host.hostname, host.port))
    sock.sendall(
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\n\r\n".encode()
        + data
    )
    return sock


def serve_settings(artifact: str | None, host: str | None) -> dict[str, str]:
    """What `build.py serve` sets: the dev model's settings without an artifact, and the
    address (loopback unless `--host` says otherwise: a dev server is not for the network)."""
    if artifact is None:
        settings = dev_settings()
    else:
        # The server runs from the app folder: a relative local path must be made absolute
        # (a repo id has no such folder here and is passed on as given).
        local = Path(artifact).expanduser()
        settings = {"artifact": str(local.resolve()) if local.exists() else artifact}
    settings["host"] = host or "127.0.0.1"
    return settings


def environment_conflicts(settings: dict[str, str]) -> str | None:
    """A setting from the environment (MTT_*) that the command line would silently replace."""
    clashes = [
        f"MTT_{key.upper()}={os.environ[f'MTT_{key.upper()}']}"
        for key, value in settings.items()
        if key != "artifact" and os.environ.get(f"MTT_{key.upper()}", value) != value
    ]
    if not clashes:
        return None
    return (
        f"{', '.join(clashes)} from the environment would be replaced by the dev model's "
        f"settings ({', '.join(f'{k}={v}' for k, v in settings.items() if k != 'artifact')}). "
        "To serve another artifact: MTT_ARTIFACT=PATH_OR_REPO make serve (the other MTT_* "
        "variables then apply), or python build.py serve --artifact PATH --set KEY=VALUE"
    )


def settings_problem(sets: list[str], settings: dict[str, str], port: int) -> str | None:
    """Why the server would refuse these settings, found before anything is built: `--set`
    keys that are no setting, then what the server's own start checks (`Settings.load`:
    unknown `MTT_*` variables, invalid values) on the environment it would get."""
    from mistral_serving.settings import Settings, SettingsError, unknown_settings

    malformed = [item for item in sets if "=" not in item]
    if malformed:
        return f"--set expects KEY=VALUE, got {malformed[0]!r}"
    keys = [item.partition("=")[0] for item in sets]
    if problem := unknown_settings(keys):
        return f"--set {problem}"
    config = yaml.safe_load((TRUSS_DIR / "config.yaml").read_text(encoding="utf-8"))
    try:
        Settings.load(config.get("model_metadata"), server_env(TRUSS_DIR, port, settings))
    except SettingsError as exc:
        return str(exc)
    return None


def serve(args: argparse.Namespace) -> int:
    artifact = args.artifact or os.environ.get("MTT_ARTIFACT") or None
    settings = serve_settings(artifact, args.host)
    for item in args.set or []:
        key, _, value = item.partition("=")
        settings[key] = value
    problem = settings_problem(args.set or [], settings, args.port) or environment_conflicts(
        {k: v for k, v in settings.items() if k != "host"}
    )
    if problem:
        print(f"cannot serve: {problem}", file=sys.stderr)
        return 2
    if artifact is None:
        from mistral_build.dev_model import build_dev_model

        build_dev_model()
    context = render_build_context(CACHE_DIR / "serve-context")
    app = prepare_app_dir(context)
    shown = "127.0.0.1" if settings["host"] in ("127.0.0.1", "0.0.0.0") else settings["host"]
    where = "all interfaces" if settings["host"] == "0.0.0.0" else settings["host"]
    print(
        f"Truss server on http://{shown}:{args.port} (listening on {where}; it logs a "
        '"ready on" line once loaded); Ctrl-C stops it.',
        flush=True,
    )
    # Become the server (exec, no child process): Ctrl-C and SIGTERM reach it directly.
    os.chdir(app)
    command = server_command()
    os.execve(command[0], command, server_env(context, args.port, settings))


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "serve",
        help="Run the real Truss server locally: --artifact, else $MTT_ARTIFACT, else the "
        "tiny random-weight dev model (make serve passes SmolLM2).",
        description="Run the real Truss model server locally, without Docker, in the "
        "foreground (Ctrl-C stops it): the Truss rendered by truss's own code and laid out "
        "as the image lays it out. It serves --artifact (a local artifact directory or a "
        "Hugging Face repo id), else $MTT_ARTIFACT with the MTT_* settings of the "
        "environment, else the tests' tiny random-weight Mistral dev model (meaningless "
        "text; `make serve` serves SmolLM2-135M-Instruct instead). A setting name that is "
        "no setting is refused before anything is built. It logs 'ready on "
        "http://HOST:PORT' once loaded.",
    )
    p.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8080")))
    p.add_argument(
        "--artifact",
        help="Serve this artifact (path or repo id) instead of the dev model "
        "(default: $MTT_ARTIFACT when set).",
    )
    p.add_argument(
        "--host",
        help="Address to listen on (default 127.0.0.1: this machine only; 0.0.0.0: every "
        "interface, as the image does).",
    )
    p.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="Override a setting (model_metadata key), e.g. --set max_inflight=8.",
    )
    p.set_defaults(func=serve)
