"""API keys on the real Truss server: the openai SDK with a listed key is served, without
one (or with another) it gets OpenAI's 401, predict gets its own 401 shape, probes and
/metrics stay open, no key reaches the server's log, and a path spelled so that only
Truss's router matches it (a trailing `%0A`) gets no generation and no body read."""

from __future__ import annotations

import socket
from collections.abc import Callable
from pathlib import Path

import openai
import pytest
import requests

from mistral_build.local_server import LocalServer
from tests.e2e.util import wait_for

pytestmark = pytest.mark.e2e

KEYS = ("sk-first-key-0123456789", "sk-second-key-9876543210")


@pytest.fixture(scope="module")
def keys_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    keys = tmp_path_factory.mktemp("keys") / "api_keys"
    keys.write_text("# rotated keys\n" + "\n".join(KEYS) + "\n")
    return keys


@pytest.fixture(scope="module")
def guarded(start_server: Callable[..., object], keys_file: Path):
    return start_server(api_keys_file=str(keys_file))


def test_the_sdk_with_a_listed_key_is_served_and_without_one_is_refused(guarded) -> None:
    url = guarded.url  # type: ignore[attr-defined]
    for key in KEYS:
        sdk = openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)
        r = sdk.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=2, temperature=0
        )
        assert r.choices[0].finish_reason in ("stop", "length")
    wrong = openai.OpenAI(base_url=f"{url}/v1", api_key="sk-not-listed", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as caught:
        wrong.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert caught.value.status_code == 401
    assert caught.value.response.headers["www-authenticate"].startswith("Bearer")


def test_predict_refuses_in_its_own_shape_and_probes_stay_open(guarded) -> None:
    url = guarded.url  # type: ignore[attr-defined]
    r = requests.post(f"{url}/v1/models/model:predict", json={"prompt": "x"}, timeout=30)
    assert r.status_code == 401 and set(r.json()) == {"error"}
    ok = requests.post(
        f"{url}/v1/models/model:predict",
        json={"prompt": "x", "max_new_tokens": 2},
        headers={"Authorization": f"Bearer {KEYS[1]}"},
        timeout=60,
    )
    assert ok.status_code == 200, ok.text
    for path in ("/v1/models/model", "/health", "/metrics"):
        assert requests.get(url + path, timeout=30).status_code == 200, path
    in_query = "sk-sent-in-the-query-5150"
    r = requests.post(f"{url}/v1/completions?api_key={in_query}", json={}, timeout=30)
    assert r.status_code == 401
    assert requests.get(f"{url}/version?token={in_query}", timeout=30).status_code == 200
    log = guarded.log()  # type: ignore[attr-defined]
    assert not any(key in log for key in KEYS)
    assert "sk-not-listed" not in log
    assert "/version?token=[redacted]" in log  # the access line, without the value
    assert in_query not in log


BYPASSES = [
    "/v1/chat/completions%0A",
    "/v1/completions%0a",
    "/invocations%0A",
    "/v1/models/model:predict%0A",
    "/hot-reload%0A",
]


@pytest.mark.parametrize("path", BYPASSES)
def test_a_path_ending_in_an_encoded_newline_gets_past_no_guard(guarded, path: str) -> None:
    url = guarded.url  # type: ignore[attr-defined]
    body = {"messages": [{"role": "user", "content": "hi"}], "prompt": "hi", "max_tokens": 2}
    assert requests.post(url + path, json=body, timeout=30).status_code == 401
    auth = {"Authorization": f"Bearer {KEYS[0]}"}
    answer = requests.post(url + path, json=body, headers=auth, timeout=30)
    assert answer.status_code == 400, answer.text  # refused before any route
    assert "control character" in answer.json()["error"]["message"]
    # A body that never completes is not waited for: answered and closed at once.
    server: LocalServer = guarded
    for headers in (b"", b"Authorization: Bearer " + KEYS[0].encode() + b"\r\n"):
        with socket.create_connection(("127.0.0.1", server.port), timeout=60) as sock:
            sock.sendall(
                b"POST "
                + path.encode()
                + b" HTTP/1.1\r\nHost: x\r\n"
                + headers
                + b"Content-Length: 60000000\r\n\r\n{"
            )
            answer_bytes = b""
            while part := sock.recv(65536):  # to the server's close (a timeout: never)
                answer_bytes += part
        assert answer_bytes.startswith((b"HTTP/1.1 401 ", b"HTTP/1.1 400 ")), answer_bytes[:100]


def test_a_rotated_key_file_takes_effect_without_a_restart(guarded, keys_file: Path) -> None:
    """The file swapped as the kubelet updates a mounted Secret: the removed key is refused
    and the new one served, without a restart (then the keys are put back)."""
    url = guarded.url  # type: ignore[attr-defined]
    body = {"prompt": "x", "max_new_tokens": 2}

    def status(key: str) -> int:
        headers = {"Authorization": f"Bearer {key}"}
        path = f"{url}/v1/models/model:predict"
        return requests.post(path, json=body, headers=headers, timeout=60).status_code

    def swap(text: str) -> None:
        new = keys_file.with_suffix(".new")
        new.write_text(text)
        new.replace(keys_file)

    rotated = "sk-rotated-in-4242424242"
    try:
        swap(f"{KEYS[1]}\n{rotated}\n")
        wait_for(lambda: status(KEYS[0]) == 401, what="the removed key refused")
        assert status(rotated) == 200 and status(KEYS[1]) == 200
        assert "API keys reloaded" in guarded.log()  # type: ignore[attr-defined]
        assert rotated not in guarded.log()  # type: ignore[attr-defined]
    finally:
        swap("\n".join(KEYS) + "\n")
        wait_for(lambda: status(KEYS[0]) == 200, what="the keys put back")
