"""The id an engine logs names the request (the X-Request-Id the request line shows), and
the engine process exits without nanobind's leak report."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from mistral_serving.artifacts.artifact import open_artifact
from mistral_serving.engines.base import SamplingOptions
from mistral_serving.engines.factory import start_engine
from mistral_serving.ops.telemetry import RequestRecord
from mistral_serving.settings import Settings
from mistral_serving.text.tokenizer import Tokenizer, load_tokenizer
from tests.unit.test_frontend import Client, body, call, serve


def test_the_engine_id_starts_with_the_request_id_and_is_unique() -> None:
    a, b = RequestRecord("trace-42", "predict"), RequestRecord("trace-42", "predict")
    assert a.engine_id.startswith("trace-42-") and b.engine_id.startswith("trace-42-")
    assert a.engine_id != b.engine_id  # a reused X-Request-Id still gets its own engine id


def test_the_engine_is_given_an_id_that_names_the_request(tok: Tokenizer) -> None:  # noqa: F811
    served = serve(tok)
    client = Client(body(prompt="Hi"), headers={"X-Request-Id": "trace-42.a:b"})
    asyncio.run(call(served, client))
    assert client.status == 200
    (engine_call,) = served.engine.calls
    assert engine_call.request_id.startswith("trace-42.a:b-")


def test_the_engine_process_exits_without_a_nanobind_leak_report(
    dev_model: Path, capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)  # the engine process logs at the server's level
    settings = Settings(artifact=str(dev_model), device="cpu", engine_process="on")
    engine = start_engine(open_artifact(dev_model, settings), settings, load_tokenizer(dev_model))

    async def one() -> None:
        async for _ in engine.generate("r1", [1, 5, 6], SamplingOptions(max_new_tokens=2)):
            pass

    asyncio.run(one())
    engine.shutdown()
    err = capfd.readouterr().err
    assert "engine process exiting" in err  # its last words did reach stderr
    assert "nanobind" not in err
