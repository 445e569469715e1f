"""API-key auth (mistral_serving.http.auth) on a FastAPI app extended by `server.extend`."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from mistral_serving.http.auth import (
    RELOAD_CHECK_S,
    ApiKeyError,
    ApiKeyGuard,
    KeySource,
    RedactedAccessLine,
    key_matches,
    load_keys,
    redacted_query,
)
from mistral_serving.http.frontend import Frontend
from mistral_serving.http.server import error_json, extend, route_of
from mistral_serving.ops.metrics import Metrics
from mistral_serving.settings import Settings


def app_with(tmp_path: Path, keys_text: str | None) -> TestClient:
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat() -> dict[str, str]:
        return {"ok": "chat"}

    @app.post("/v1/models/model:predict")
    async def predict() -> dict[str, str]:
        return {"ok": "predict"}

    @app.get("/v1/models/model")
    async def ready() -> dict[str, str]:
        return {"ok": "ready"}

    path = ""
    if keys_text is not None:
        keys = tmp_path / "keys"
        keys.write_text(keys_text)
        path = str(keys)
    frontend = Frontend(Settings(api_keys_file=path), Metrics(CollectorRegistry()))
    return TestClient(extend(app, frontend))


def test_off_by_default_every_route_is_open(tmp_path: Path) -> None:
    client = app_with(tmp_path, None)
    assert client.post("/v1/chat/completions", json={}).status_code == 200


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/models/model:predict"])
def test_missing_or_wrong_key_is_401_with_bearer_challenge(tmp_path: Path, path: str) -> None:
    client = app_with(tmp_path, "# rotation\nkey-one\n\nkey-two\n")
    for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": "Basic key-one"}):
        answer = client.post(path, json={}, headers=headers)
        assert answer.status_code == 401
        assert answer.headers["www-authenticate"] == "Bearer"
        assert "key-one" not in answer.text and "nope" not in answer.text
        if path == "/v1/chat/completions":
            assert answer.json()["error"]["code"] == "invalid_api_key"
        else:
            assert "API key" in answer.json()["error"]
    for key in ("key-one", "key-two"):
        answer = client.post(path, json={}, headers={"Authorization": f"Bearer {key}"})
        assert answer.status_code == 200


def test_probes_stay_open(tmp_path: Path) -> None:
    client = app_with(tmp_path, "k\n")
    assert client.get("/v1/models/model").status_code == 200


@pytest.mark.parametrize("text", ["", "# only a comment\n", "a" * 5000 + "\n"])
def test_an_unusable_key_file_is_refused_in_one_line(tmp_path: Path, text: str) -> None:
    keys = tmp_path / "keys"
    keys.write_text(text)
    with pytest.raises(ApiKeyError) as err:
        load_keys(str(keys))
    assert "\n" not in str(err.value) and "aaaa" not in str(err.value)


@hsettings(max_examples=50, deadline=None)
@given(st.binary(max_size=64))
def test_only_a_listed_key_matches(token: bytes) -> None:
    assert key_matches(token, (b"secret-1", b"secret-2")) == (token in (b"secret-1", b"secret-2"))


def test_an_x_api_key_header_is_a_key_and_stored_responses_are_guarded(tmp_path: Path) -> None:
    client = app_with(tmp_path, "key-one\n")
    refused = client.post("/v1/messages", json={}, headers={"x-api-key": "nope"})
    assert refused.status_code == 401  # in Anthropic's shape on its routes
    assert refused.json()["error"]["type"] == "authentication_error"
    assert "x-api-key" in refused.json()["error"]["message"]
    passed = client.post("/v1/messages", json={}, headers={"x-api-key": "key-one"})
    assert passed.status_code == 404  # through the guard; this app has no such route
    counted = client.post("/v1/messages/count_tokens", json={}, headers={"x-api-key": "key-one"})
    assert counted.status_code == 503 and counted.json()["type"] == "error"  # not loaded
    for method in ("GET", "DELETE"):
        assert client.request(method, "/v1/responses/resp_1").status_code == 401
        held = client.request(method, "/v1/responses/resp_1", headers={"x-api-key": "key-one"})
        assert held.status_code == 503  # through the guard; the model is not loaded
    assert client.get("/v1/models/model").status_code == 200


def test_a_changed_key_file_takes_effect_without_a_restart(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A mounted Secret is updated in place (a new file swapped in): a revoked key is
    refused and a new one accepted within RELOAD_CHECK_S; a file that becomes unusable
    keeps the keys in force."""
    caplog.set_level(logging.INFO, logger="mistral_serving.http.auth")
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat() -> dict[str, str]:
        return {"ok": "chat"}

    keys = tmp_path / "keys"
    keys.write_text("old-key\n")
    now = [0.0]
    source = KeySource(str(keys), tmp_path / "no-secret", {}, clock=lambda: now[0])
    client = TestClient(ApiKeyGuard(app, source, route_of, error_json))

    def status(key: str) -> int:
        headers = {"Authorization": f"Bearer {key}"}
        return client.post("/v1/chat/completions", json={}, headers=headers).status_code

    assert (status("old-key"), status("new-key")) == (200, 401)
    swapped = tmp_path / "keys.new"
    swapped.write_text("new-key\n")
    os.replace(swapped, keys)
    assert status("old-key") == 200  # not looked at again yet
    now[0] += RELOAD_CHECK_S
    assert (status("old-key"), status("new-key")) == (401, 200)
    assert "API keys reloaded: 1 in force" in caplog.text
    keys.write_text("# emptied mid-update\n")
    os.utime(keys, ns=(1, 1))
    now[0] += RELOAD_CHECK_S
    assert status("new-key") == 200
    assert "keys in force stay" in caplog.text


@pytest.mark.parametrize(
    ("path", "shown"),
    [
        ("/v1/completions?api_key=sk-1", "/v1/completions?api_key=[redacted]"),
        ("/x?a=1&Token=t&b=2&api%5Fkey=k", "/x?a=1&Token=[redacted]&b=2&api%5Fkey=[redacted]"),
        ("/x?password=p&sig=s&debug", "/x?password=[redacted]&sig=[redacted]&debug"),
        ("/health", "/health"),
        ("/v1/models?limit=3", "/v1/models?limit=3"),
    ],
)
def test_secret_query_values_never_reach_the_access_line(path: str, shown: str) -> None:
    assert redacted_query(path) == shown
    record = logging.LogRecord(
        "uvicorn.access", logging.INFO, "", 0, '%s - "%s %s HTTP/%s" %d',
        ("127.0.0.1:1", "POST", path, "1.1", 401), None,
    )  # fmt: skip
    assert RedactedAccessLine().filter(record)
    assert record.getMessage() == f'127.0.0.1:1 - "POST {shown} HTTP/1.1" 401'
