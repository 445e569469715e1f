"""The predict route end to end, on the real Truss server with the dev model."""

from __future__ import annotations

import codecs
import json
import threading
import uuid

import pytest
import requests

from mistral_build.local_server import raw_post
from mistral_serving.text.tokenizer import load_tokenizer
from tests.e2e.util import aborted, value, wait_for, wait_idle

pytestmark = pytest.mark.e2e


def predict(url: str, **body) -> requests.Response:
    return requests.post(f"{url}/v1/models/model:predict", json=body, timeout=120)


def stream_chunks(url: str, **body) -> list[bytes]:
    with requests.post(
        f"{url}/v1/models/model:predict", json=body | {"streaming": True}, stream=True, timeout=120
    ) as r:
        assert r.status_code == 200, r.text
        return [c for c in r.iter_content(chunk_size=None) if c]


def test_predict_answers_with_output_finish_reason_and_usage(server_url, dev_model):
    prompt = "What is a mistral?"
    r = predict(server_url, prompt=prompt, max_new_tokens=16)
    assert r.status_code == 200, r.text
    body = r.json()
    assert set(body) == {"output", "finish_reason", "usage"}
    assert body["finish_reason"] == "length"
    tok = load_tokenizer(dev_model)
    assert body["usage"] == {
        "prompt_tokens": len(tok.encode(prompt, bos=True)),
        "completion_tokens": 16,
        "total_tokens": len(tok.encode(prompt, bos=True)) + 16,
    }
    assert body["output"] and r.headers["x-request-id"]


def test_defaults_are_greedy_and_deterministic(server_url):
    a = predict(server_url, prompt="Tell me a story", max_new_tokens=24).json()
    b = predict(server_url, prompt="Tell me a story", max_new_tokens=24).json()
    assert a == b


@pytest.mark.parametrize("interval", [1, 3, 7])
def test_streamed_chunks_join_to_the_non_streaming_output(server_url, interval):
    body = {"prompt": "Write about the sea", "max_new_tokens": 40, "streaming_interval": interval}
    expected = predict(server_url, **body).json()["output"]
    chunks = stream_chunks(server_url, **body)
    assert b"".join(chunks) == expected.encode()
    for chunk in chunks:  # no chunk splits a character
        chunk.decode("utf-8")


def test_streaming_keeps_non_ascii_text_intact(server_url):
    # The dev model's greedy output is meaningless but full of non-ASCII pieces; find
    # a prompt whose output has multi-byte characters and stream it one token a chunk.
    for i in range(20):
        body = {"prompt": f"Bonjour {i} 🤖 中文", "max_new_tokens": 48, "streaming_interval": 1}
        expected = predict(server_url, **body).json()["output"]
        if any(ord(c) > 127 for c in expected):
            break
    else:
        pytest.fail("no non-ASCII output found to test with")
    decoder = codecs.getincrementaldecoder("utf-8")()
    text = "".join(decoder.decode(c) for c in stream_chunks(server_url, **body))
    assert text + decoder.decode(b"", final=True) == expected
    assert "\ufffd" not in text or "\ufffd" in expected


def test_the_articles_client_snippets_work_unchanged(server_url):
    # The article's snippets: `requests.post(url, json=data).json()` and, streaming,
    # `for content in resp.iter_content(): print(content.decode("utf-8"), end="")`,
    # which decodes byte by byte and so only holds for ASCII text.
    url = f"{server_url}/v1/models/model:predict"
    for seed in range(100):
        data = {
            "prompt": "What is a mistral?",
            "max_new_tokens": 4,
            "top_k": 0,
            "temperature": 1.0,
            "seed": seed,
        }
        output = requests.post(url, json=data, timeout=60).json()["output"]
        if output.isascii():
            break
    else:
        pytest.fail("no ASCII output found to test the byte-by-byte snippet with")
    resp = requests.post(url, json=data | {"streaming": True}, stream=True, timeout=60)
    printed = "".join(content.decode("utf-8") for content in resp.iter_content())
    assert printed == output


def test_stop_string_ends_the_output_before_it(server_url):
    base = {"prompt": "Once upon a time", "max_new_tokens": 40}
    full = predict(server_url, **base).json()["output"]
    stop = full[len(full) // 2 : len(full) // 2 + 3]
    cut = full[: full.index(stop)]
    r = predict(server_url, **base, stop=[stop]).json()
    assert r["output"] == cut and r["finish_reason"] == "stop"
    streamed = b"".join(stream_chunks(server_url, **base, stop=stop, streaming_interval=1))
    assert streamed.decode() == cut


def test_chat_messages_are_encoded_like_mistral_common(server_url, dev_model):
    from mistral_common.protocol.instruct.messages import (
        AssistantMessage,
        SystemMessage,
        UserMessage,
    )
    from mistral_common.protocol.instruct.request import ChatCompletionRequest
    from mistral_common.tokens.tokenizers.mistral import MistralTokenizer

    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Why?"},
    ]
    r = predict(server_url, messages=messages, max_new_tokens=4)
    assert r.status_code == 200, r.text
    ref = MistralTokenizer.from_file(str(dev_model / "tokenizer.model")).encode_chat_completion(
        ChatCompletionRequest(
            messages=[
                SystemMessage(content="Be brief."),
                UserMessage(content="Hi"),
                AssistantMessage(content="Hello!"),
                UserMessage(content="Why?"),
            ]
        )
    )
    assert r.json()["usage"]["prompt_tokens"] == len(ref.tokens)


def test_seeded_sampling_is_reproducible(server_url):
    body = {"prompt": "Random words", "max_new_tokens": 24, "top_k": 0, "temperature": 1.0}
    a = predict(server_url, **body, seed=7).json()["output"]
    b = predict(server_url, **body, seed=7).json()["output"]
    c = predict(server_url, **body, seed=8).json()["output"]
    greedy = predict(server_url, prompt="Random words", max_new_tokens=24).json()["output"]
    assert a == b
    assert a != c or a != greedy


@pytest.mark.parametrize(
    "body, field",
    [
        ({"prompt": "x", "temperature": -1}, "temperature"),
        ({"prompt": "x", "top_p": 2}, "top_p"),
        ({"prompt": "x", "max_new_tokens": 0}, "max_new_tokens"),
        ({"prompt": "x", "streaming_interval": 0}, "streaming_interval"),
        ({"prompt": "x", "max_new_token": 5}, "max_new_token"),
        ({"prompt": 5}, "prompt"),
        ({}, "prompt"),
        ({"prompt": "x", "messages": [{"role": "user", "content": "y"}]}, "messages"),
        ({"messages": [{"role": "assistant", "content": "y"}]}, "user"),
        (
            {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]},
            "assistant",
        ),
        ({"messages": [{"role": "robot", "content": "y"}]}, "role"),
        ({"prompt": "x", "stop": [""]}, "stop"),
        ({"prompt": "x", "seed": -1}, "seed"),
    ],
)
def test_bad_bodies_get_a_400_naming_the_problem(server_url, body, field):
    r = predict(server_url, **body)
    assert r.status_code == 400, r.text
    assert field in r.json()["error"]


def test_malformed_json_is_a_400(server_url):
    r = requests.post(f"{server_url}/v1/models/model:predict", data=b"{not json", timeout=30)
    assert r.status_code == 400


def test_prompt_longer_than_the_engine_accepts_is_a_400(server_url):
    r = predict(server_url, prompt="hello " * 5000)  # the dev engine takes 4095 tokens
    assert r.status_code == 400
    assert "at most 4095 input tokens" in r.json()["error"]
    assert predict(server_url, prompt="still serving?", max_new_tokens=2).status_code == 200


def test_max_new_tokens_is_clamped_to_the_sequence_limit(server_url, dev_model):
    prompt = " ".join(["the"] * 4089)
    assert len(load_tokenizer(dev_model).encode(prompt, bos=True)) == 4090
    r = predict(server_url, prompt=prompt, max_new_tokens=2048)
    assert r.status_code == 200, r.text
    assert r.json()["usage"] == {
        "prompt_tokens": 4090,
        "completion_tokens": 6,
        "total_tokens": 4096,
    }
    assert r.json()["finish_reason"] == "length"


def test_request_id_is_taken_from_the_header_and_logged(server, server_url):
    rid = "test-" + uuid.uuid4().hex
    r = requests.post(
        f"{server_url}/v1/models/model:predict",
        json={"prompt": "x", "max_new_tokens": 3},
        headers={"X-Request-Id": rid},
        timeout=60,
    )
    assert r.headers["x-request-id"] == rid
    wait_for(lambda: rid in server.log(), what="the request's log line")
    line = next(json.loads(x) for x in server.log().splitlines() if rid in x and '"event"' in x)
    assert line["route"] == "predict" and line["output_tokens"] == 3
    assert line["finish_reason"] == "length" and "prompt" not in line  # text is not logged


def _open_streams(url: str, n: int, max_new_tokens: int):
    responses = [
        requests.post(
            f"{url}/v1/models/model:predict",
            stream=True,
            timeout=120,
            json={
                "prompt": f"stream {i}",
                "max_new_tokens": max_new_tokens,
                "streaming": True,
                "streaming_interval": 1,
            },
        )
        for i in range(n)
    ]
    # Keep each chunk iterator alive: closing it (even by garbage collection) makes
    # urllib3 close the connection, which the server rightly treats as a disconnect.
    readers = [r.iter_content(chunk_size=None) for r in responses]
    firsts = [next(reader) for reader in readers]
    return responses, readers, firsts


def test_sixteen_streams_are_generated_together(server_url):
    # Each of 16 streams has produced text while all 16 are still open: the engine is
    # running them at once (not one after another).
    wait_idle(server_url)
    before = aborted(server_url)
    responses, _readers, firsts = _open_streams(server_url, 16, 2048)
    try:
        assert all(firsts)
        assert value(server_url, "mtt:num_requests_running") == 16
    finally:
        for r in responses:
            r.close()
    wait_for(
        lambda: value(server_url, "mtt:num_requests_running") == 0, what="streams to be aborted"
    )
    assert aborted(server_url) - before == 16


def test_concurrent_greedy_answers_equal_sequential_ones(server_url):
    prompts = [f"Question number {i}: why?" for i in range(8)]
    sequential = [
        predict(server_url, prompt=p, max_new_tokens=20).json()["output"] for p in prompts
    ]
    results: dict[int, str] = {}

    def run(i: int) -> None:
        results[i] = b"".join(
            stream_chunks(server_url, prompt=prompts[i], max_new_tokens=20)
        ).decode()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert [results[i] for i in range(8)] == sequential


def test_client_disconnect_mid_stream_aborts_the_engine_request(server_url):
    wait_idle(server_url)
    before = aborted(server_url)
    r = requests.post(
        f"{server_url}/v1/models/model:predict",
        stream=True,
        timeout=60,
        json={"prompt": "long", "max_new_tokens": 4000, "streaming": True},
    )
    assert next(r.iter_content(chunk_size=None))
    r.close()
    wait_for(lambda: aborted(server_url) == before + 1, what="the abort")
    wait_for(lambda: value(server_url, "mtt:num_requests_running") == 0, what="a free engine")
    assert predict(server_url, prompt="after", max_new_tokens=2).status_code == 200


def test_a_client_that_leaves_a_silent_stream_is_noticed_without_a_write(start_server):
    """The connection itself tells a stream that its client left: with the replay
    engine's steps a minute apart, a client that leaves after the response's headers is
    aborted before the next step, not when a later write to the closed socket fails."""
    server = start_server(engine="replay", replay_step_ms=60_000)
    try:
        r = requests.post(
            f"{server.url}/v1/models/model:predict",
            stream=True,
            timeout=60,
            json={"prompt": "long", "max_new_tokens": 100, "streaming": True},
        )
        assert r.status_code == 200  # the headers: the stream has started
        wait_for(lambda: value(server.url, "mtt:num_requests_running") == 1, what="the request")
        r.close()
        wait_for(lambda: aborted(server.url) == 1, what="the abort")
        assert value(server.url, "mtt:num_requests_running") == 0
        # The one step that may have run at once, never the next (a minute later).
        assert value(server.url, "mtt:generation_tokens_total") <= 1
    finally:
        server.stop()


def test_client_disconnect_during_a_non_streaming_request_aborts_it(server_url):
    wait_idle(server_url)
    before = aborted(server_url)
    body = {"prompt": "long", "max_new_tokens": 4000}
    with raw_post(server_url, "/v1/models/model:predict", body):
        wait_for(
            lambda: value(server_url, "mtt:num_requests_running") == 1, what="the request to start"
        )
    wait_for(lambda: aborted(server_url) == before + 1, what="the abort")
    assert predict(server_url, prompt="after", max_new_tokens=2).status_code == 200
