"""The predict route's format: the article's defaults, aliases, strict types, refusals by
field name, the answer and stream bodies, and any body giving a call or a RequestError."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mistral_serving.engines.base import SamplingOptions
from mistral_serving.errors import RequestError
from mistral_serving.generation.outcome import Outcome
from mistral_serving.protocols import ParseContext, TruncatedStream
from mistral_serving.protocols.fields import MAX_STOP_STRINGS
from mistral_serving.protocols.predict import ALIASES, PredictCall, PredictFormat
from mistral_serving.text.chat import ChatMessage
from tests.doubles.generations import scripted

CTX = ParseContext(default_max_tokens=2048)
FMT = PredictFormat()

JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=12,
)
FIELDS = [
    "prompt",
    "messages",
    "max_new_tokens",
    "max_tokens",
    "temperature",
    "top_k",
    "top_p",
    "streaming",
    "stream",
    "streaming_interval",
    "stop",
    "seed",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
]


def parse(body: dict[str, Any]) -> PredictCall:
    return FMT.parse(body, CTX)


def refusal(body: dict[str, Any]) -> RequestError:
    with pytest.raises(RequestError) as err:
        parse(body)
    assert err.value.status == 400
    return err.value


# ---- defaults and options ----


def test_article_defaults() -> None:
    call = parse({"prompt": "What is TensorRT?"})
    gen = call.gen
    assert gen.prompt == "What is TensorRT?"
    assert gen.messages is None and gen.prompt_ids is None
    assert gen.param == "prompt"
    assert call.stream is False
    assert gen.interval == 3
    assert gen.stop == ()
    # max_new_tokens 2048 (clamped later by the service), temperature 0.9, greedy, top_p
    # 0 meaning off (1.0 for the engines).
    assert gen.sampling == SamplingOptions(
        max_new_tokens=2048, temperature=0.9, top_k=1, top_p=1.0, seed=None
    )
    assert type(gen.sampling.max_new_tokens) is int


def test_article_body_is_mapped() -> None:
    body = {
        "prompt": "What is a GPU?",
        "max_new_tokens": 512,
        "temperature": 0.7,
        "top_k": 40,
        "top_p": 0.9,
        "streaming": True,
        "streaming_interval": 5,
    }
    call = parse(body)
    s = call.gen.sampling
    assert (s.max_new_tokens, s.temperature, s.top_k, s.top_p) == (512, 0.7, 40, 0.9)
    assert (call.stream, call.gen.interval) == (True, 5)


def test_every_option_reaches_the_sampling_options() -> None:
    call = parse(
        {
            "prompt": "hi",
            "max_new_tokens": 5,
            "temperature": 0.2,
            "top_k": 40,
            "seed": 7,
            "repetition_penalty": 1.1,
            "presence_penalty": 0.5,
            "frequency_penalty": -0.5,
            "stop": "END",
            "streaming_interval": 2,
        }
    )
    assert call.gen.sampling == SamplingOptions(
        max_new_tokens=5,
        temperature=0.2,
        top_k=40,
        top_p=1.0,
        seed=7,
        repetition_penalty=1.1,
        presence_penalty=0.5,
        frequency_penalty=-0.5,
    )
    assert call.gen.stop == ("END",)
    assert call.gen.interval == 2


@pytest.mark.parametrize(("top_p", "expected"), [(0.0, 1.0), (1.0, 1.0), (0, 1.0), (0.5, 0.5)])
def test_top_p_zero_or_one_is_off(top_p: float, expected: float) -> None:
    assert parse({"prompt": "hi", "top_p": top_p}).gen.sampling.top_p == expected


def test_messages_body() -> None:
    call = parse(
        {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]}
    )
    assert call.gen.prompt is None
    assert call.gen.param == "messages"
    assert call.gen.messages == (
        ChatMessage(role="system", content="s"),
        ChatMessage(role="user", content="u"),
    )
    assert call.gen.prompt_text == "system: s\nuser: u"


def test_stop_string_becomes_a_list() -> None:
    assert parse({"prompt": "p", "stop": "###"}).gen.stop == ("###",)
    assert parse({"prompt": "p", "stop": ["a", "b"]}).gen.stop == ("a", "b")
    assert parse({"prompt": "p", "stop": None}).gen.stop == ()
    assert parse({"prompt": "p", "stop": ["x"] * MAX_STOP_STRINGS}).gen.stop == ("x",) * 16


def test_limits_accepted_at_the_edges() -> None:
    parse(
        {
            "prompt": "",
            "max_new_tokens": 1,
            "temperature": 0.0,
            "top_k": 0,
            "top_p": 1.0,
            "streaming_interval": 1,
            "seed": 0,
            "repetition_penalty": 10.0,
            "presence_penalty": -2.0,
            "frequency_penalty": 2.0,
        }
    )
    parse(
        {
            "prompt": "p",
            "temperature": 2.0,
            "streaming_interval": 1024,
            "seed": 2**63 - 1,
            "stop": ["x" * 256],
        }
    )


# ---- aliases ----


def test_aliases_max_tokens_and_stream() -> None:
    call = parse({"prompt": "p", "max_tokens": 7, "stream": True})
    assert call.gen.sampling.max_new_tokens == 7
    assert call.stream is True


@pytest.mark.parametrize(
    ("body", "alias"),
    [
        ({"prompt": "p", "max_tokens": 7, "max_new_tokens": 7}, "max_tokens"),
        ({"prompt": "p", "stream": True, "streaming": True}, "stream"),
    ],
)
def test_both_names_of_one_field_is_a_400(body: dict[str, Any], alias: str) -> None:
    err = refusal(body)
    assert err.param == alias
    assert "not both" in err.message


def test_an_alias_is_validated_under_its_field_name() -> None:
    assert refusal({"prompt": "p", "max_tokens": 0}).param == "max_new_tokens"
    assert refusal({"prompt": "p", "stream": "yes"}).param == "streaming"


def test_aliases_leave_the_callers_body_alone() -> None:
    body = {"prompt": "p", "max_tokens": 3}
    parse(body)
    assert body == {"prompt": "p", "max_tokens": 3}


# ---- refusals ----

BAD_BODIES: list[tuple[dict[str, Any], str]] = [
    ({"prompt": "p", "temprature": 0.5}, "temprature"),  # unknown field (a typo)
    ({"prompt": 5}, "prompt"),
    ({"prompt": ["p"]}, "prompt"),
    ({"prompt": "p", "max_new_tokens": "lots"}, "max_new_tokens"),
    ({"prompt": "p", "max_new_tokens": "2"}, "max_new_tokens"),  # strict: "2" is no int
    ({"prompt": "p", "max_new_tokens": 2.0}, "max_new_tokens"),
    ({"prompt": "p", "max_new_tokens": 1.5}, "max_new_tokens"),
    ({"prompt": "p", "max_new_tokens": True}, "max_new_tokens"),
    ({"prompt": "p", "max_new_tokens": 0}, "max_new_tokens"),
    ({"prompt": "p", "max_new_tokens": -1}, "max_new_tokens"),
    ({"prompt": "p", "max_new_tokens": 2**21}, "max_new_tokens"),
    ({"prompt": "p", "temperature": -0.1}, "temperature"),
    ({"prompt": "p", "temperature": 2.5}, "temperature"),
    ({"prompt": "p", "temperature": "hot"}, "temperature"),
    ({"prompt": "p", "temperature": "0.5"}, "temperature"),
    ({"prompt": "p", "temperature": True}, "temperature"),  # true is not a number
    ({"prompt": "p", "temperature": float("nan")}, "temperature"),
    ({"prompt": "p", "top_k": -1}, "top_k"),
    ({"prompt": "p", "top_k": False}, "top_k"),
    ({"prompt": "p", "top_p": 1.5}, "top_p"),
    ({"prompt": "p", "top_p": -0.5}, "top_p"),
    ({"prompt": "p", "top_p": True}, "top_p"),
    ({"prompt": "p", "streaming": "maybe"}, "streaming"),
    ({"prompt": "p", "streaming": 1}, "streaming"),  # strict: 1 is no boolean
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
    ({"messages": [{"role": "user", "content": 5}]}, "messages"),
    ({"messages": [{"role": "user", "content": "x", "name": "n"}]}, "messages"),
    ({"messages": "hello"}, "messages"),
]


@pytest.mark.parametrize(
    ("body", "field"), BAD_BODIES, ids=[f"{i}-{f}" for i, (_, f) in enumerate(BAD_BODIES)]
)
def test_bad_body_names_the_field(body: dict[str, Any], field: str) -> None:
    err = refusal(body)
    assert err.message.startswith(field), err.message
    assert err.param is not None and err.param.split(".")[0] == field
    assert all(":" in part for part in err.message.split("; "))


def test_unknown_field_says_so() -> None:
    err = refusal({"prompt": "p", "max_length": 5})
    assert err.message == "max_length: unknown field"
    assert err.param == "max_length"


@pytest.mark.parametrize(
    "body",
    [{}, {"max_new_tokens": 5}, {"prompt": "p", "messages": [{"role": "user", "content": "u"}]}],
)
def test_exactly_one_of_prompt_or_messages(body: dict[str, Any]) -> None:
    err = refusal(body)
    assert "prompt" in err.message and "messages" in err.message
    assert err.message.startswith("body: ")
    assert "Value error" not in err.message


def test_several_problems_are_all_reported() -> None:
    err = refusal({"prompt": "p", "top_k": -1, "top_p": 2, "x": 1})
    parts = err.message.split("; ")
    assert sorted(p.split(":")[0] for p in parts) == ["top_k", "top_p", "x"]


# ---- answers ----


def outcome_of(output: str, reason: str) -> Outcome:
    return Outcome(reason, output, 4, 3)


def test_response_body() -> None:
    call = parse({"prompt": "p"})
    assert FMT.response_body(call, outcome_of("Hi!", "stop"), "rid") == {
        "output": "Hi!",
        "finish_reason": "stop",
        "usage": {"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7},
    }


def test_error_body() -> None:
    assert FMT.error_body(RequestError("nope", status=429, param="x")) == {"error": "nope"}


def run_stream(parts: list[str], reason: str) -> tuple[list[str], BaseException | None]:
    call = parse({"prompt": "p", "streaming": True})
    generation = scripted(parts, outcome_of("".join(parts), reason))
    out: list[str] = []

    async def main() -> BaseException | None:
        try:
            async for text in FMT.stream_events(call, generation, "rid"):
                out.append(text)
        except TruncatedStream as exc:
            return exc
        return None

    return out, asyncio.run(main())


@pytest.mark.parametrize("reason", ["stop", "length"])
def test_a_complete_stream_is_the_text_itself(reason: str) -> None:
    out, cut = run_stream(["Hel", "", "lo 😀"], reason)
    assert out == ["Hel", "lo 😀"]  # empty chunks are not sent
    assert cut is None


@pytest.mark.parametrize("reason", ["abort", "error"])
def test_a_cut_stream_ends_with_truncated_stream(reason: str) -> None:
    out, cut = run_stream(["Hel"], reason)
    assert out == ["Hel"]
    assert isinstance(cut, TruncatedStream)


# ---- any body ----


def check_outcome(body: dict[str, Any]) -> None:
    try:
        call = parse(body)
    except RequestError as err:
        assert err.status == 400
        assert err.message
        # The problem is named by a field of the body (an alias under its field's name),
        # or is the body's as a whole (param None).
        named = set(body) | {ALIASES.get(k, k) for k in body}
        assert err.param is None or err.param in named or err.param.split(".")[0] in named, (
            err.param
        )
    else:
        gen = call.gen
        assert (gen.prompt is None) != (gen.messages is None)
        s = gen.sampling
        assert s.max_new_tokens >= 1 and 0 <= s.temperature <= 2 and 0 < s.top_p <= 1
        assert all(isinstance(x, str) and x for x in gen.stop)
        assert isinstance(call.stream, bool)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=st.dictionaries(st.sampled_from([*FIELDS, "bogus"]) | st.text(max_size=5), JSON))
def test_any_json_body_parses_or_is_refused(body: dict[str, Any]) -> None:
    check_outcome(body)


VALID = {
    "prompt": "Tell me",
    "max_new_tokens": 16,
    "temperature": 0.5,
    "top_k": 5,
    "top_p": 0.9,
    "streaming": True,
    "streaming_interval": 2,
    "stop": ["\n"],
    "seed": 1,
}


@settings(max_examples=200, deadline=None)
@given(
    drop=st.sets(st.sampled_from(sorted(VALID))),
    change=st.dictionaries(st.sampled_from(FIELDS), JSON, max_size=2),
)
def test_mutated_valid_bodies_parse_or_are_refused(drop: set[str], change: dict[str, Any]) -> None:
    body = {k: v for k, v in VALID.items() if k not in drop} | change
    check_outcome(body)
