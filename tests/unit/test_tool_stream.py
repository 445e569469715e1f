"""Tool calls streamed as they are generated (parsers.stream.CallStream): for every format,
random call texts written the ways models write JSON (whitespace, escapes, key orders,
arguments as JSON text), fed in random splits, assemble the way the openai SDK assembles
them into exactly the non-streamed answer; and the chat route sends them before the
answer ends."""

from __future__ import annotations

import asyncio
import json
from typing import Any, cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mistral_serving.generation.outcome import Outcome
from mistral_serving.generation.service import Generation
from mistral_serving.protocols import ParseContext
from mistral_serving.protocols.openai.chat import ChatCall, ChatCompletionsFormat
from mistral_serving.tools.parsers.stream import CallDelta, CallStream, ParsedCall, parse_answer
from tests.doubles.generations import ScriptedGeneration

FORMATS = ["mistral", "hermes", "llama3_json", "fallback_json", "constrained"]
WS = st.text(alphabet=" \n\t\r", max_size=2)
KEYS = st.text(max_size=6)
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(10**30), 10**30)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEYS, inner, max_size=4),
    max_leaves=12,
)
ARGS = st.dictionaries(KEYS, VALUES, max_size=5)
NAMES = st.from_regex(r"[A-Za-z0-9_-]{1,12}", fullmatch=True)


@st.composite
def json_text(draw: st.DrawFn, value: Any) -> str:
    """`value` as a model may write it: any whitespace, any escape, numbers as spelled."""
    ws = lambda: draw(WS)  # noqa: E731
    if isinstance(value, dict):
        items = [
            f"{ws()}{draw(json_text(k))}{ws()}:{ws()}{draw(json_text(v))}{ws()}"
            for k, v in value.items()
        ]
        return "{" + (",".join(items) or ws()) + "}"
    if isinstance(value, list):
        return "[" + (",".join(ws() + draw(json_text(v)) + ws() for v in value) or ws()) + "]"
    if isinstance(value, str):
        out = []
        for c in value:
            plain = json.dumps(c, ensure_ascii=False)[1:-1]
            how = draw(st.sampled_from(["plain", "ascii"]))
            out.append(plain if how == "plain" else json.dumps(c)[1:-1])
        return '"' + "".join(out) + '"'
    if isinstance(value, float) and draw(st.booleans()):
        return f"{value:e}"  # another spelling (its own value: the oracle reads the text)
    return json.dumps(value)


@st.composite
def call_text(
    draw: st.DrawFn, fmt: str, name_first: bool = False
) -> tuple[str, list[tuple[str, str]]]:
    """(one call object as the model writes it, [(name, expected arguments)])."""
    name, args = draw(NAMES), draw(ARGS)
    args_text = draw(json_text(args))
    # The oracle: the old rule, json.dumps of the parsed object.
    expected = json.dumps(json.loads(args_text), ensure_ascii=False)
    key = "parameters" if fmt == "llama3_json" else "arguments"
    if draw(st.integers(0, 5)) == 0:  # some models send the arguments as JSON text
        args_text = json.dumps(args_text)
    members = [f'"name":{draw(WS)}{json.dumps(name)}', f'"{key}":{draw(WS)}{args_text}']
    if draw(st.booleans()):
        members.append(f'"id": {json.dumps(draw(st.text(max_size=4)))}')
    if not name_first:
        members = draw(st.permutations(members))  # arguments before the name, too
    ws = draw(WS)
    return "{" + ws + f",{ws}".join(members) + draw(WS) + "}", [(name, expected)]


@st.composite
def answers(draw: st.DrawFn, name_first: bool = False) -> tuple[str, str, list[tuple[str, str]]]:
    """(format, a whole answer of calls, [(name, expected arguments)])."""
    fmt = draw(st.sampled_from(FORMATS))
    n = draw(st.integers(1, 3))
    objs, calls = [], []
    for _ in range(n):
        text, one = draw(call_text(fmt, name_first))
        objs.append(text)
        calls += one
    ws = draw(WS)
    if fmt == "llama3_json":
        body = f"{ws};{ws}".join(objs)
        return fmt, draw(st.sampled_from(["", "<|python_tag|>"])) + ws + body, calls
    if fmt == "hermes":
        blocks = [f"<tool_call>{draw(WS)}{o}{draw(WS)}</tool_call>" for o in objs]
        # Any lead text but the marks' first characters: the test checks no mark leaks into
        # the content, so the content must not bring one of its own.
        lead = draw(st.text(st.characters(blacklist_characters="{<[|T"), max_size=6))
        return fmt, lead + ws + ws.join(blocks) + draw(WS), calls
    listed = objs[0] if n == 1 and draw(st.booleans()) else "[" + f",{ws}".join(objs) + "]"
    if fmt == "constrained":
        return fmt, ws + listed + draw(WS), calls
    marker = "[TOOL_CALLS]" if fmt == "mistral" else "TOOL_CALLS:"
    lead = draw(st.text(alphabet="ab .\n", max_size=6))
    return fmt, lead + marker + ws + listed + draw(WS), calls


def splits(data: st.DataObject, text: str) -> list[str]:
    cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=12)))
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]


def stream(fmt: str, pieces: list[str]) -> tuple[str, list[CallDelta], Any]:
    """(content sent, call deltas sent, the final parse) for `pieces` streamed."""
    constrained = fmt == "constrained"
    s = CallStream("mistral" if constrained else fmt, constrained)
    content, deltas = "", []
    for p in pieces:
        text, ds = s.feed(p)
        content, deltas = content + text, deltas + ds
    parsed, rest, ds = s.finish()
    return content + rest, deltas + ds, parsed


def assemble(deltas: list[CallDelta]) -> list[tuple[str, str]]:
    """As the openai SDK does: a call opens with its name, arguments concatenate per index."""
    calls: list[list[str]] = []
    for d in deltas:
        if d.name is not None:
            assert d.index == len(calls) and d.name and d.arguments == ""  # name first
            calls.append([d.name, ""])
        else:
            assert d.index < len(calls) and d.arguments  # never before its name
            calls[d.index][1] += d.arguments
    return [(n, a) for n, a in calls]


def parse(fmt: str, text: str) -> Any:
    constrained = fmt == "constrained"
    return parse_answer(text, "mistral" if constrained else fmt, constrained)


@settings(max_examples=300, deadline=None)
@given(answers(), st.data())
def test_streamed_calls_assemble_to_the_non_streamed_parse(
    answer: tuple[str, str, list[tuple[str, str]]], data: st.DataObject
) -> None:
    fmt, text, expected = answer
    whole = parse(fmt, text)
    assert [(c.name, c.arguments) for c in whole.calls] == expected
    content, deltas, parsed = stream(fmt, splits(data, text))
    assert parsed == whole
    assert assemble(deltas) == expected  # byte for byte
    assert content == whole.content
    for mark in ("[TOOL_CALLS]", "<tool_call>", "TOOL_CALLS:", "<|python_tag|>", "{"):
        assert mark not in content


@settings(max_examples=100, deadline=None)
@given(answers(name_first=True))
def test_arguments_go_out_in_pieces_as_they_arrive(
    answer: tuple[str, str, list[tuple[str, str]]],
) -> None:
    fmt, text, expected = answer
    _, deltas, _ = stream(fmt, [text[i : i + 3] for i in range(0, len(text), 3)])
    for index, (_, args) in enumerate(expected):
        pieces = [d for d in deltas if d.index == index and d.name is None]
        # Read 3 characters at a time, arguments after the name go out in several pieces
        # (arguments before the name wait for it; a string-encoded one arrives escaped).
        assert len(pieces) >= min(len(args) // 12, 3)


@settings(max_examples=200, deadline=None)
@given(answers(), st.data())
def test_a_cut_or_spoiled_call_comes_back_as_content(
    answer: tuple[str, str, list[tuple[str, str]]], data: st.DataObject
) -> None:
    fmt, text, expected = answer
    cut = data.draw(st.integers(0, len(text)))
    spoil = data.draw(st.sampled_from(["", "}", ",", "x", '"', "]"]))
    broken = text[:cut] + spoil
    content, _, parsed = stream(fmt, splits(data, broken))
    if not parsed.calls:  # else still calls (a cut after the last one, say)
        assert content == broken  # nothing dropped
    # What went out of a cut answer is a prefix of each whole call's pieces.
    _, deltas, _ = stream(fmt, splits(data, text[:cut]))
    for (name, args), (want_name, want_args) in zip(assemble(deltas), expected, strict=False):
        assert name == want_name and want_args.startswith(args)


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from(FORMATS),
    st.text(alphabet=st.sampled_from('{}[]:,;"\\ u0e1.-+tnl<>/_|a\n') | st.characters()),
    st.data(),
)
def test_any_text_is_calls_or_content_and_never_an_error(
    fmt: str, noise: str, data: st.DataObject
) -> None:
    marker = data.draw(st.sampled_from(["", "[TOOL_CALLS]", "TOOL_CALLS:", "<tool_call>"]))
    text = marker + noise
    content, deltas, parsed = stream(fmt, splits(data, text))
    assert parsed == parse(fmt, text)
    if parsed.calls:
        assert assemble(deltas) == [(c.name, c.arguments) for c in parsed.calls]
    else:
        assert content == text


@pytest.mark.parametrize(
    ("text", "calls"),
    [
        # A repeated key inside the arguments is kept as written (a JSON reader takes its
        # last value, as json.loads did); a repeated name or arguments key is not a call.
        ('[{"name": "f", "arguments": {"a": 1, "a": 2}}]', [("f", '{"a": 1, "a": 2}')]),
        ('[{"name": "f", "name": "g", "arguments": {}}]', None),
        ('[{"name": "f", "arguments": {}, "arguments": {}}]', None),
        ('[{"arguments": {"x": [1, {}]}, "name": "f"}]', [("f", '{"x": [1, {}]}')]),
        ('[{"name": "f"}]', [("f", "{}")]),
        ('[{"name": "", "arguments": {}}]', None),
        ('[{"name": "f", "arguments": [1]}]', None),
        ('[{"name": "f", "arguments": "{\\"a\\": \\"\\\\u00e9\\"}"}]', [("f", '{"a": "é"}')]),
        ('[{"name": "f", "arguments": {"a": "\\ud83d\\ude00\\u00e9\\n"}}]', [("f", '{"a": "😀é\\n"}')]),
        ('[{"name": "f", "arguments": {"a": "\\ud800"}}]', [("f", '{"a": "\\ud800"}')]),
        ('[{"name": "f", "arguments": {"a": 1.50, "b": -0, "c": 1E2}}]', [("f", '{"a": 1.5, "b": 0, "c": 100.0}')]),
        ('[{"name": "f", "arguments": {"a": NaN}}]', None),
        ('[{"name": "f", "arguments": {"a": 1e999}}]', None),
        ('[{"name": "f", "arguments": {"a": 01}}]', None),
        ('[{"name": "f", "arguments": {"a": "x\ny"}}]', None),
        ('[{"name": "f", "arguments": {}}] and more', None),
        ("[]", None),
    ],
)  # fmt: skip
def test_the_canonical_rule_on_edge_cases(text: str, calls: list[tuple[str, str]] | None) -> None:
    for fmt, marked in (("mistral", "[TOOL_CALLS]" + text), ("constrained", text)):
        whole = parse(fmt, marked)
        if calls is None:
            assert whole.calls == () and whole.broken and whole.content == marked
        else:
            assert whole.calls == tuple(ParsedCall(n, a) for n, a in calls)
            for _, args in calls:
                args.encode()  # valid UTF-8: a lone surrogate is escaped
        content, deltas, parsed = stream(fmt, list(marked))
        assert parsed == whole
        if calls is not None:
            assert assemble(deltas) == calls


def test_llama_python_tag_without_a_call_is_text() -> None:
    for text in ("<|python_tag|>print(1)", "<|python_tag|>", "<|pyth", "{oops"):
        whole = parse("llama3_json", text)
        assert whole.calls == () and whole.content == text
        assert whole.broken == (text == "{oops")
        assert stream("llama3_json", list(text))[0] == text


# -- the chat route: deltas go out while the model is still writing ------------------------


ROUTE_TEXT = (
    'Sure. TOOL_CALLS: [{"name": "get_weather", "arguments": {"city": "Paris", "unit": "C"}}]'
)


def route_events(size: int) -> list[tuple[int, dict[str, Any]]]:
    """(chunks the model had sent, the event) for each event of the chat route's stream
    when the model writes ROUTE_TEXT `size` characters at a time."""
    pieces = [ROUTE_TEXT[i : i + size] for i in range(0, len(ROUTE_TEXT), size)]
    fmt = ChatCompletionsFormat("m", lambda t: b"", "fallback_json")
    tools = [{"type": "function", "function": {"name": "get_weather"}}]
    body = {"messages": [{"role": "user", "content": "hi"}], "tools": tools, "stream": True}
    call = fmt.parse(body, ParseContext(default_max_tokens=64))
    assert isinstance(call, ChatCall)
    # Its completion_tokens count the chunks handed out so far.
    generation = ScriptedGeneration(pieces, Outcome("stop", ROUTE_TEXT, 1, len(pieces)))

    async def run() -> list[tuple[int, dict[str, Any]]]:
        out = []
        async for event in fmt.stream_events(call, cast(Generation, generation), "e1"):
            if event != "data: [DONE]\n\n":
                consumed = generation.completion_tokens
                out.append((consumed, json.loads(event.removeprefix("data: "))))
        return out

    return asyncio.run(run())


@pytest.mark.parametrize("size", [1, 4, 9, len(ROUTE_TEXT)])
def test_the_route_streams_content_then_the_call(size: int) -> None:
    events = route_events(size)
    content = "".join(c["delta"].get("content") or "" for _, e in events for c in e["choices"])
    seen = [
        tc for _, e in events for c in e["choices"] for tc in c["delta"].get("tool_calls") or []
    ]
    assert content == "Sure."
    assert seen[0]["function"] == {"name": "get_weather", "arguments": ""} and seen[0]["id"]
    assert all(set(tc) == {"index", "function"} for tc in seen[1:])
    assert "".join(tc["function"]["arguments"] for tc in seen) == '{"city": "Paris", "unit": "C"}'
    assert events[-1][1]["choices"][0]["finish_reason"] == "tool_calls"


def test_the_route_sends_the_name_and_arguments_before_the_answer_ends() -> None:
    events = route_events(4)
    n_chunks = events[-1][0]
    seen = [
        (n, tc)
        for n, e in events
        for c in e["choices"]
        for tc in c["delta"].get("tool_calls") or []
    ]
    assert seen[0][0] < n_chunks  # the name went out while the model was still writing
    fragments = [(n, tc["function"]["arguments"]) for n, tc in seen[1:]]
    assert len({n for n, _ in fragments}) > 2  # arguments in pieces, from several chunks
