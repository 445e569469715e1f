"""API keys from the Truss secret `api_keys` (found as Truss finds a secret: the file under
/secrets, else TRUSS_SECRET_api_keys), alone or with `api_keys_file`."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from mistral_serving.http import auth
from mistral_serving.http.auth import ApiKeyError, configured_keys, secret_text
from mistral_serving.http.frontend import Frontend
from mistral_serving.http.server import extend
from mistral_serving.ops.metrics import Metrics
from mistral_serving.settings import Settings


def test_the_mounted_secret_wins_over_the_variable_as_in_truss(tmp_path: Path) -> None:
    env = {"TRUSS_SECRET_api_keys": "from-env"}
    assert secret_text(mount_dir=tmp_path, env=env) == "from-env"
    (tmp_path / "api_keys").write_text("from-file\n")
    assert secret_text(mount_dir=tmp_path, env=env) == "from-file\n"


def test_an_empty_secret_is_unset_as_in_truss(tmp_path: Path) -> None:
    assert secret_text(mount_dir=tmp_path, env={"TRUSS_SECRET_api_keys": ""}) is None
    assert configured_keys("", tmp_path, {"TRUSS_SECRET_api_keys": ""}) == ()


def test_keys_of_the_file_and_the_secret_are_all_accepted(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text("file-key\nshared\n")
    env = {"TRUSS_SECRET_api_keys": "# rotated\nsecret-key\nshared\n"}
    assert configured_keys(str(keys), tmp_path, env) == (b"file-key", b"shared", b"secret-key")


@pytest.mark.parametrize("text", ["# only a comment\n", "   \n", "b" * 5000, "two words"])
def test_a_secret_without_a_usable_key_refuses_in_one_line_without_the_key(
    tmp_path: Path, text: str
) -> None:
    with pytest.raises(ApiKeyError) as err:
        configured_keys("", tmp_path, {"TRUSS_SECRET_api_keys": text})
    message = str(err.value)
    assert "\n" not in message and "secret 'api_keys'" in message
    assert "bbbb" not in message and "words" not in message


@hsettings(max_examples=60, deadline=None)
@given(st.text(max_size=200))
def test_any_secret_text_gives_keys_or_a_one_line_refusal(text: str) -> None:
    try:
        keys = configured_keys("", Path("/nonexistent"), {"TRUSS_SECRET_api_keys": text})
    except ApiKeyError as err:
        assert "\n" not in str(err)
    else:
        assert all(k and b" " not in k and b"\n" not in k for k in keys)


def test_the_server_guards_the_routes_with_the_secret_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(auth, "SECRETS_MOUNT_DIR", tmp_path)
    (tmp_path / "api_keys").write_text("sk-from-secret\n")
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat() -> dict[str, str]:
        return {"ok": "chat"}

    frontend = Frontend(Settings(), Metrics(CollectorRegistry()))  # no api_keys_file
    client = TestClient(extend(app, frontend))
    refused = client.post("/v1/chat/completions", json={})
    assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer"
    ok = client.post(
        "/v1/chat/completions", json={}, headers={"Authorization": "Bearer sk-from-secret"}
    )
    assert ok.status_code == 200
