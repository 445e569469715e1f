# What mistral_serving/server.py uses of Truss 0.18.36's server module
# (truss/templates/server/truss_server.py; importable only from a Truss build context's
# server folder, and untyped): the launcher subclasses TrussServer and replaces `start`.
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI

TIMEOUT_GRACEFUL_SHUTDOWN: int
WS_MAX_MSG_SZ_BYTES: int

class _LogConfig:
    def make_log_config(self, log_level: str) -> Mapping[str, Any]: ...

log_config: _LogConfig

class _ModelWrapper:
    @property
    def load_failed(self) -> bool: ...
    @property
    def ready(self) -> bool: ...

class TrussServer:
    _config: dict[str, Any]
    _http_port: int
    _model: _ModelWrapper
    _server: uvicorn.Server | None
    def __init__(self, http_port: int, config_or_path: str | Path | dict[str, Any]) -> None: ...
    def create_application(self) -> FastAPI: ...
    def start(self) -> None: ...
