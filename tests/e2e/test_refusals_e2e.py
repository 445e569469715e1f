"""Saturation is 503, quota is 429, on the real Truss server and through the openai SDK:
a replica with no slot and no queue place answers 503 with Retry-After (state `ready`: a
gateway retries another pod), which the SDK retries after exactly the Retry-After it was
given and, once a slot frees, gets served; an API key over `max_inflight_per_key` gets 429
with Retry-After, which the SDK retries and then raises as a RateLimitError, while another
key is served at the same time. Nothing is timed: the slot is freed only after the test has
seen a refusal counted."""

from __future__ import annotations

import logging
import threading
from typing import Any

import openai
import pytest
import requests

from tests.e2e.util import value, wait_for

pytestmark = pytest.mark.e2e

PREDICT = "/v1/models/model:predict"
KEYS = ("sk-tenant-a-0123456789", "sk-tenant-b-9876543210")
RETRY_LINE = "Retrying request in"


def hold_a_slot(url: str, key: str | None = None) -> tuple[requests.Response, Any]:
    """A long stream that keeps a slot until closed (its reader kept: dropping it closes)."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    stream = requests.post(
        url + PREDICT,
        json={"prompt": "busy", "max_new_tokens": 100_000, "streaming": True},
        headers=headers,
        stream=True,
        timeout=120,
    )
    reader = stream.iter_content(chunk_size=None)
    assert next(reader)
    return stream, reader


def retry_delays(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith(RETRY_LINE)]


def ask(sdk: openai.OpenAI) -> Any:
    return sdk.completions.create(model="m", prompt="hello", max_tokens=2, temperature=0)


def test_a_saturated_replica_is_503_and_the_sdk_retries_after_retry_after(
    start_server, caplog: pytest.LogCaptureFixture
) -> None:
    server = start_server(max_inflight=1, max_waiting=0)
    holder, _reader = hold_a_slot(server.url)
    sdk = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=2)
    with (
        caplog.at_level(logging.INFO, logger="openai"),
        pytest.raises(openai.InternalServerError) as caught,
    ):
        ask(sdk)
    answer = caught.value.response
    assert answer.status_code == 503
    assert answer.headers["retry-after"] == "1"
    assert answer.headers["x-server-state"] == "ready"  # saturated, not going away
    assert caught.value.code == "server_overloaded"
    # Two retries, each after the server's Retry-After (not the SDK's own backoff).
    assert retry_delays(caplog) == [
        f"{RETRY_LINE} 1.000000 seconds (retry 1 of 2)",
        f"{RETRY_LINE} 1.000000 seconds (retry 2 of 2)",
    ]
    assert value(server.url, "mtt:request_rejected_total", reason="queue_full") == 3
    # A client that keeps retrying is served once the slot frees.
    served: list[Any] = []
    patient = threading.Thread(target=lambda: served.append(ask(sdk.with_options(max_retries=50))))
    patient.start()
    wait_for(
        lambda: value(server.url, "mtt:request_rejected_total", reason="queue_full") >= 4,
        what="the patient client to be refused once",
    )
    holder.close()
    patient.join(300)
    assert served and served[0].choices[0].finish_reason in ("stop", "length")
    server.stop()


def test_a_key_over_its_limit_is_429_retried_then_raised_and_others_are_served(
    start_server, tmp_path, caplog: pytest.LogCaptureFixture
) -> None:
    keys = tmp_path / "api_keys"
    keys.write_text("\n".join(KEYS) + "\n")
    server = start_server(api_keys_file=str(keys), max_inflight_per_key=1)
    holder, _reader = hold_a_slot(server.url, KEYS[0])
    tenant_a = openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEYS[0], max_retries=1)
    with (
        caplog.at_level(logging.INFO, logger="openai"),
        pytest.raises(openai.RateLimitError) as caught,
    ):
        ask(tenant_a)
    answer = caught.value.response
    assert answer.status_code == 429 and answer.headers["retry-after"] == "1"
    assert "x-server-state" not in answer.headers  # a quota, not the server's state
    assert retry_delays(caplog) == [f"{RETRY_LINE} 1.000000 seconds (retry 1 of 1)"]
    assert value(server.url, "mtt:request_rejected_total", reason="key_limit") == 2
    tenant_b = openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEYS[1], max_retries=0)
    assert ask(tenant_b).choices[0].finish_reason in ("stop", "length")
    holder.close()
    wait_for(lambda: value(server.url, "mtt:num_requests_running") == 0, what="the slot")
    # Its place comes back when the held answer has ended (retries cover the moment between).
    again = tenant_a.with_options(max_retries=20)
    assert ask(again).choices[0].finish_reason in ("stop", "length")
    log = server.log()
    assert not any(key in log for key in KEYS)
    server.stop()
