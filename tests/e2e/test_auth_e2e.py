"""API keys on the real Truss server: the openai SDK with a listed key is served, without
one (or with another) it gets OpenAI's 401, predict gets its own 401 shape, probes and
/metrics stay open, and no key reaches the server's log."""

from __future__ import annotations

from collections.abc import Callable

import openai
import pytest
import requests

pytestmark = pytest.mark.e2e

KEYS = ("sk-first-key-0123456789", "sk-second-key-9876543210")


@pytest.fixture(scope="module")
def guarded(start_server: Callable[..., object], tmp_path_factory: pytest.TempPathFactory):
    keys = tmp_path_factory.mktemp("keys") / "api_keys"
    keys.write_text("# rotated keys\n" + "\n".join(KEYS) + "\n")
    return start_server(api_keys_file=str(keys))


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
    log = guarded.log()  # type: ignore[attr-defined]
    assert not any(key in log for key in KEYS)
    assert "sk-not-listed" not in log
