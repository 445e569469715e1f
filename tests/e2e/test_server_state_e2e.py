"""The lifecycle state header on the real Truss server: `starting` while the artifact is
still downloading (a stand-in Hub that holds its downloads), `ready` once loaded, and
`dead` on /health and on refusals once the engine process is gone. Nothing is timed: each
state is held by the test until it has been seen."""

from __future__ import annotations

import os
import signal

import pytest
import requests
from huggingface_hub import constants

from mistral_build.publish import push_artifact
from tests.e2e.test_engine_process_e2e import engine_processes
from tests.e2e.util import wait_for
from tests.hub_standin import HubStandIn

pytestmark = pytest.mark.e2e

STATE = "X-Server-State"
TOKEN = "hf_standin_secret_for_the_state_test_0123"
PREDICT = "/v1/models/model:predict"


def health(url: str) -> tuple[int, str | None] | None:
    """(status, state) of GET /health, or None while nothing listens."""
    try:
        r = requests.get(url + "/health", timeout=30)
    except requests.ConnectionError:
        return None
    return r.status_code, r.headers.get(STATE)


def test_a_loading_server_says_starting_then_ready(
    start_server, dev_model, tmp_path, monkeypatch
) -> None:
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)  # the stand-in speaks LFS
    with HubStandIn(token=TOKEN) as hub:
        pushed = push_artifact(dev_model, "acme/state-dev", token=TOKEN, endpoint=hub.url)
        hub.hold_downloads()  # load() waits on the Hub: the server stays loading
        server = start_server(
            wait=False,
            artifact="acme/state-dev",
            artifact_revision=pushed.commit_sha,
            cache_dir=str(tmp_path / "cache"),
            extra_env={
                "HF_ENDPOINT": hub.url,
                "HF_HUB_DISABLE_XET": "1",
                "TRUSS_SECRET_hf_access_token": TOKEN,
            },
        )
        wait_for(lambda: health(server.url) is not None, what="the listener")
        assert health(server.url) == (503, "starting")
        refused = requests.post(server.url + PREDICT, json={"prompt": "x"}, timeout=30)
        assert (refused.status_code, refused.headers[STATE]) == (503, "starting")
        hub.release_downloads()
        wait_for(lambda: health(server.url) == (200, "ready"), what="the load to finish")
    server.stop()


def test_a_dead_engine_says_dead(start_server) -> None:
    server = start_server(engine_process="on")
    assert health(server.url) == (200, "ready")
    (child,) = engine_processes(server.process.pid)
    os.kill(child, signal.SIGKILL)
    # Only this test probes: the first answer that is not ready is the one that found the
    # engine gone (and started the process's end), and it says why.
    seen: list[tuple[int, str | None] | None] = []
    wait_for(
        lambda: seen.append(health(server.url)) or seen[-1] != (200, "ready"),
        what="the engine's death to be seen",
    )
    assert seen[-1] == (503, "dead"), seen[-1]
    server.process.wait(120)
    assert "the engine is dead" in server.log()


def test_sigterm_says_draining_while_the_listener_is_still_open(start_server) -> None:
    """SIGTERM with a stream in flight: /health and new requests get 503 `draining` (the
    listener still answers), the stream runs to its end, and only later does the listener
    close."""
    server = start_server(drain_grace_seconds=60, drain_listen_seconds=15)
    stream = requests.post(
        server.url + PREDICT,
        json={"prompt": "busy", "max_new_tokens": 300, "streaming": True},
        stream=True,
        timeout=120,
    )
    reader = stream.iter_content(chunk_size=None)
    assert next(reader)
    server.process.send_signal(signal.SIGTERM)
    wait_for(lambda: health(server.url) != (200, "ready"), what="the drain to begin")
    assert health(server.url) == (503, "draining")  # answered: the listener is open
    refused = requests.post(server.url + PREDICT, json={"prompt": "late"}, timeout=30)
    assert (refused.status_code, refused.headers[STATE]) == (503, "draining")
    ready = requests.get(server.url + "/v1/models/model", timeout=30)  # the kubelet's probe
    assert (ready.status_code, ready.headers[STATE]) == (503, "draining")
    assert b"".join(reader)  # the stream in flight finished
    wait_for(lambda: health(server.url) is None, what="the listener to close")
    server.process.wait(120)
    assert server.log().count('"finish_reason": "length"') == 1


def test_the_deep_probe_sees_a_hung_engine_that_plain_health_does_not(start_server) -> None:
    """Process up, engine hung (its process stopped, nothing else pending): /health still
    says ready, /health/generate says dead within its deadline, and ready again once the
    engine moves."""
    server = start_server(
        engine_process="on",
        health_generate_timeout_seconds=2,
        engine_stall_unready_seconds=3600,  # the watchdog stays out of this test
        engine_stall_exit_seconds=3600,
    )
    deep = requests.get(server.url + "/health/generate", timeout=60)
    assert (deep.status_code, deep.headers[STATE]) == (200, "ready")
    (child,) = engine_processes(server.process.pid)
    os.kill(child, signal.SIGSTOP)
    try:
        deep = requests.get(server.url + "/health/generate", timeout=60)
        assert (deep.status_code, deep.headers[STATE]) == (503, "dead")
        assert deep.json()["reason"] == "no token within 2s"
        assert health(server.url) == (200, "ready")  # the plain probe cannot tell
    finally:
        os.kill(child, signal.SIGCONT)
    wait_for(
        lambda: requests.get(server.url + "/health/generate", timeout=60).status_code == 200,
        what="the engine to answer again",
    )
    assert "deep health probe failed: no token within 2s" in server.log()
    server.stop()
