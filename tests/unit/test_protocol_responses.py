"""The Responses API format (protocols/responses/) through the generation service: bodies
read strictly (each bad field a 400 naming it), answers and stream events valid in the
openai SDK's own models, a stream accumulated by the SDK's own `ResponseStreamState` equal
to the non-streamed Response, tools through the chat route's parsers and grammar (also on
both TensorRT-LLM kinds, through the double), and the bounded store behind
`previous_response_id`, `GET` and `DELETE`."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai import omit
from openai.lib.streaming.responses._responses import ResponseStreamState
from openai.types.responses import Response as SDKResponse
from openai.types.responses import ResponseStreamEvent
from prometheus_client import CollectorRegistry
from pydantic import TypeAdapter

from mistral_serving.engines.base import EngineLimits
from mistral_serving.errors import RequestError
from mistral_serving.generation.outcome import Outcome
from mistral_serving.generation.service import GenerationService
from mistral_serving.ops.metrics import Metrics
from mistral_serving.protocols.responses.format import ResponsesCall, ResponsesFormat
from mistral_serving.protocols.responses.store import ResponseStore
from mistral_serving.settings import Settings
from mistral_serving.structured.grammar import tool_call_schema
from mistral_serving.text.tokenizer import Tokenizer
from mistral_serving.tools.tool_calls import parse_tool_request
from tests.doubles.generations import scripted
from tests.doubles.scripted_engine import ScriptedEngine
from tests.doubles.wire import CTX, answer, named_events
from tests.unit.test_tool_formats import v3_tokenizer
from tests.unit.test_tool_stream import answers, splits

LIMITS = EngineLimits(max_input_len=4096, max_seq_len=8192, max_batch_size=4)
PARAMS = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather",
    "parameters": PARAMS,
}
ARGS = '{"city": "Paris"}'
CALLS = f'[{{"name": "get_weather", "arguments": {ARGS}}}]'
EVENTS = TypeAdapter(ResponseStreamEvent)


def fmt_for(tok: Tokenizer, store: ResponseStore | None = None) -> ResponsesFormat:
    return ResponsesFormat("m", tok.tool_format, store or ResponseStore(64, 10**7, 3600))


def model_ids(tok: Tokenizer, text: str) -> list[int]:
    """What a model that writes `text` generates (Mistral's tool token where it has one)."""
    if text.startswith("[TOOL_CALLS]") and "[TOOL_CALLS]" in tok.special_ids:
        return [tok.special_ids["[TOOL_CALLS]"], *tok.encode(text.removeprefix("[TOOL_CALLS]"))]
    return tok.encode(text)


def serve(
    fmt: ResponsesFormat, tok: Tokenizer, body: dict[str, Any], text: str, finish: str = "stop"
) -> tuple[Any, ScriptedEngine]:
    engine = ScriptedEngine.from_ids(model_ids(tok, text), finish, per_step=2, limits=LIMITS)
    service = GenerationService(Settings(), tok, engine, Metrics(CollectorRegistry()))
    try:
        return answer(fmt, service, body, "responses"), engine
    finally:
        service.shutdown()


def both(
    tok: Tokenizer, body: dict[str, Any], text: str, finish: str = "stop"
) -> tuple[dict[str, Any], list[dict[str, Any]], ScriptedEngine]:
    """(the Response, the stream's events, the engine), each checked against the SDK."""
    fmt = fmt_for(tok)
    whole, engine = serve(fmt, tok, body | {"stream": False}, text, finish)
    events, _ = serve(fmt, tok, body | {"stream": True}, text, finish)
    SDKResponse.model_validate(whole)
    return whole, events, engine


def accumulated(events: list[dict[str, Any]]) -> Any:
    """The final Response as the openai SDK's `responses.stream()` assembles it (it checks
    event order and item identities as it goes)."""
    state = ResponseStreamState(input_tools=[WEATHER], text_format=omit)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    for event in events:
        state.handle_event(EVENTS.validate_python(event))
    return state._completed_response


def sdk_output(final: Any) -> list[dict[str, Any]]:
    """The SDK's accumulated output items as plain dicts, without its own additions."""
    items = [o.model_dump(exclude_none=True, exclude={"parsed_arguments"}) for o in final.output]
    for item in items:
        for part in item.get("content", []):
            part.pop("parsed", None)
    return items


def without_ids(output: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Output items with the ids each answer makes afresh (call ids) left out."""
    return [{k: v for k, v in item.items() if k not in ("id", "call_id")} for item in output]


def joined(events: list[dict[str, Any]], kind: str) -> dict[int, str]:
    out: dict[int, str] = {}
    for e in events:
        if e["type"] == kind:
            out[e["output_index"]] = out.get(e["output_index"], "") + e["delta"]
    return out


def test_a_text_answer_streams_into_the_whole_response(tok: Tokenizer) -> None:
    whole, events, _ = both(tok, {"input": "Hi", "instructions": "Be brief."}, "Hello there")
    assert whole["status"] == "completed" and whole["object"] == "response"
    assert whole["instructions"] == "Be brief." and whole["tool_choice"] == "auto"
    (message,) = whole["output"]
    assert message["type"] == "message" and message["status"] == "completed"
    assert message["content"][0]["text"] == "Hello there"
    usage = whole["usage"]
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"] > 0
    kinds = [e["type"] for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert joined(events, "response.output_text.delta") == {0: "Hello there"}
    final = accumulated(events)
    assert final.output_text == "Hello there"
    assert without_ids(sdk_output(final)) == without_ids(whole["output"])
    assert final.output[0].id == events[-1]["response"]["output"][0]["id"]
    terminal = events[-1]["response"]
    assert without_ids(terminal["output"]) == without_ids(whole["output"])
    assert terminal["usage"] == whole["usage"]


@pytest.mark.parametrize("which", ["fallback_json", "mistral"])
def test_calls_in_the_models_format_are_function_call_items(tok: Tokenizer, which: str) -> None:
    model_tok = tok if which == "fallback_json" else v3_tokenizer()
    marker = "TOOL_CALLS:" if which == "fallback_json" else "[TOOL_CALLS]"
    text = f"Let me look. {marker} {CALLS}"
    whole, events, _ = both(model_tok, {"input": "Weather in Paris?", "tools": [WEATHER]}, text)
    message, call = whole["output"]
    assert message["content"][0]["text"] == "Let me look."
    assert (call["type"], call["name"], call["arguments"]) == ("function_call", "get_weather", ARGS)
    assert call["id"] != call["call_id"] and call["status"] == "completed"
    assert joined(events, "response.function_call_arguments.delta") == {1: ARGS}
    final = accumulated(events)
    assert [o.type for o in final.output] == ["message", "function_call"]
    assert final.output[1].arguments == ARGS
    assert without_ids(events[-1]["response"]["output"]) == without_ids(whole["output"])


@pytest.mark.parametrize("choice", ["required", {"type": "function", "name": "get_weather"}])
def test_required_and_named_calls_are_generated_under_the_tool_grammar(
    tok: Tokenizer, choice: Any
) -> None:
    body = {"input": "Weather?", "tools": [WEATHER], "tool_choice": choice}
    whole, events, engine = both(tok, body, CALLS)
    guided = engine.calls[0].sampling.guided
    chat_choice = (
        choice
        if isinstance(choice, str)
        else {"type": "function", "function": {"name": "get_weather"}}
    )
    chat_tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": PARAMS}}]  # fmt: skip
    expected = tool_call_schema(
        parse_tool_request({"tools": chat_tools, "tool_choice": chat_choice})
    )
    assert guided is not None and json.loads(guided.json_schema or "") == expected
    (call,) = whole["output"]
    assert call["type"] == "function_call" and call["arguments"] == ARGS
    assert without_ids(sdk_output(accumulated(events))) == without_ids(whole["output"])


def test_max_output_tokens_reached_is_an_incomplete_response(tok: Tokenizer) -> None:
    whole, events, engine = both(tok, {"input": "Hi", "max_output_tokens": 3}, "a b c", "length")
    assert engine.calls[0].sampling.max_new_tokens == 3
    assert whole["status"] == "incomplete"
    assert whole["incomplete_details"] == {"reason": "max_output_tokens"}
    assert whole["output"][0]["status"] == "incomplete"
    assert events[-1]["type"] == "response.incomplete"
    assert events[-1]["response"]["output"] == [
        {**whole["output"][0], "id": events[-1]["response"]["output"][0]["id"]}
    ]


def stream_of(
    fmt: ResponsesFormat, call: ResponsesCall, pieces: list[str], outcome: Outcome,
    error: RequestError | None = None,
) -> list[dict[str, Any]]:  # fmt: skip
    async def main() -> list[str]:
        return [e async for e in fmt.stream_events(call, scripted(pieces, outcome, error), "a")]

    return named_events(asyncio.run(main()))


def test_an_answer_cut_short_is_a_failed_response(tok: Tokenizer) -> None:
    fmt = fmt_for(tok)
    call = fmt.parse({"input": "Hi", "stream": True}, CTX)
    events = stream_of(fmt, call, ["par"], Outcome("abort", "par", 3, 1))
    assert events[-1]["type"] == "response.failed"
    assert events[-1]["response"]["error"]["code"] == "server_error"
    assert "cut short" in events[-1]["response"]["error"]["message"]
    assert len(fmt.store) == 0  # a cut answer is never continued
    whole = fmt.response_body(call, Outcome("timeout", "par", 3, 1), "a")
    assert whole["status"] == "failed" and "deadline" in whole["error"]["message"]


def test_an_error_mid_stream_is_an_error_event_then_a_failed_response(tok: Tokenizer) -> None:
    fmt = fmt_for(tok)
    call = fmt.parse({"input": "Hi", "stream": True}, CTX)
    error = RequestError("bad token", param="input")
    events = stream_of(fmt, call, ["x"], Outcome("invalid"), error)
    assert [e["type"] for e in events[-2:]] == ["error", "response.failed"]
    assert events[-2]["message"] == "bad token" and events[-2]["param"] == "input"
    for event in events:
        EVENTS.validate_python(event)


# ---- previous_response_id and the store ----


def prompt_text(tok: Tokenizer, engine: ScriptedEngine) -> str:
    return b"".join(tok.table.token_bytes[t] or b"" for t in engine.calls[0].prompt_ids).decode()


def test_previous_response_id_continues_the_stored_conversation(tok: Tokenizer) -> None:
    fmt = fmt_for(tok)
    first, _ = serve(fmt, tok, {"input": "My name is Ada.", "instructions": "Rule one."}, "Hi Ada")
    body = {"input": "What is my name?", "previous_response_id": first["id"]}
    second, engine = serve(fmt, tok, body, "Ada")
    prompt = prompt_text(tok, engine)
    for said in ("My name is Ada.", "Hi Ada", "What is my name?"):
        assert said.replace(" ", "▁") in prompt or said in prompt, said
    assert "Rule" not in prompt  # instructions are not carried over
    assert second["previous_response_id"] == first["id"]
    assert fmt.stored(second["id"]) == second


def test_a_tool_loop_continues_with_the_calls_result(tok: Tokenizer) -> None:
    fmt = fmt_for(tok)
    body = {"input": "Weather?", "tools": [WEATHER], "tool_choice": "required"}
    first, _ = serve(fmt, tok, body, CALLS)
    (call,) = first["output"]
    result = {"type": "function_call_output", "call_id": call["call_id"], "output": "20 C"}
    follow = {"input": [result], "previous_response_id": first["id"], "tools": [WEATHER]}
    second, engine = serve(fmt, tok, follow, "It is 20 C.")
    assert second["output"][0]["content"][0]["text"] == "It is 20 C."
    assert "TOOL_RESULTS:" in prompt_text(tok, engine) and "20" in prompt_text(tok, engine)
    # The same turn with the whole conversation resent is the same prompt.
    resent = {"input": [{"role": "user", "content": "Weather?"}, call, result], "tools": [WEATHER]}
    _, again = serve(fmt, tok, resent, "It is 20 C.")
    assert again.calls[0].prompt_ids == engine.calls[0].prompt_ids
    with pytest.raises(RequestError) as err:
        fmt.parse({"input": [result | {"call_id": "call_other"}], "tools": [WEATHER]}, CTX)
    assert err.value.param == "input[0].call_id"


def test_a_miss_is_a_404_naming_the_id(tok: Tokenizer) -> None:
    fmt = ResponsesFormat("m", tok.tool_format, ResponseStore(8, 10**6, 60), "; two of us")
    with pytest.raises(RequestError) as err:
        fmt.parse({"input": "Hi", "previous_response_id": "resp_gone"}, CTX)
    e = err.value
    assert (e.status, e.param, e.code) == (
        404,
        "previous_response_id",
        "previous_response_not_found",
    )
    assert "'resp_gone'" in e.message and "two of us" in e.message
    body = fmt.error_body(e)["error"]
    assert body["type"] == "not_found_error" and body["param"] == "previous_response_id"


def test_store_false_keeps_nothing_and_get_delete_read_the_store(tok: Tokenizer) -> None:
    fmt = fmt_for(tok)
    kept, _ = serve(fmt, tok, {"input": "Hi"}, "Hello")
    unkept, _ = serve(fmt, tok, {"input": "Hi", "store": False}, "Hello")
    assert fmt.stored(kept["id"]) == kept and unkept["store"] is False
    with pytest.raises(RequestError) as err:
        fmt.stored(unkept["id"])
    assert err.value.status == 404
    assert fmt.delete(kept["id"]) == {"id": kept["id"], "object": "response", "deleted": True}
    with pytest.raises(RequestError):
        fmt.delete(kept["id"])


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_store_is_bounded_by_entries_bytes_and_age() -> None:
    clock = Clock()
    store = ResponseStore(max_entries=2, max_bytes=100, max_age_s=10, clock=clock)
    assert store.put("a", {}, (), 10) and store.put("b", {}, (), 10) and store.put("c", {}, (), 10)
    assert store.get("a") is None and store.get("b") is not None  # the oldest went first
    assert store.put("d", {}, (), 85)  # over the bytes bound: b goes, c and d stay
    assert (store.get("b"), store.bytes) == (None, 95)
    assert not store.put("e", {}, (), 101)  # larger than the whole store: never kept
    clock.now = 10.5
    assert store.get("c") is None and store.bytes == 0
    assert ResponseStore(0, 100, 10).put("x", {}, (), 1) is False  # storing switched off


# ---- refusals ----

BAD = [
    ({"input": []}, "input"),
    ({"input": 3}, "input"),
    ({"input": "x", "temperature": 3}, "temperature"),
    ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
    ({"input": "x", "truncation": "auto"}, "truncation"),
    ({"input": "x", "background": True}, "background"),
    ({"input": "x", "reasoning": {"effort": "high"}}, "reasoning.effort"),
    ({"input": "x", "include": ["reasoning.encrypted_content"]}, "include"),
    ({"input": "x", "top_logprobs": 2}, "top_logprobs"),
    ({"input": "x", "conversation": "c"}, "conversation"),
    ({"input": "x", "seed": 1}, "seed"),
    ({"input": [{"type": "reasoning", "summary": []}]}, "input[0].type"),
    ({"input": [{"role": "robot", "content": "x"}]}, "input[0].role"),
    ({"input": [{"role": "user", "content": [{"type": "input_image"}]}]}, "input[0].content[0].type"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f"}]}, "input[0].arguments"),
    ({"input": [{"type": "function_call_output", "call_id": "c", "output": "x"}]}, "input[0].call_id"),
    ({"input": "x", "tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"input": "x", "tools": [WEATHER | {"parameters": {"type": "array"}}]}, "tools[0].parameters.type"),
    ({"input": "x", "tools": [WEATHER], "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice.name"),
    ({"input": "x", "tool_choice": "required"}, "tool_choice"),
    ({"input": "x", "text": {"format": {"type": "json_schema"}}}, "text.format"),
    ({"input": "x", "tools": [WEATHER], "tool_choice": "required", "text": {"format": {"type": "json_object"}}}, "text.format"),
    ({"input": "x", "metadata": {str(i): "v" for i in range(17)}}, "metadata"),
    ({"input": "x", "previous_response_id": ""}, "previous_response_id"),
]  # fmt: skip


@pytest.mark.parametrize(("body", "param"), BAD)
def test_bad_fields_are_400s_that_name_them(tok: Tokenizer, body: dict[str, Any], param: str):
    with pytest.raises(RequestError) as err:
        fmt_for(tok).parse(body, CTX)
    assert err.value.status == 400 and err.value.param == param, err.value.message


JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=6),
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=8), c, max_size=3),
    max_leaves=10,
)
ITEM = st.fixed_dictionaries(
    {},
    optional={
        "type": st.sampled_from(["message", "function_call", "function_call_output", "x"]),
        "role": st.sampled_from(["user", "assistant", "system", "developer", "tool"]),
        "content": JSONISH | st.just([{"type": "input_text", "text": "hi"}]),
        "call_id": JSONISH | st.just("c1"),
        "name": JSONISH | st.just("get_weather"),
        "arguments": JSONISH | st.just("{}"),
        "output": JSONISH,
    },
)
BODY = st.fixed_dictionaries(
    {},
    optional={
        "input": st.text(max_size=5) | st.lists(ITEM, max_size=4) | JSONISH,
        "tools": st.lists(st.just(WEATHER) | JSONISH, max_size=2) | JSONISH,
        "tool_choice": st.sampled_from(["none", "auto", "required"]) | JSONISH,
        "text": JSONISH,
        "previous_response_id": JSONISH,
        "max_output_tokens": JSONISH,
        "store": JSONISH,
    },
)


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(body=BODY)
def test_any_body_is_parsed_or_refused_with_a_field_named(tok: Tokenizer, body: dict[str, Any]):
    fmt = fmt_for(tok)
    try:
        call = fmt.parse(body, CTX)
    except RequestError as err:
        assert err.status in (400, 404) and err.param
        assert set(fmt.error_body(err)) == {"error"}
        return
    assert call.gen.messages  # an accepted body is a conversation to encode


# ---- streamed calls, whatever the format and however the text arrives ----


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(answers(), st.data())
def test_streamed_items_accumulate_to_the_whole_response(
    answer_: tuple[str, str, list[tuple[str, str]]], data: st.DataObject
) -> None:
    fmt_name, text, expected = answer_
    constrained = fmt_name == "constrained"
    fmt = ResponsesFormat("m", "mistral" if constrained else fmt_name, ResponseStore(8, 10**6, 60))
    tool = WEATHER | {"name": "f"}
    body = {"input": "x", "tools": [tool], "tool_choice": "required" if constrained else "auto"}
    call = fmt.parse(body | {"stream": True}, CTX)
    outcome = Outcome("stop", text, 5, 9)
    events = stream_of(fmt, call, splits(data, text), outcome)
    whole = fmt.response_body(call, outcome, "a")
    assert [
        (o["name"], o["arguments"]) for o in whole["output"] if o["type"] == "function_call"
    ] == expected
    final = accumulated(events)
    assert without_ids(sdk_output(final)) == without_ids(whole["output"])
    assert without_ids(events[-1]["response"]["output"]) == without_ids(whole["output"])


# ---- both TensorRT-LLM kinds, through the tensorrt_llm double ----


@pytest.mark.parametrize("kind", ["trtllm", "trtllm_pytorch"])
def test_required_calls_on_both_tensorrt_llm_kinds(
    fake_trtllm: Any, tmp_path: Any, tok: Tokenizer, kind: str
) -> None:
    from tests.doubles.trtllm_helpers import EOS, load, load_pytorch_kind

    engine = load(tmp_path) if kind == "trtllm" else load_pytorch_kind(tmp_path)
    engine.llm.script = tok.encode(CALLS) + [EOS]
    service = GenerationService(Settings(), tok, engine, Metrics(CollectorRegistry()))
    body = {"input": "Weather?", "tools": [WEATHER], "tool_choice": "required"}
    try:
        whole = answer(fmt_for(tok), service, body, "responses")
    finally:
        service.shutdown()
    assert engine.llm.requests[0].sampling_params.guided_decoding is not None
    (call,) = whole["output"]
    assert (call["name"], call["arguments"]) == ("get_weather", ARGS)
