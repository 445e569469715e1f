"""The OpenAI-compatible routes, driven by the official `openai` SDK, unchanged, against
the real Truss server with the dev model."""

from __future__ import annotations

import asyncio

import openai
import pytest
import requests

pytestmark = pytest.mark.e2e

MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is a mistral? 🌬️"},
]


@pytest.fixture(scope="module")
def client(server_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server_url}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def aclient(server_url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{server_url}/v1", api_key="unused", max_retries=0)


def predict_output(server_url: str, **body) -> dict:
    return requests.post(f"{server_url}/v1/models/model:predict", json=body, timeout=60).json()


def test_chat_completion_has_openais_shape_and_the_same_text_as_predict(client, server_url):
    r = client.chat.completions.create(
        model="anything", messages=MESSAGES, max_tokens=12, temperature=0
    )
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-")
    assert r.model == "mistral-7b-instruct"  # the served name, whatever was asked
    choice = r.choices[0]
    assert choice.message.role == "assistant" and choice.finish_reason == "length"
    same = predict_output(server_url, messages=MESSAGES, max_new_tokens=12)
    assert choice.message.content == same["output"]
    assert r.usage.model_dump() == same["usage"] | {
        "completion_tokens_details": None,
        "prompt_tokens_details": None,
    }


def test_streamed_chat_deltas_join_to_the_non_streamed_message(client):
    full = (
        client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=30, temperature=0)
        .choices[0]
        .message.content
    )
    chunks = list(
        client.chat.completions.create(
            model="m",
            messages=MESSAGES,
            max_tokens=30,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full
    finals = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finals[-1] == "length" and set(finals[:-1]) == {None}
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 30


def test_completions_route_streaming_and_not(client, server_url):
    r = client.completions.create(
        model="m", prompt="Once upon a time", max_tokens=10, temperature=0
    )
    assert r.object == "text_completion" and r.choices[0].finish_reason == "length"
    assert (
        r.choices[0].text
        == predict_output(server_url, prompt="Once upon a time", max_new_tokens=10)["output"]
    )
    streamed = "".join(
        c.choices[0].text
        for c in client.completions.create(
            model="m", prompt="Once upon a time", max_tokens=10, temperature=0, stream=True
        )
    )
    assert streamed == r.choices[0].text
    assert r.usage.completion_tokens == 10


def test_completions_default_max_tokens_is_openais_16(client):
    assert client.completions.create(model="m", prompt="hi").usage.completion_tokens == 16


def test_stop_strings_through_the_sdk(client):
    full = (
        client.completions.create(model="m", prompt="Tell me", max_tokens=30, temperature=0)
        .choices[0]
        .text
    )
    stop = full[10:13]
    r = client.completions.create(
        model="m", prompt="Tell me", max_tokens=30, temperature=0, stop=[stop]
    )
    assert r.choices[0].text == full[: full.index(stop)] and r.choices[0].finish_reason == "stop"


def test_async_client_streams_concurrently(aclient):
    async def one(i: int) -> str:
        stream = await aclient.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": f"q{i}"}],
            max_tokens=8,
            temperature=0,
            stream=True,
        )
        return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])

    async def main() -> list[str]:
        return await asyncio.gather(*[one(i) for i in range(6)])

    texts = asyncio.run(main())
    assert len(texts) == 6 and all(texts)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"n": 2}, "n"),
        ({"tools": [{"type": "function", "function": {"name": "f b"}}]}, "tools[0].function.name"),
        ({"top_logprobs": 2}, "top_logprobs"),  # without logprobs: true
        ({"response_format": {"type": "xml"}}, "response_format.type"),
        ({"logit_bias": {"1": 1}}, "logit_bias"),
        ({"temperature": 5}, "temperature"),
    ],
)
def test_unsupported_or_bad_fields_raise_the_sdks_bad_request_error(client, kwargs, field):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=4, **kwargs)
    assert info.value.status_code == 400
    assert field in info.value.message
    assert info.value.body["param"] == field and info.value.body["type"] == "invalid_request_error"


def test_a_prompt_longer_than_the_engine_takes_is_a_400(client):
    with pytest.raises(openai.BadRequestError, match="input tokens"):
        client.completions.create(model="m", prompt="hello " * 5000, max_tokens=4)


def test_a_bad_conversation_is_a_400(client):
    with pytest.raises(openai.BadRequestError, match="assistant"):
        client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}],
        )
