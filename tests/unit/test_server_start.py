"""server.serve against Truss's own `TrussServer.start`, in a fresh interpreter with the
rendered app folder (truss's real `truss_server` module): the same uvicorn settings but
the HTTP parser, and a real uvloop loop where Truss's `asyncio.run` makes a stdlib one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mistral_serving.settings import Settings

ROOT = Path(__file__).resolve().parents[2]

DRIVER = r"""
import asyncio, json, sys, types
import uvicorn
import truss_server
from mistral_serving.http import server as ours
from mistral_serving.settings import Settings

seen = []

class Config:
    def __init__(self, app, **kwargs):
        seen.append({"app": app, **kwargs})

class Server:
    def __init__(self, config):
        pass

    async def serve(self, sockets=None):  # uvicorn.Server.serve
        seen[-1]["running_loop"] = type(asyncio.get_running_loop()).__module__

uvicorn.Config, uvicorn.Server = Config, Server
runtime = json.loads(sys.argv[1])
fake = types.SimpleNamespace(
    _config={"runtime": runtime}, _http_port=8123, create_application=lambda: "the app"
)
truss_server.TrussServer.start(fake)
ours.serve(fake, Settings())
seen[1]["http"] = next(c.__module__ for c in seen[1]["http"].__mro__ if c.__module__.startswith("uvicorn"))
print(json.dumps(seen, default=repr))
"""


def started(app_context: Path, runtime: dict) -> tuple[dict, dict]:
    app = app_context / "app"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "mistral-trt-truss/packages"), str(app)])
    out = subprocess.run(
        [sys.executable, "-c", DRIVER, json.dumps(runtime)],
        cwd=app,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    ).stdout
    truss, mine = json.loads(out.strip().splitlines()[-1])
    return truss, mine


@pytest.mark.parametrize(
    "runtime",
    [
        {},
        {
            "enable_debug_logs": True,
            "transport": {"ping_interval_seconds": 7, "ping_timeout_seconds": 9},
        },
    ],
)
def test_same_uvicorn_settings_as_truss_but_the_parser_and_a_real_uvloop(
    app_context: Path, runtime: dict
) -> None:
    truss, mine = started(app_context, runtime)
    assert truss.pop("http") == "h11"
    assert mine.pop("http") == "uvicorn.protocols.http.httptools_impl"  # bounded: http/limits.py
    assert mine.pop("timeout_keep_alive") == Settings().keepalive_timeout_seconds
    assert truss.pop("running_loop") == "asyncio.unix_events"  # asked for uvloop, got this
    assert mine.pop("running_loop") == "uvloop"
    # Our log lines' filter on every handler ("ready on" replaces uvicorn's line).
    assert mine["log_config"]["filters"].pop("mtt_lines")
    for handler in mine["log_config"]["handlers"].values():
        assert handler["filters"].pop() == "mtt_lines"
        if not handler["filters"]:
            del handler["filters"]
    assert mine == truss  # app, host, port, workers, timeouts, log config, ws settings


ONE_OWNER = r"""
import json, sys
from mistral_serving.http import server as ours
from mistral_serving.http.frontend import FRONTEND_CONFIG_KEY, Frontend
from mistral_serving.settings import Settings

loads = []
real_load = Settings.load.__func__

def counted(cls, *args, **kwargs):
    loads.append(1)
    return real_load(cls, *args, **kwargs)

Settings.load = classmethod(counted)
Frontend.load = lambda self, hf_token: None  # no engine: only who made what matters here
seen = {}

def serve(server, settings, *listening):
    server._model.load()  # what Truss's load thread does: model.py's Model is made here
    model = server._model._model
    app = server.create_application()
    made = server._config[FRONTEND_CONFIG_KEY]
    guard = next(m for m in app.user_middleware if m.cls.__name__ == "BodyGuard")
    seen.update(
        model_serves_the_launchers=model._frontend is made,
        guard_asks_it=guard.kwargs["refuse"].__self__ is made,
        its_settings_are_the_launchers=made.settings is settings,
        settings_loads=len(loads),
    )

ours.serve = serve
code = ours.main()
print(json.dumps(seen | {"code": code}))
"""


def test_the_launcher_owns_the_one_frontend_and_loads_settings_once(app_context: Path) -> None:
    """`server.main` loads the settings once and makes the one Frontend; Truss's real
    ModelWrapper builds model.py's Model, which serves that same object, and so do the
    body guard and our routes (no process-global lookup)."""
    app = app_context / "app"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "mistral-trt-truss/packages"), str(app)])
    env.pop("MTT_ARTIFACT", None)
    env["INFERENCE_SERVER_PORT"] = "0"  # main binds it: any free one
    out = subprocess.run(
        [sys.executable, "-c", ONE_OWNER],
        cwd=app,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen == {
        "model_serves_the_launchers": True,
        "guard_asks_it": True,
        "its_settings_are_the_launchers": True,
        "settings_loads": 1,
        "code": 0,
    }
