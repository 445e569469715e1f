"""Tool calls through the chat route's whole path (ChatCompletionsFormat -> GenerationService ->
an engine -> the answer and the stream): per model format with a scripted engine, and
with both TensorRT-LLM kinds through the `tensorrt_llm` test double."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from mistral_serving.engines.base import EngineLimits
from mistral_serving.generation.service import GenerationService
from mistral_serving.ops.metrics import Metrics
from mistral_serving.ops.record import RequestRecord
from mistral_serving.protocols import ParseContext
from mistral_serving.protocols.openai.chat import ChatCall, ChatCompletionsFormat
from mistral_serving.protocols.openai.completions import CompletionsFormat
from mistral_serving.protocols.openai.types import ChatCompletion, ChatCompletionChunk
from mistral_serving.settings import Settings
from mistral_serving.structured.grammar import tool_call_schema
from mistral_serving.text.tokenizer import Tokenizer
from mistral_serving.tools.tool_calls import parse_tool_request
from tests.doubles.scripted_engine import ScriptedEngine
from tests.unit.test_tool_formats import v3_tokenizer

CTX = ParseContext(default_max_tokens=256)
LIMITS = EngineLimits(max_input_len=4096, max_seq_len=8192, max_batch_size=4)
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
USER = [{"role": "user", "content": "Weather in Paris?"}]
ARGS = '{"city": "Paris"}'


def fmt_for(tok: Tokenizer) -> ChatCompletionsFormat:
    return ChatCompletionsFormat("m", lambda t: tok.table.token_bytes[t] or b"", tok.tool_format)


def answer_ids(tok: Tokenizer, text: str) -> list[int]:
    """What a model that writes `text` generates (a tool token where the format has one)."""
    if text.startswith("[TOOL_CALLS]") and "[TOOL_CALLS]" in tok.special_ids:
        return [tok.special_ids["[TOOL_CALLS]"], *tok.encode(text.removeprefix("[TOOL_CALLS]"))]
    return tok.encode(text)


def serve(tok: Tokenizer, body: dict[str, Any], text: str, per_step: int = 2) -> Any:
    """(the non-streamed answer, the stream's decoded events, the engine) for `body`
    when the model writes `text`."""
    fmt = fmt_for(tok)
    ids = answer_ids(tok, text)
    results: list[Any] = []
    for stream in (False, True):
        engine = ScriptedEngine.from_ids(ids, "stop", per_step=per_step, limits=LIMITS)
        service = GenerationService(Settings(), tok, engine, Metrics(CollectorRegistry()))
        call = fmt.parse({"messages": USER, "tools": [WEATHER]} | body | {"stream": stream}, CTX)
        assert isinstance(call, ChatCall)
        results.append(asyncio.run(_run(fmt, service, call, stream)))
        service.shutdown()
    return results[0], results[1], engine


async def _run(
    fmt: ChatCompletionsFormat, service: GenerationService, call: ChatCall, stream: bool
):
    record = RequestRecord("req", "chat_completions", engine_id="e1")
    prepared = await service.prepare(call.gen)
    generation = service.generate(prepared, record)
    if not stream:
        whole = fmt.response_body(call, await generation.complete(), record.engine_id)
        msgspec.convert(whole, ChatCompletion)  # strictly OpenAI's shape, as typed
        return whole
    events = [e async for e in fmt.stream_events(call, generation, record.engine_id)]
    assert events[-1] == "data: [DONE]\n\n"
    decoded = [json.loads(e.removeprefix("data: ")) for e in events[:-1]]
    for event in decoded:
        msgspec.convert(event, ChatCompletionChunk)
    return decoded


def joined(events: list[dict[str, Any]]) -> tuple[str, list[dict[str, Any]], str | None]:
    """(content, calls, finish_reason) from stream events, checking OpenAI's shape: each
    call's first delta has index, id, type and a non-empty name; later ones only arguments."""
    content, calls, finish = "", [], None
    for e in events:
        for c in e["choices"]:
            delta = c["delta"]
            content += delta.get("content") or ""
            for tc in delta.get("tool_calls") or []:
                if tc["index"] == len(calls):
                    assert tc["id"] and tc["type"] == "function" and tc["function"]["name"]
                    calls.append({"id": tc["id"], "name": tc["function"]["name"], "arguments": ""})
                else:
                    assert set(tc) == {"index", "function"} and set(tc["function"]) == {"arguments"}
                calls[tc["index"]]["arguments"] += tc["function"]["arguments"]
            finish = c["finish_reason"] or finish
    return content, calls, finish


FORMAT_ANSWERS = {
    "fallback_json": f'Let me look. TOOL_CALLS: [{{"name": "get_weather", "arguments": {ARGS}}}]',
    "mistral": f'Let me look. [TOOL_CALLS] [{{"name": "get_weather", "arguments": {ARGS}}}]',
}


@pytest.mark.parametrize("which", ["fallback_json", "mistral"])
def test_auto_calls_are_parsed_and_streamed_in_openais_shape(tok: Tokenizer, which: str) -> None:
    model_tok = tok if which == "fallback_json" else v3_tokenizer()
    assert model_tok.tool_format == which
    whole, events, _ = serve(model_tok, {}, FORMAT_ANSWERS[which])
    choice = whole["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    message = choice["message"]
    assert message["content"] == "Let me look."
    (call,) = message["tool_calls"]
    assert call["type"] == "function" and call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}
    content, calls, finish = joined(events)
    assert content == "Let me look." and finish == "tool_calls"
    assert [c["name"] for c in calls] == ["get_weather"]
    assert calls[0]["arguments"] == call["function"]["arguments"]  # byte for byte


def test_text_without_calls_stays_content(tok: Tokenizer) -> None:
    whole, events, _ = serve(tok, {}, "It is sunny [maybe] TOOL_CALL")
    assert whole["choices"][0]["message"] == {
        "role": "assistant",
        "content": "It is sunny [maybe] TOOL_CALL",
    }
    assert whole["choices"][0]["finish_reason"] == "stop"
    assert joined(events) == ("It is sunny [maybe] TOOL_CALL", [], "stop")


def test_a_broken_call_is_delivered_as_text_and_logged(
    tok: Tokenizer, caplog: pytest.LogCaptureFixture
) -> None:
    text = 'TOOL_CALLS: [{"name": "get_weather", "arguments": {"city": '
    whole, events, _ = serve(tok, {}, text)
    assert whole["choices"][0]["message"]["content"] == text
    assert "tool_calls" not in whole["choices"][0]["message"]
    # Streamed: what was read before the text ended went out as the call's deltas (its
    # name and a prefix of its arguments); the whole text then follows as content.
    content, calls, finish = joined(events)
    assert (content, finish) == (text, "stop")
    assert [(c["name"], c["arguments"]) for c in calls] == [("get_weather", '{"city": ')]
    assert "did not parse" in caplog.text


@pytest.mark.parametrize(
    "choice", ["required", {"type": "function", "function": {"name": "get_weather"}}]
)
def test_required_and_named_send_the_tool_grammar_and_read_the_json(
    tok: Tokenizer, choice: Any
) -> None:
    text = f'[{{"name": "get_weather", "arguments": {ARGS}}}]'
    whole, events, engine = serve(tok, {"tool_choice": choice}, text)
    guided = engine.calls[0].sampling.guided
    expected = tool_call_schema(parse_tool_request({"tools": [WEATHER], "tool_choice": choice}))
    assert guided is not None and json.loads(guided.json_schema or "") == expected
    message = whole["choices"][0]["message"]
    assert message["content"] is None and message["tool_calls"][0]["function"]["arguments"] == ARGS
    assert joined(events)[1][0]["arguments"] == ARGS


def test_ids_are_unique_across_calls_and_stable_in_a_stream(tok: Tokenizer) -> None:
    two = f'TOOL_CALLS: [{{"name": "get_weather", "arguments": {ARGS}}}, {{"name": "get_weather", "arguments": {{"city": "Lyon"}}}}]'
    whole, events, _ = serve(tok, {}, two)
    ids = [c["id"] for c in whole["choices"][0]["message"]["tool_calls"]]
    assert len(set(ids)) == 2
    _, calls, _ = joined(events)
    assert len({c["id"] for c in calls}) == 2
    # an id is sent once, on its call's first delta
    sent = [
        tc.get("id")
        for e in events
        for c in e["choices"]
        for tc in c["delta"].get("tool_calls") or []
    ]
    assert len([i for i in sent if i]) == 2


def test_tool_choice_none_leaves_tools_out_and_reads_text(tok: Tokenizer) -> None:
    text = 'TOOL_CALLS: [{"name": "get_weather", "arguments": {}}]'
    whole, _, engine = serve(tok, {"tool_choice": "none"}, text)
    assert whole["choices"][0]["message"]["content"] == text
    prompt = b"".join(tok.table.token_bytes[t] or b"" for t in engine.calls[0].prompt_ids)
    assert b"get_weather" not in prompt


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (
            {"tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice.function.name",
        ),
        (
            {
                "tools": [
                    {"type": "function", "function": {"name": "f", "parameters": {"type": "obj"}}}
                ]
            },
            "tools[0].function.parameters.type",
        ),
        (
            {"messages": USER + [{"role": "tool", "content": "x", "tool_call_id": "c9"}]},
            "messages[1].tool_call_id",
        ),
        (
            {"tool_choice": "required", "response_format": {"type": "json_object"}},
            "response_format",
        ),
        ({"tool_choice": "required", "min_tokens": 2}, "min_tokens"),
        ({"logprobs": True}, "logprobs"),
        ({"messages": [{"role": "user"}]}, "messages[0].content"),
    ],
)
def test_bad_tool_fields_are_400s_that_name_them(
    tok: Tokenizer, body: dict[str, Any], param: str
) -> None:
    from mistral_serving.errors import RequestError

    with pytest.raises(RequestError) as err:
        fmt_for(tok).parse({"messages": USER, "tools": [WEATHER]} | body, CTX)
    assert err.value.status == 400 and err.value.param == param


def test_completions_refuse_tools(tok: Tokenizer) -> None:
    from mistral_serving.errors import RequestError

    fmt = CompletionsFormat("m", lambda t: b"")
    with pytest.raises(RequestError) as err:
        fmt.parse({"prompt": "x", "tools": [WEATHER]}, CTX)
    assert err.value.param == "tools"


def test_history_with_calls_and_results_reaches_the_prompt(tok: Tokenizer) -> None:
    history = USER + [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": ARGS},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "20 C and sunny"},
    ]
    whole, _, engine = serve(tok, {"messages": history}, "It is 20 C.")
    assert whole["choices"][0]["message"]["content"] == "It is 20 C."
    prompt = b"".join(tok.table.token_bytes[t] or b"" for t in engine.calls[0].prompt_ids)
    assert b"20 C and sunny" in prompt and b"TOOL_RESULTS:" in prompt


# -- both TensorRT-LLM kinds, through the tensorrt_llm double ------------------------------


@pytest.mark.parametrize("kind", ["trtllm", "trtllm_pytorch"])
def test_required_calls_on_both_tensorrt_llm_kinds(
    fake_trtllm: Any, tmp_path: Any, tok: Tokenizer, kind: str
) -> None:
    from tests.doubles.trtllm_helpers import EOS, load, load_pytorch_kind

    engine = load(tmp_path) if kind == "trtllm" else load_pytorch_kind(tmp_path)
    # The double plays its script (the runtime's grammar is upstream's); the script is a
    # constrained answer, as xgrammar would let it through.
    engine.llm.script = tok.encode(f'[{{"name": "get_weather", "arguments": {ARGS}}}]') + [EOS]
    service = GenerationService(Settings(), tok, engine, Metrics(CollectorRegistry()))
    fmt = fmt_for(tok)
    call = fmt.parse({"messages": USER, "tools": [WEATHER], "tool_choice": "required"}, CTX)
    assert isinstance(call, ChatCall)
    try:
        whole = asyncio.run(_run(fmt, service, call, stream=False))
    finally:
        service.shutdown()
    params = engine.llm.requests[0].sampling_params.guided_decoding
    schema = json.dumps(
        tool_call_schema(parse_tool_request({"tools": [WEATHER], "tool_choice": "required"}))
    )
    assert params == fake_trtllm.sampling_params.GuidedDecodingParams(json=schema)
    message = whole["choices"][0]["message"]
    assert whole["choices"][0]["finish_reason"] == "tool_calls"
    assert message["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": ARGS}


def test_the_tool_grammar_is_checked_by_the_gate_and_named_tools(tok: Tokenizer) -> None:
    from mistral_serving.errors import RequestError

    # A pattern far over the bound: the gate refuses it, naming `tools`, before any engine.
    bad = json.loads(json.dumps(WEATHER))
    bad["function"]["parameters"]["properties"]["city"] = {
        "type": "string",
        "pattern": "((a{0,99}){0,99}){0,99}",
    }
    engine = ScriptedEngine(limits=LIMITS)
    service = GenerationService(Settings(), tok, engine, Metrics(CollectorRegistry()))
    call = fmt_for(tok).parse({"messages": USER, "tools": [bad], "tool_choice": "required"}, CTX)
    assert isinstance(call, ChatCall)
    try:
        with pytest.raises(RequestError) as err:
            asyncio.run(service.prepare(call.gen))
    finally:
        service.shutdown()
    assert err.value.param == "tools" and not engine.calls


JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=6),
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=8), c, max_size=3),
    max_leaves=10,
)
TOOL_FIELDS = st.fixed_dictionaries(
    {},
    optional={
        "tools": st.one_of(JSONISH, st.lists(st.just(WEATHER) | JSONISH, max_size=3)),
        "tool_choice": st.sampled_from(["none", "auto", "required", "x"]) | JSONISH,
        "parallel_tool_calls": JSONISH,
        "messages": st.lists(
            st.fixed_dictionaries(
                {"role": st.sampled_from(["user", "assistant", "tool", "system", "x"])},
                optional={
                    "content": JSONISH,
                    "tool_calls": JSONISH
                    | st.just([{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}]),
                    "tool_call_id": JSONISH | st.just("c1"),
                },
            ),
            min_size=1,
            max_size=4,
        ),
    },
)  # fmt: skip


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(body=TOOL_FIELDS)
def test_any_tool_body_is_parsed_or_a_400_naming_a_field(
    tok: Tokenizer, body: dict[str, Any]
) -> None:
    from mistral_serving.errors import RequestError

    try:
        call = fmt_for(tok).parse({"messages": USER} | body, CTX)
    except RequestError as err:
        assert err.status == 400 and err.param
        return
    assert isinstance(call, ChatCall)
    if call.tools is not None:  # what was accepted is well formed
        assert call.tools.tools and call.tools.choice in ("auto", "required", "named")
