"""Anthropic's Messages format (protocols/anthropic/) through the generation service:
bodies read strictly (each bad field a 400 naming it, in Anthropic's error shape), answers
and stream events valid in the anthropic SDK's own models, a stream accumulated by the
SDK's own `accumulate_event` equal to the non-streamed Message, stop reasons, tools through
the chat route's parsers and grammar (also on both TensorRT-LLM kinds, through the
double), and `count_tokens` counting the very prompt `/v1/messages` sends."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from anthropic.lib.streaming._messages import accumulate_event
from anthropic.types import Message as SDKMessage
from anthropic.types import RawMessageStreamEvent
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from pydantic import TypeAdapter

from mistral_serving.engines.base import EngineLimits
from mistral_serving.errors import RequestError
from mistral_serving.generation.outcome import Outcome
from mistral_serving.generation.service import GenerationService
from mistral_serving.ops.metrics import Metrics
from mistral_serving.protocols.anthropic.format import MessagesCall, MessagesFormat
from mistral_serving.settings import Settings
from mistral_serving.structured.grammar import tool_call_schema
from mistral_serving.text.tokenizer import Tokenizer
from mistral_serving.tools.tool_calls import parse_tool_request
from tests.doubles.generations import scripted
from tests.doubles.scripted_engine import ScriptedEngine
from tests.doubles.wire import CTX, answer, named_events
from tests.unit.test_protocol_responses import model_ids
from tests.unit.test_tool_formats import v3_tokenizer
from tests.unit.test_tool_stream import answers, splits

LIMITS = EngineLimits(max_input_len=4096, max_seq_len=8192, max_batch_size=4)
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
WEATHER = {"name": "get_weather", "description": "Weather", "input_schema": SCHEMA}
ARGS = '{"city": "Paris"}'
CALLS = f'[{{"name": "get_weather", "arguments": {ARGS}}}]'
USER = [{"role": "user", "content": "Weather in Paris?"}]
BASE = {"model": "claude-x", "max_tokens": 64, "messages": USER}
EVENTS = TypeAdapter(RawMessageStreamEvent)


def fmt_for(tok: Tokenizer) -> MessagesFormat:
    return MessagesFormat("m", tok.tool_format)


def serve(
    tok: Tokenizer, body: dict[str, Any], text: str, finish: str = "stop"
) -> tuple[Any, ScriptedEngine]:
    engine = ScriptedEngine.from_ids(model_ids(tok, text), finish, per_step=2, limits=LIMITS)
    service = GenerationService(Settings(), tok, engine, Metrics(CollectorRegistry()))
    try:
        return answer(fmt_for(tok), service, BASE | body, "messages"), engine
    finally:
        service.shutdown()


def both(
    tok: Tokenizer, body: dict[str, Any], text: str, finish: str = "stop"
) -> tuple[dict[str, Any], list[dict[str, Any]], ScriptedEngine]:
    whole, engine = serve(tok, body | {"stream": False}, text, finish)
    events, _ = serve(tok, body | {"stream": True}, text, finish)
    SDKMessage.model_validate(whole)
    return whole, events, engine


def accumulated(events: list[dict[str, Any]]) -> dict[str, Any]:
    """The Message as the anthropic SDK's `messages.stream()` assembles it."""
    snapshot = None
    bufs: dict[int, bytes] = {}  # each tool_use block's JSON so far, as the SDK keeps it
    for event in events:
        snapshot = accumulate_event(
            event=EVENTS.validate_python(event), current_snapshot=snapshot, json_bufs=bufs
        )
    assert snapshot is not None
    return snapshot.model_dump(exclude_none=True, exclude={"parsed_output"})


def same_but_ids(streamed: dict[str, Any], whole: dict[str, Any]) -> None:
    assert streamed["content"] == [
        {**block, **({"id": s["id"]} if "id" in block else {})}
        for block, s in zip(whole["content"], streamed["content"], strict=True)
    ]
    for key in ("stop_reason", "stop_sequence", "usage", "model", "role", "type"):
        assert streamed.get(key) == whole.get(key), key


def test_a_text_answer_streams_into_the_whole_message(tok: Tokenizer) -> None:
    whole, events, _ = both(tok, {"system": "Be brief."}, "Hello there")
    assert whole["type"] == "message" and whole["id"].startswith("msg_")
    assert whole["content"] == [{"type": "text", "text": "Hello there"}]
    assert (whole["stop_reason"], whole["stop_sequence"]) == ("end_turn", None)
    assert whole["usage"]["input_tokens"] > 0 and whole["usage"]["output_tokens"] > 0
    kinds = [e["type"] for e in events]
    assert kinds[:2] == ["message_start", "content_block_start"]
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(kinds[2:-3]) == {"content_block_delta"}
    assert events[0]["message"]["usage"]["input_tokens"] == whole["usage"]["input_tokens"]
    same_but_ids(accumulated(events), whole)


@pytest.mark.parametrize("which", ["fallback_json", "mistral"])
def test_calls_in_the_models_format_are_tool_use_blocks(tok: Tokenizer, which: str) -> None:
    model_tok = tok if which == "fallback_json" else v3_tokenizer()
    marker = "TOOL_CALLS:" if which == "fallback_json" else "[TOOL_CALLS]"
    whole, events, _ = both(model_tok, {"tools": [WEATHER]}, f"Let me look. {marker} {CALLS}")
    text, call = whole["content"]
    assert text == {"type": "text", "text": "Let me look."}
    assert (call["type"], call["name"], call["input"]) == (
        "tool_use",
        "get_weather",
        {"city": "Paris"},
    )
    assert whole["stop_reason"] == "tool_use"
    partial = "".join(
        e["delta"]["partial_json"]
        for e in events
        if e["type"] == "content_block_delta" and e["delta"]["type"] == "input_json_delta"
    )
    assert partial == ARGS
    same_but_ids(accumulated(events), whole)


@pytest.mark.parametrize(
    ("choice", "chat_choice"),
    [
        ({"type": "any"}, "required"),
        ({"type": "tool", "name": "get_weather"}, {"type": "function", "function": {"name": "get_weather"}}),
        ({"type": "any", "disable_parallel_tool_use": True}, "required"),
    ],
)  # fmt: skip
def test_any_and_tool_choices_are_generated_under_the_tool_grammar(
    tok: Tokenizer, choice: dict[str, Any], chat_choice: Any
) -> None:
    whole, events, engine = both(tok, {"tools": [WEATHER], "tool_choice": choice}, CALLS)
    guided = engine.calls[0].sampling.guided
    chat_tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": SCHEMA}}]  # fmt: skip
    parallel = not choice.get("disable_parallel_tool_use", False)
    request = {"tools": chat_tools, "tool_choice": chat_choice, "parallel_tool_calls": parallel}
    assert guided is not None
    assert json.loads(guided.json_schema or "") == tool_call_schema(parse_tool_request(request))
    (call,) = whole["content"]
    assert call["input"] == {"city": "Paris"} and whole["stop_reason"] == "tool_use"
    same_but_ids(accumulated(events), whole)


def test_stop_reasons_say_why_the_answer_ended(tok: Tokenizer) -> None:
    whole, events, engine = both(tok, {"max_tokens": 3}, "a b c", "length")
    assert engine.calls[0].sampling.max_new_tokens == 3
    assert whole["stop_reason"] == "max_tokens"
    assert events[-2]["delta"]["stop_reason"] == "max_tokens"
    body = {"stop_sequences": ["END", "world"]}
    whole, events, engine = both(tok, body, "Hello world and more")
    assert whole["content"][0]["text"] == "Hello "
    assert (whole["stop_reason"], whole["stop_sequence"]) == ("stop_sequence", "world")
    assert events[-2]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "world"}
    same_but_ids(accumulated(events), whole)


def test_sampling_fields_reach_the_engine(tok: Tokenizer) -> None:
    body = {"temperature": 0.5, "top_p": 0.9, "top_k": 7, "metadata": {"user_id": "u"}}
    _, engine = serve(tok, body, "x")
    s = engine.calls[0].sampling
    assert (s.temperature, s.top_p, s.top_k, s.max_new_tokens) == (0.5, 0.9, 7, 64)


def stream_of(
    fmt: MessagesFormat, call: MessagesCall, pieces: list[str], outcome: Outcome,
    error: RequestError | None = None,
) -> list[dict[str, Any]]:  # fmt: skip
    async def main() -> list[str]:
        return [e async for e in fmt.stream_events(call, scripted(pieces, outcome, error), "a")]

    return named_events(asyncio.run(main()))


@pytest.mark.parametrize(
    ("reason", "kind"), [("abort", "overloaded_error"), ("timeout", "timeout_error")]
)
def test_an_answer_cut_short_ends_with_an_error_event(tok: Tokenizer, reason: str, kind: str):
    fmt = fmt_for(tok)
    call = fmt.parse(BASE | {"stream": True}, CTX)
    events = stream_of(fmt, call, ["par"], Outcome(reason, "par", 3, 1))
    assert events[-1]["type"] == "error" and events[-1]["error"]["type"] == kind
    assert "message_stop" not in [e["type"] for e in events]
    error = RequestError("bad", param="messages")
    events = stream_of(fmt, call, ["x"], Outcome("invalid"), error)
    assert events[-1] == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "bad"},
    }


def test_a_tool_loop_sends_the_result_back(tok: Tokenizer) -> None:
    first, _ = serve(tok, {"tools": [WEATHER], "tool_choice": {"type": "any"}}, CALLS)
    (use,) = first["content"]
    result = {"type": "tool_result", "tool_use_id": use["id"], "content": [{"type": "text", "text": "20 C"}]}  # fmt: skip
    messages = [*USER, {"role": "assistant", "content": first["content"]}, {"role": "user", "content": [result]}]  # fmt: skip
    second, engine = serve(tok, {"tools": [WEATHER], "messages": messages}, "It is 20 C.")
    assert second["content"] == [{"type": "text", "text": "It is 20 C."}]
    prompt = b"".join(tok.table.token_bytes[t] or b"" for t in engine.calls[0].prompt_ids)
    assert b"TOOL_RESULTS:" in prompt and b"20" in prompt
    # count_tokens counts that very prompt.
    gen = fmt_for(tok).parse_count({"model": "m", "tools": [WEATHER], "messages": messages})
    service = GenerationService(Settings(), tok, ScriptedEngine(limits=LIMITS), Metrics(CollectorRegistry()))  # fmt: skip
    try:
        counted = asyncio.run(service.prompt_ids(gen))
    finally:
        service.shutdown()
    assert counted == engine.calls[0].prompt_ids
    assert fmt_for(tok).count_body(len(counted)) == {"input_tokens": len(counted)}


# ---- refusals ----

BAD = [
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": None}, "max_tokens"),
    ({"model": None}, "model"),
    ({"temperature": 1.5}, "temperature"),
    ({"top_k": -1}, "top_k"),
    ({"stop_sequences": [""]}, "stop_sequences.0"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "system", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": 3}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "messages[0].content[0].type"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t9", "content": "x"}]}]}, "messages[0].content[0].tool_use_id"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "tool_result", "tool_use_id": "t", "content": "x"}]}]}, "messages[0].content[1].type"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]}]}, "messages[0].content[0].type"),
    ({"system": [{"type": "image"}]}, "system[0].type"),
    ({"thinking": {"type": "enabled", "budget_tokens": 1024}}, "thinking.type"),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0].type"),
    ({"tools": [{"name": "f"}]}, "tools[0].input_schema"),
    ({"tools": [WEATHER | {"input_schema": {"type": "string"}}]}, "tools[0].input_schema.type"),
    ({"tools": [WEATHER], "tool_choice": {"type": "tool"}}, "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": {"type": "tool", "name": "nope"}}, "tool_choice.name"),
    ({"tool_choice": {"type": "any"}}, "tool_choice"),
    ({"unknown": 1}, "unknown"),
]  # fmt: skip


@pytest.mark.parametrize(("body", "param"), BAD)
def test_bad_fields_are_400s_that_name_them(tok: Tokenizer, body: dict[str, Any], param: str):
    fmt = fmt_for(tok)
    with pytest.raises(RequestError) as err:
        fmt.parse(BASE | body, CTX)
    assert err.value.status == 400 and err.value.param == param, err.value.message
    error = fmt.error_body(err.value)
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    ("status", "kind"),
    [(400, "invalid_request_error"), (401, "authentication_error"), (404, "not_found_error"),
     (413, "request_too_large"), (429, "rate_limit_error"), (500, "api_error"),
     (503, "overloaded_error"), (504, "timeout_error")],
)  # fmt: skip
def test_errors_are_in_anthropics_shape(tok: Tokenizer, status: int, kind: str) -> None:
    assert fmt_for(tok).error_body(RequestError("why", status)) == {
        "type": "error",
        "error": {"type": kind, "message": "why"},
    }


JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=6),
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=8), c, max_size=3),
    max_leaves=10,
)
BLOCK = st.fixed_dictionaries(
    {"type": st.sampled_from(["text", "tool_use", "tool_result", "image"])},
    optional={
        "text": JSONISH | st.just("hi"),
        "id": st.just("t1") | JSONISH,
        "tool_use_id": st.just("t1") | JSONISH,
        "name": st.just("get_weather") | JSONISH,
        "input": st.just({}) | JSONISH,
        "content": JSONISH | st.just("ok"),
    },
)
MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "system"])},
    optional={"content": st.text(max_size=4) | st.lists(BLOCK, max_size=3) | JSONISH},
)
BODY = st.fixed_dictionaries(
    {},
    optional={
        "messages": st.lists(MESSAGE, max_size=4) | JSONISH,
        "system": JSONISH,
        "tools": st.lists(st.just(WEATHER) | JSONISH, max_size=2) | JSONISH,
        "tool_choice": st.sampled_from([{"type": "any"}, {"type": "auto"}]) | JSONISH,
        "max_tokens": JSONISH,
        "stop_sequences": JSONISH,
    },
)


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(body=BODY)
def test_any_body_is_parsed_or_refused_with_a_field_named(tok: Tokenizer, body: dict[str, Any]):
    fmt = fmt_for(tok)
    try:
        call = fmt.parse(BASE | body, CTX)
    except RequestError as err:
        assert err.status == 400 and err.param
        assert fmt.error_body(err)["error"]["type"] == "invalid_request_error"
        return
    assert call.gen.messages


# ---- streamed calls, whatever the format and however the text arrives ----


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(answers(), st.data())
def test_streamed_blocks_accumulate_to_the_whole_message(
    answer_: tuple[str, str, list[tuple[str, str]]], data: st.DataObject
) -> None:
    fmt_name, text, expected = answer_
    constrained = fmt_name == "constrained"
    fmt = MessagesFormat("m", "mistral" if constrained else fmt_name)
    body = BASE | {"tools": [WEATHER | {"name": "f"}], "stream": True}
    call = fmt.parse(body | {"tool_choice": {"type": "any" if constrained else "auto"}}, CTX)
    outcome = Outcome("stop", text, 5, 9)
    events = stream_of(fmt, call, splits(data, text), outcome)
    whole = fmt.response_body(call, outcome, "a")
    uses = [(b["name"], json.dumps(b["input"], ensure_ascii=False)) for b in whole["content"] if b["type"] == "tool_use"]  # fmt: skip
    assert uses == expected
    same_but_ids(accumulated(events), whole)


# ---- both TensorRT-LLM kinds, through the tensorrt_llm double ----


@pytest.mark.parametrize("kind", ["trtllm", "trtllm_pytorch"])
def test_forced_calls_on_both_tensorrt_llm_kinds(
    fake_trtllm: Any, tmp_path: Any, tok: Tokenizer, kind: str
) -> None:
    from tests.doubles.trtllm_helpers import EOS, load, load_pytorch_kind

    engine = load(tmp_path) if kind == "trtllm" else load_pytorch_kind(tmp_path)
    engine.llm.script = tok.encode(CALLS) + [EOS]
    service = GenerationService(Settings(), tok, engine, Metrics(CollectorRegistry()))
    body = BASE | {"tools": [WEATHER], "tool_choice": {"type": "tool", "name": "get_weather"}}
    try:
        whole = answer(fmt_for(tok), service, body, "messages")
    finally:
        service.shutdown()
    assert engine.llm.requests[0].sampling_params.guided_decoding is not None
    (use,) = whole["content"]
    assert (use["name"], use["input"], whole["stop_reason"]) == (
        "get_weather",
        {"city": "Paris"},
        "tool_use",
    )
