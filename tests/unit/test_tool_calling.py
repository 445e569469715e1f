"""Tool-call request checks and the per-format answer parsers."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mistral_serving.errors import RequestError
from mistral_serving.tools.parsers.stream import ParsedCall, parse_answer
from mistral_serving.tools.tool_calls import check_history, parse_tool_request

WEATHER: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def test_a_named_choice_must_be_offered() -> None:
    req = parse_tool_request({"tools": [WEATHER], "tool_choice": "required"})
    assert req.constrained and req.choice == "required"
    with pytest.raises(RequestError) as err:
        parse_tool_request(
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}
        )
    assert err.value.param == "tool_choice.function.name"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"tools": "x"}, "tools"),
        ({"tools": [{"type": "code"}]}, "tools[0].type"),
        (
            {"tools": [{"type": "function", "function": {"name": "a b"}}]},
            "tools[0].function.name",
        ),
        (
            {
                "tools": [
                    {"type": "function", "function": {"name": "a", "parameters": {"type": "obj"}}}
                ]
            },
            "tools[0].function.parameters.type",
        ),
        ({"tools": [WEATHER, WEATHER]}, "tools[1].function.name"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [WEATHER], "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
    ],
)
def test_bad_fields_are_named(body: dict[str, Any], param: str) -> None:
    with pytest.raises(RequestError) as err:
        parse_tool_request(body)
    assert err.value.status == 400 and err.value.param == param


def test_a_tool_message_must_answer_a_call() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    check_history(
        [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "ok"},
        ]
    )
    with pytest.raises(RequestError) as err:
        check_history([{"role": "user", "content": "hi"}, {"role": "tool", "tool_call_id": "c9"}])
    assert err.value.param == "messages[1].tool_call_id"


@settings(max_examples=50, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["tools", "tool_choice", "parallel_tool_calls"]),
        st.recursive(
            st.none() | st.booleans() | st.text(max_size=5),
            lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=5), c, max_size=3),
            max_leaves=8,
        ),
    )
)
def test_any_body_is_read_or_refused_with_a_400(body: dict[str, Any]) -> None:
    try:
        parse_tool_request(body)
    except RequestError as err:
        assert err.status == 400 and err.param


ARGS = st.dictionaries(st.text(max_size=6), st.integers() | st.text(max_size=6), max_size=3)
CALLS = st.lists(
    st.tuples(st.from_regex(r"[a-z_]{1,8}", fullmatch=True), ARGS), min_size=1, max_size=3
)


def render(fmt: str, calls: list[tuple[str, dict[str, Any]]]) -> str:
    objs = [{"name": n, "arguments": a} for n, a in calls]
    if fmt == "mistral":
        return "[TOOL_CALLS]" + json.dumps(objs)
    if fmt == "fallback_json":
        return "TOOL_CALLS: " + json.dumps(objs)
    if fmt == "hermes":
        return "".join(f"<tool_call>{json.dumps(o)}</tool_call>" for o in objs)
    return "; ".join(json.dumps({"name": n, "parameters": a}) for n, a in calls)


FMTS = st.sampled_from(["mistral", "fallback_json", "hermes", "llama3_json"])


@settings(max_examples=100, deadline=None)
@given(FMTS, CALLS, st.text(alphabet="abc .", max_size=10))
def test_valid_calls_parse_exactly_and_no_markup_leaks(
    fmt: str, calls: list[tuple[str, dict[str, Any]]], prefix: str
) -> None:
    lead = "" if fmt == "llama3_json" else prefix
    answer = parse_answer(lead + render(fmt, calls), fmt)
    assert answer.calls == tuple(ParsedCall(n, json.dumps(a, ensure_ascii=False)) for n, a in calls)
    assert answer.finish_reason == "tool_calls"
    assert answer.content == lead.rstrip()
    for mark in ("[TOOL_CALLS]", "<tool_call>", "TOOL_CALLS:"):
        assert mark not in answer.content


@settings(max_examples=100, deadline=None)
@given(FMTS, CALLS, st.data())
def test_a_cut_call_comes_back_as_text(
    fmt: str, calls: list[tuple[str, dict[str, Any]]], data: st.DataObject
) -> None:
    text = render(fmt, calls)
    cut = data.draw(st.integers(1, len(text) - 1))
    answer = parse_answer(text[:cut], fmt)
    # Either a shorter prefix that still parses, or the text kept whole: never dropped.
    if not answer.calls:
        assert answer.content == text[:cut]
