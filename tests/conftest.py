"""Shared fixtures. The dev model and its real Mistral tokenizer (`tok`), SmolLM2's
tokenizer files; end-to-end tests run the real Truss server (from the `truss` package)
with the dev model, started exactly as `make serve` starts it, on a free loopback port."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis.configuration import set_hypothesis_home_dir

from mistral_build.dev_model import build_dev_model
from mistral_build.local_server import (
    LocalServer,
    dev_settings,
    prepare_app_dir,
    render_build_context,
)
from mistral_build.paths import DEV_MODEL_DIR
from mistral_serving.text.tokenizer import Tokenizer
from tests.smollm2_files import smollm2_tokenizer_dir
from tests.tokenizer_cache import tokenizer_at

READY_TIMEOUT_S = 180

# Every property test: no per-example deadline (hypothesis' 200 ms fails on a busy 2-core
# CI machine, not on a bug; with none, its too-slow check allows 30 s of data generation),
# and nothing written into the checkout (no example database; its constants cache in tmp).
settings.register_profile("busy-machine", deadline=None, database=None)
settings.load_profile("busy-machine")
set_hypothesis_home_dir(
    os.environ.get("HYPOTHESIS_STORAGE_DIRECTORY")
    or Path(tempfile.gettempdir()) / "mistral-trt-truss-hypothesis"
)


@pytest.fixture(scope="session")
def dev_model() -> Path:
    return build_dev_model(DEV_MODEL_DIR)


@pytest.fixture(scope="session")
def model_dir(dev_model: Path) -> str:
    """The dev model's directory as a string (the key of `tokenizer_at`'s cache)."""
    return str(dev_model)


@pytest.fixture(scope="session")
def tok(model_dir: str) -> Tokenizer:
    """The dev model's tokenizer: the real Mistral-7B one, loaded once."""
    return tokenizer_at(model_dir)


@pytest.fixture(scope="session")
def smollm2_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """SmolLM2's tokenizer files as its artifact builder writes them."""
    return smollm2_tokenizer_dir(tmp_path_factory)


@pytest.fixture(scope="session")
def app_context(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Truss build context rendered once per session by truss's own code."""
    context = render_build_context(tmp_path_factory.mktemp("truss") / "context")
    prepare_app_dir(context)
    return context


@pytest.fixture(scope="session")
def start_server(
    dev_model: Path, app_context: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[..., LocalServer]]:
    """Factory: start a real Truss server with the dev model and extra settings
    (model_metadata keys), wait until ready. Servers are stopped at session end."""
    started: list[LocalServer] = []

    def start(
        wait: bool = True,
        extra_env: dict[str, str] | None = None,
        command: list[str] | None = None,
        **settings: object,
    ) -> LocalServer:
        values = dev_settings(dev_model) | {k: str(v) for k, v in settings.items()}
        log_path = tmp_path_factory.mktemp("server") / "server.log"
        server = LocalServer.start(
            app_context,
            values,
            extra_env,
            log_path,
            wait=wait,
            timeout=READY_TIMEOUT_S,
            command=command,
        )
        started.append(server)
        return server

    yield start
    for server in started:
        server.kill()


@pytest.fixture(scope="session")
def server(start_server: Callable[..., LocalServer]) -> LocalServer:
    """One shared server with default settings."""
    return start_server()


@pytest.fixture(scope="session")
def server_url(server: LocalServer) -> str:
    return server.url


SMOLLM2_NAME = "smollm2-135m-instruct"  # what `make serve` names it (Makefile)


@pytest.fixture(scope="session")
def smollm2_url(start_server: Callable[..., LocalServer]) -> str:
    """One server with SmolLM2, as `make serve` runs it, for every test of the real model:
    each server holds its own copy of the model, and the machine has little memory to
    spare (one per test module ran it out of memory)."""
    from tests.smollm2_files import smollm2_artifact

    return start_server(artifact=str(smollm2_artifact()), served_model_name=SMOLLM2_NAME).url
