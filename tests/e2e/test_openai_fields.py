"""The request fields tools send, through the real server and the openai SDK:
logprobs (checked against a separate HF forward pass of the dev model), structured
output (response_format), ignore_eos and min_tokens."""

from __future__ import annotations

import json
import math
from pathlib import Path

import jsonschema
import pytest
import torch
from openai import OpenAI
from transformers import AutoModelForCausalLM

from mistral_serving.text.chat import ChatMessage, encode_chat
from mistral_serving.text.tokenizer import load_tokenizer

pytestmark = pytest.mark.e2e

SCHEMA = {
    "type": "object",
    "properties": {
        "answer": {"type": "string", "enum": ["yes", "no"]},
        "confidence": {"type": "integer", "minimum": 0, "maximum": 9},
    },
    "required": ["answer", "confidence"],
    "additionalProperties": False,
}
RESPONSE_FORMAT = {"type": "json_schema", "json_schema": {"name": "verdict", "schema": SCHEMA}}
MESSAGES = [{"role": "user", "content": "Is a mistral a wind? Answer in JSON."}]


@pytest.fixture(scope="module")
def client(server_url: str) -> OpenAI:
    return OpenAI(base_url=server_url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def reference(dev_model: Path):
    return AutoModelForCausalLM.from_pretrained(dev_model, torch_dtype=torch.float32).eval()


def log_softmax_at(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float()
    return torch.log_softmax(logits, dim=-1)


def test_chat_logprobs_match_a_separate_forward_pass(client, dev_model, reference) -> None:
    r = client.chat.completions.create(
        model="m", messages=MESSAGES, max_tokens=6, temperature=0, logprobs=True, top_logprobs=3
    )
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens == 6
    tok = load_tokenizer(dev_model)
    prompt = encode_chat([ChatMessage(**m) for m in MESSAGES], tok)
    ids = list(prompt)
    for entry in content:
        row = log_softmax_at(reference, ids)[-1]
        best = int(row.argmax())
        assert bytes(entry.bytes) == tok.table.token_bytes[best]  # greedy: the argmax
        assert math.isclose(entry.logprob, float(row[best]), abs_tol=1e-3)
        top = torch.topk(row, 3)
        assert [round(t.logprob, 3) for t in entry.top_logprobs] == [
            round(float(v), 3) for v in top.values
        ]
        assert [bytes(t.bytes) for t in entry.top_logprobs] == [
            tok.table.token_bytes[int(i)] for i in top.indices
        ]
        ids.append(best)


def test_completion_logprobs_shape_streaming_and_not(client) -> None:
    r = client.completions.create(
        model="m", prompt="Hello", max_tokens=5, temperature=0, logprobs=2
    )
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 5
    assert "".join(lp.tokens) == r.choices[0].text
    assert all(len(t) <= 2 and all(v <= 0 for v in t.values()) for t in lp.top_logprobs)
    assert lp.text_offset[0] == 0
    streamed = list(
        client.completions.create(
            model="m", prompt="Hello", max_tokens=5, temperature=0, logprobs=2, stream=True
        )
    )
    tokens = [
        t
        for c in streamed
        if c.choices and c.choices[0].logprobs
        for t in c.choices[0].logprobs.tokens
    ]
    assert tokens == lp.tokens


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_json_schema_output_always_validates(client, temperature, seed) -> None:
    r = client.chat.completions.create(
        model="m",
        messages=MESSAGES,
        max_tokens=64,
        temperature=temperature,
        seed=seed,
        response_format=RESPONSE_FORMAT,
    )
    jsonschema.validate(json.loads(r.choices[0].message.content), SCHEMA)
    assert r.choices[0].finish_reason == "stop"


def test_structured_streaming_joins_to_the_same_json(client) -> None:
    kwargs = dict(
        model="m", messages=MESSAGES, max_tokens=64, temperature=0, response_format=RESPONSE_FORMAT
    )
    whole = client.chat.completions.create(**kwargs).choices[0].message.content
    chunks = client.chat.completions.create(stream=True, **kwargs)
    joined = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert joined == whole
    jsonschema.validate(json.loads(joined), SCHEMA)


def test_json_object_mode_gives_an_object_prefix(client) -> None:
    r = client.chat.completions.create(
        model="m",
        messages=MESSAGES,
        max_tokens=24,
        temperature=0,
        response_format={"type": "json_object"},
    )
    assert r.choices[0].message.content.startswith("{")


def test_an_unusable_schema_is_a_400(client) -> None:
    import openai

    with pytest.raises(openai.BadRequestError, match="response_format"):
        client.chat.completions.create(
            model="m",
            messages=MESSAGES,
            max_tokens=4,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "nonsense"}},
            },
        )


def test_ignore_eos_and_min_tokens(client) -> None:
    r = client.completions.create(
        model="m", prompt="Hi", max_tokens=12, temperature=0, extra_body={"ignore_eos": True}
    )
    assert r.usage.completion_tokens == 12 and r.choices[0].finish_reason == "length"
    r = client.completions.create(
        model="m", prompt="Hi", max_tokens=12, temperature=0, extra_body={"min_tokens": 12}
    )
    assert r.usage.completion_tokens == 12
