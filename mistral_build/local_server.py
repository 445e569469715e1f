"""`python build.py serve`: run the real Truss model server locally, without Docker.

It renders the Truss's Docker build context with truss's own code, lays it out the way
the Dockerfile does (`server/*`, `model/` and `config.yaml` in one app folder, `packages/`
on the Python path) and runs the server's `main.py` in the foreground. The end-to-end
tests start the server through the same functions.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import IO

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
    """Settings for the CPU dev model (what `make serve` and the e2e tests use)."""
    return {
        "artifact": str(artifact),
        "engine": "pytorch",
        "device": "cpu",
        "cache_dir": str(CACHE_DIR / "artifacts"),
    }


def server_command(app_dir: Path) -> list[str]:
    """The real Truss server through our launcher (run with the app folder as cwd),
    exactly as the image's command runs it."""
    return [sys.executable, "-m", "mistral_serving.server"]


def launch_server(
    context_dir: Path,
    port: int,
    settings: dict[str, str],
    log: IO | int,
    extra_env: dict[str, str] | None = None,
) -> subprocess.Popen:
    """The server as a child process (tests, benchmarks) in its own process group, output
    to `log`; `prepare_app_dir(context_dir)` must have run."""
    app = context_dir / "app"
    env = server_env(context_dir, port, settings) | (extra_env or {})
    return subprocess.Popen(
        server_command(app),
        cwd=app,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def serve(args: argparse.Namespace) -> int:
    settings = {}
    if args.artifact is None:
        from mistral_build.dev_model import build_dev_model

        build_dev_model()
        settings = dev_settings()
    else:
        # The server runs from the app folder: a relative local path must be made absolute
        # (a repo id has no such folder here and is passed on as given).
        local = Path(args.artifact).expanduser()
        settings = {"artifact": str(local.resolve()) if local.exists() else args.artifact}
    for item in args.set or []:
        key, _, value = item.partition("=")
        settings[key] = value
    context = render_build_context(CACHE_DIR / "serve-context")
    app = prepare_app_dir(context)
    print(
        f"Truss server on http://127.0.0.1:{args.port} (ready when "
        f"GET /v1/models/model answers 200); Ctrl-C stops it.",
        flush=True,
    )
    # Become the server (exec, no child process): Ctrl-C and SIGTERM reach it directly.
    os.chdir(app)
    command = server_command(app)
    os.execve(command[0], command, server_env(context, args.port, settings))


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "serve", help="Run the real Truss server locally (dev model by default)."
    )
    p.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8080")))
    p.add_argument(
        "--artifact", help="Serve this artifact (path or repo id) instead of the dev model."
    )
    p.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="Override a setting (model_metadata key), e.g. --set max_inflight=8.",
    )
    p.set_defaults(func=serve)
