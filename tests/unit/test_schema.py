"""PredictRequest: the article's defaults, and each bad body refused naming its field."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from mistral_serving.chat import ChatMessage
from mistral_serving.schema import MAX_STOP_STRINGS, PredictRequest, describe_validation_error


def test_article_defaults() -> None:
    req = PredictRequest(prompt="What is TensorRT?")
    assert req.prompt == "What is TensorRT?"
    assert req.messages is None
    assert req.max_new_tokens == 2048 and type(req.max_new_tokens) is int
    assert req.temperature == 0.9
    assert req.top_k == 1
    assert req.top_p == 0.0
    assert req.streaming is False
    assert req.streaming_interval == 3
    assert req.stop is None and req.seed is None
    assert (req.repetition_penalty, req.presence_penalty, req.frequency_penalty) == (1.0, 0.0, 0.0)
    assert req.model_dump() == {
        "prompt": "What is TensorRT?",
        "messages": None,
        "max_new_tokens": 2048,
        "temperature": 0.9,
        "top_k": 1,
        "top_p": 0.0,
        "streaming": False,
        "streaming_interval": 3,
        "stop": None,
        "seed": None,
        "repetition_penalty": 1.0,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
    }


def test_article_body_validates() -> None:
    body = {
        "prompt": "What is a GPU?",
        "max_new_tokens": 512,
        "temperature": 0.7,
        "top_k": 40,
        "top_p": 0.9,
        "streaming": True,
        "streaming_interval": 5,
    }
    req = PredictRequest.model_validate(body)
    assert req.model_dump(include=set(body)) == body


def test_messages_body() -> None:
    req = PredictRequest.model_validate(
        {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]}
    )
    assert req.prompt is None
    assert req.messages == [
        ChatMessage(role="system", content="s"),
        ChatMessage(role="user", content="u"),
    ]


def test_stop_string_becomes_list() -> None:
    assert PredictRequest(prompt="p", stop="###").stop == ["###"]
    assert PredictRequest(prompt="p", stop=["a", "b"]).stop == ["a", "b"]
    assert PredictRequest(prompt="p", stop=None).stop is None
    assert PredictRequest(prompt="p", stop=["x"] * MAX_STOP_STRINGS).stop == ["x"] * 16


def test_limits_accepted_at_the_edges() -> None:
    PredictRequest(
        prompt="",
        max_new_tokens=1,
        temperature=0.0,
        top_k=0,
        top_p=1.0,
        streaming_interval=1,
        seed=0,
        repetition_penalty=10.0,
        presence_penalty=-2.0,
        frequency_penalty=2.0,
    )
    PredictRequest(
        prompt="p", temperature=2.0, streaming_interval=1024, seed=2**63 - 1, stop=["x" * 256]
    )


BAD_BODIES: list[tuple[dict[str, Any], str]] = [
    ({"prompt": "p", "max_tokens": 5}, "max_tokens"),  # unknown field (a typo)
    ({"prompt": "p", "temprature": 0.5}, "temprature"),
    ({"prompt": 5}, "prompt"),
    ({"prompt": ["p"]}, "prompt"),
    ({"prompt": "p", "max_new_tokens": "lots"}, "max_new_tokens"),
    ({"prompt": "p", "max_new_tokens": 1.5}, "max_new_tokens"),
    ({"prompt": "p", "max_new_tokens": 0}, "max_new_tokens"),
    ({"prompt": "p", "max_new_tokens": -1}, "max_new_tokens"),
    ({"prompt": "p", "temperature": -0.1}, "temperature"),
    ({"prompt": "p", "temperature": 2.5}, "temperature"),
    ({"prompt": "p", "temperature": "hot"}, "temperature"),
    ({"prompt": "p", "top_k": -1}, "top_k"),
    ({"prompt": "p", "top_p": 1.5}, "top_p"),
    ({"prompt": "p", "top_p": -0.5}, "top_p"),
    ({"prompt": "p", "streaming": "maybe"}, "streaming"),
    ({"prompt": "p", "streaming_interval": 0}, "streaming_interval"),
    ({"prompt": "p", "streaming_interval": 1025}, "streaming_interval"),
    ({"prompt": "p", "seed": -1}, "seed"),
    ({"prompt": "p", "seed": 2**63}, "seed"),
    ({"prompt": "p", "repetition_penalty": 0}, "repetition_penalty"),
    ({"prompt": "p", "repetition_penalty": 11}, "repetition_penalty"),
    ({"prompt": "p", "presence_penalty": 3}, "presence_penalty"),
    ({"prompt": "p", "frequency_penalty": -2.5}, "frequency_penalty"),
    ({"prompt": "p", "stop": ["x"] * (MAX_STOP_STRINGS + 1)}, "stop"),
    ({"prompt": "p", "stop": ""}, "stop"),
    ({"prompt": "p", "stop": ["ok", ""]}, "stop"),
    ({"prompt": "p", "stop": ["x" * 257]}, "stop"),
    ({"prompt": "p", "stop": 5}, "stop"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "bot", "content": "x"}]}, "messages"),
    ({"messages": [{"role": "user"}]}, "messages"),
    ({"messages": [{"role": "user", "content": "x", "name": "n"}]}, "messages"),
    ({"messages": "hello"}, "messages"),
]


@pytest.mark.parametrize(
    ("body", "field"), BAD_BODIES, ids=[f"{i}-{f}" for i, (_, f) in enumerate(BAD_BODIES)]
)
def test_bad_body_names_the_field(body: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as info:
        PredictRequest.model_validate(body)
    text = describe_validation_error(info.value)
    assert text.startswith(field), text
    assert all(":" in part for part in text.split("; "))


def test_unknown_field_says_so() -> None:
    with pytest.raises(ValidationError) as info:
        PredictRequest.model_validate({"prompt": "p", "max_tokens": 5})
    assert describe_validation_error(info.value) == "max_tokens: unknown field"


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"max_new_tokens": 5},
        {"prompt": "p", "messages": [{"role": "user", "content": "u"}]},
    ],
)
def test_exactly_one_of_prompt_or_messages(body: dict[str, Any]) -> None:
    with pytest.raises(ValidationError) as info:
        PredictRequest.model_validate(body)
    text = describe_validation_error(info.value)
    assert "prompt" in text and "messages" in text
    assert not text.startswith("Value error")
    assert text.startswith("body: ")


def test_several_problems_are_all_reported() -> None:
    with pytest.raises(ValidationError) as info:
        PredictRequest.model_validate({"prompt": "p", "top_k": -1, "top_p": 2, "x": 1})
    parts = describe_validation_error(info.value).split("; ")
    assert sorted(p.split(":")[0] for p in parts) == ["top_k", "top_p", "x"]


@settings(max_examples=200, deadline=None)
@given(
    body=st.dictionaries(
        st.sampled_from(
            [
                "prompt",
                "max_new_tokens",
                "temperature",
                "top_k",
                "top_p",
                "seed",
                "streaming_interval",
                "stop",
                "bogus",
            ]
        ),
        st.one_of(
            st.none(),
            st.integers(-5, 3000),
            st.floats(allow_nan=True),
            st.text(max_size=3),
            st.lists(st.text(max_size=2), max_size=3),
            st.booleans(),
        ),
    )
)
def test_any_body_validates_or_is_described(body: dict[str, Any]) -> None:
    try:
        req = PredictRequest.model_validate(body)
    except ValidationError as exc:
        text = describe_validation_error(exc)
        fields = {p.split(":")[0].split(".")[0] for p in text.split("; ")}
        assert fields <= set(body) | {"body"}, text
        assert fields
    else:
        assert isinstance(req.prompt, str)
        assert req.max_new_tokens >= 1 and 0 <= req.temperature <= 2
        assert req.stop is None or all(isinstance(s, str) and s for s in req.stop)
