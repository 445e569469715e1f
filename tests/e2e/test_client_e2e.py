"""The client against the REAL Truss server with the dev model (tiny random weights, real
Mistral tokenizer): its text is meaningless, so the tests hold properties with greedy
requests, never particular words."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from client import BadRequestError, Client, ClientConnectionError, ClientTimeoutError

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
GREEDY = {"top_k": 1, "seed": 0}
PROMPTS = [
    "What is a mistral?",
    "Écris un poème sur le vent 🌬️",
    "日本語で風について教えて",
    "Ünïcödé – “quotes” and emoji 🙂👩‍💻",
    "Расскажи о ветре",
]


@pytest.mark.parametrize("interval", [1, 3])
def test_stream_joined_equals_predict_output(server_url: str, interval: int) -> None:
    with Client(server_url, timeout=120) as client:
        for prompt in PROMPTS[:2]:
            done = client.predict(prompt, max_new_tokens=24, **GREEDY)
            stream = client.stream(prompt, max_new_tokens=24, streaming_interval=interval, **GREEDY)
            pieces = list(stream)
            assert "".join(pieces) == done.output
            assert done.finish_reason in ("stop", "length")
            assert done.usage is not None
            assert done.usage.completion_tokens <= 24
            assert (
                done.usage.total_tokens == done.usage.prompt_tokens + done.usage.completion_tokens
            )
            # With streaming_interval=1 each chunk is at most one generation step apart,
            # so there are never more text chunks than tokens.
            assert stream.state.chunks <= max(1, done.usage.completion_tokens)


def test_non_ascii_text_arrives_intact(server_url: str) -> None:
    """Random weights over a 32k vocabulary produce plenty of non-ASCII tokens (CJK,
    Cyrillic, byte-fallback pieces of emoji); the stream must carry them byte-exact."""
    non_ascii_seen = False
    with Client(server_url, timeout=120) as client:
        for prompt in PROMPTS:
            done = client.predict(prompt, max_new_tokens=48, **GREEDY)
            streamed = "".join(
                client.stream(prompt, max_new_tokens=48, streaming_interval=1, **GREEDY)
            )
            # The client decodes strictly: bytes damaged on the way would raise. (A U+FFFD
            # can still be in the text: random weights emit byte tokens that form no valid
            # character, and the server itself renders those as U+FFFD, identically in
            # both modes, which the equality checks.)
            assert streamed == done.output
            non_ascii_seen = non_ascii_seen or any(127 < ord(c) != 0xFFFD for c in streamed)
    assert non_ascii_seen, "no non-ASCII text generated: the test did not exercise decoding"


def test_raw_stream_chunks_each_decode_alone(server_url: str) -> None:
    """The contract: no chunk splits a character (checked on the server's own chunks)."""
    body = {
        "prompt": PROMPTS[2],
        "max_new_tokens": 48,
        "streaming": True,
        "streaming_interval": 1,
        **GREEDY,
    }
    with httpx.stream(
        "POST", f"{server_url}/v1/models/model:predict", json=body, timeout=120
    ) as resp:
        assert resp.status_code == 200
        for chunk in resp.iter_raw():
            chunk.decode("utf-8")  # raises if a read ended inside a character


def test_chat_predict_route(server_url: str) -> None:
    msgs = [{"role": "user", "content": "Hello, who are you?"}]
    with Client(server_url, timeout=120) as client:
        done = client.chat(msgs, max_new_tokens=16, **GREEDY)
        assert "".join(client.chat_stream(msgs, max_new_tokens=16, **GREEDY)) == done.output
        assert done.usage is not None and done.usage.prompt_tokens > 5


@pytest.mark.parametrize("api", ["predict", "openai"])
def test_server_error_message_is_surfaced(server_url: str, api: str) -> None:
    with Client(server_url, timeout=60, api=api) as client:
        with pytest.raises(BadRequestError) as info:
            client.predict("hi", temperature=-1, max_new_tokens=4)
        assert 400 <= info.value.status < 500
        assert "temperature" in info.value.message
        with pytest.raises(BadRequestError) as info:
            client.stream("hi", temperature=-1, max_new_tokens=4)
        assert "temperature" in info.value.message
        # ... and the server keeps serving.
        assert client.predict("hi", max_new_tokens=2, top_k=1).usage is not None


def test_wait_until_ready_on_a_starting_server(start_server: Callable[..., object]) -> None:
    server = start_server(wait=False)
    with Client(server.url, timeout=30, retries=0) as client:  # type: ignore[attr-defined]
        waited = client.wait_until_ready(timeout=180, interval=0.2)
        assert waited > 0.2  # it really waited: a fresh server needs seconds to load
        done = client.predict("ready?", max_new_tokens=3, **GREEDY)
        assert done.usage is not None and done.usage.completion_tokens >= 1


def test_wait_until_ready_returns_at_once_when_ready(server_url: str) -> None:
    with Client(server_url) as client:
        # Ready at the first probe: it returns before its first pause between probes.
        assert client.wait_until_ready(timeout=300, interval=120) < 120


def test_nothing_listening_is_a_connection_error() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with Client(f"http://127.0.0.1:{port}", retries=1, backoff=0.01) as client:
        with pytest.raises(ClientConnectionError):
            client.predict("x")
        with pytest.raises(ClientTimeoutError):
            client.wait_until_ready(timeout=0.5, interval=0.1)


@pytest.mark.parametrize("chat", [False, True])
def test_openai_routes_stream_equals_non_stream_with_usage(server_url: str, chat: bool) -> None:
    with Client(server_url, timeout=120, api="openai") as client:
        kw = (
            {"messages": [{"role": "user", "content": PROMPTS[1]}]}
            if chat
            else {"prompt": PROMPTS[1]}
        )
        done = client.predict(**kw, max_new_tokens=24, temperature=0.0, seed=0)
        stream = client.stream(**kw, max_new_tokens=24, temperature=0.0, seed=0)
        assert "".join(stream) == done.output
        assert stream.usage is not None and stream.usage == done.usage
        assert stream.finish_reason == done.finish_reason


def test_openai_sdk_sees_the_same_text(server_url: str) -> None:
    """Our client and the official SDK agree on the OpenAI route."""
    openai = pytest.importorskip("openai")
    sdk = openai.OpenAI(base_url=f"{server_url}/v1", api_key="unused", max_retries=0)
    with Client(server_url, timeout=120, api="openai") as client:
        ours = client.predict("Bonjour 🙂", max_new_tokens=16, temperature=0.0, seed=0)
        theirs = sdk.completions.create(
            model=client.model or "model",
            prompt="Bonjour 🙂",
            max_tokens=16,
            temperature=0.0,
            seed=0,
        )
    assert theirs.choices[0].text == ours.output


def test_cli_stream_prints_the_generated_text(server_url: str) -> None:
    with Client(server_url, timeout=120) as client:
        expected = client.predict("What is a mistral?", max_new_tokens=16, **GREEDY).output
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONIOENCODING="utf-8")
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "client",
            "What is a mistral?",
            "--stream",
            "--url",
            server_url,
            "--max-new-tokens",
            "16",
            "--top-k",
            "1",
            "--seed",
            "0",
        ],
        capture_output=True,
        text=True,
        encoding="utf-8",
        env=env,
        timeout=120,
        cwd=ROOT,
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout == expected + "\n"
    res = subprocess.run(
        [sys.executable, "-m", "client", "hi", "--url", server_url, "--temperature", "-1"],
        capture_output=True,
        text=True,
        encoding="utf-8",
        env=env,
        timeout=120,
        cwd=ROOT,
    )
    assert res.returncode == 1 and "temperature" in res.stderr
