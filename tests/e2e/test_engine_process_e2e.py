"""The real Truss server with the PyTorch engine in its own process (`engine_process: on`):
the same answers as the in-process server, streaming equal to non-streaming; a killed
engine process stops the server; a stopped server leaves no engine process behind."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
import requests

from tests.e2e.util import unready, wait_for
from tests.processes import alive

pytestmark = pytest.mark.e2e

BODY = {"prompt": "Write about the sea", "max_new_tokens": 40}


def engine_processes(server_pid: int) -> list[int]:
    """Engine worker processes in the server's process group (it has its own session)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue  # gone meanwhile
        pgrp = int(stat.rsplit(")", 1)[1].split()[2])
        if pgrp == server_pid and b"mistral_gpu_fallback.process.worker" in cmdline:
            found.append(int(entry.name))
    return found


def predict(url: str, **body) -> dict:
    r = requests.post(f"{url}/v1/models/model:predict", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def streamed(url: str, **body) -> str:
    with requests.post(
        f"{url}/v1/models/model:predict", json=body | {"streaming": True}, stream=True, timeout=120
    ) as r:
        assert r.status_code == 200, r.text
        return b"".join(r.iter_content(chunk_size=None)).decode()


def test_the_server_answers_the_same_with_the_engine_in_its_own_process(start_server, server_url):
    server = start_server(engine_process="on")
    try:
        assert len(engine_processes(server.process.pid)) == 1
        own = predict(server.url, **BODY)
        assert own["output"] == predict(server_url, **BODY)["output"]  # the in-process server
        assert streamed(server.url, **BODY) == own["output"]
        schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
        chat = requests.post(
            f"{server.url}/v1/chat/completions",
            json={
                "messages": [{"role": "user", "content": "JSON please"}],
                "max_tokens": 64,
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": schema},
                },
            },
            timeout=120,
        )
        assert chat.status_code == 200, chat.text
        assert isinstance(json.loads(chat.json()["choices"][0]["message"]["content"])["ok"], bool)
    finally:
        server.stop()
    assert server.process.returncode is not None


def test_a_killed_engine_process_stops_the_server(start_server):
    server = start_server(engine_process="on")
    (child,) = engine_processes(server.process.pid)
    os.kill(child, signal.SIGKILL)
    # The health check sees the dead engine, the server drains and exits (Kubernetes
    # restarts the pod); what clients get meanwhile is a refusal, never a hang.
    wait_for(lambda: unready(server.url), what="the server to report unhealthy")
    server.process.wait(120)
    assert "the engine process was killed by SIGKILL" in server.log()


def test_a_stopped_server_leaves_no_engine_process(start_server):
    server = start_server(engine_process="on")
    (child,) = engine_processes(server.process.pid)
    assert predict(server.url, **BODY)["output"]
    server.stop(signal.SIGTERM)
    wait_for(lambda: not alive(child), what="the engine process to exit")
    # The engine process logs in the server's format (JSON lines), and it said goodbye.
    lines = [line for line in server.log().splitlines() if "[engine process]" in line]
    assert any("engine process exiting" in json.loads(line)["message"] for line in lines)


def test_the_replay_engine_serves_the_same_from_its_own_process(start_server):
    """engine=replay with engine_process=on: the serving layer over the engine process's
    IPC, as the benchmark runs it, answers exactly as the in-process replay engine."""
    body = {"prompt": "Write about the sea", "max_new_tokens": 24}
    completion = {"model": "x", "prompt": "Write about the sea", "max_tokens": 24, "logprobs": 2}
    replay = {"engine": "replay", "replay_step_ms": 1}
    own = start_server(engine_process="on", **replay)
    local = start_server(**replay)
    try:
        assert len(engine_processes(own.process.pid)) == 1
        assert engine_processes(local.process.pid) == []
        answer = predict(own.url, **body)
        assert answer == predict(local.url, **body)
        assert answer["output"] and streamed(own.url, **body) == answer["output"]
        choices = [
            requests.post(f"{url}/v1/completions", json=completion, timeout=120).json()["choices"]
            for url in (own.url, local.url)
        ]
        assert choices[0] == choices[1] and choices[0][0]["logprobs"]["tokens"]
        version = requests.get(f"{own.url}/version", timeout=30).json()
        assert version["engine"] == "replay"
        assert version["details"]["engine_process"] in engine_processes(own.process.pid)
    finally:
        own.stop()
        local.stop()
