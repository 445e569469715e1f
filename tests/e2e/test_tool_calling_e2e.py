"""Tool calling against the real Truss server with the dev model (Mistral-7B's v1
tokenizer, so the fallback format): the openai SDK unchanged (streamed and not, its
`parse` and `stream` helpers), LangChain's `bind_tools` in a two-step agent loop, and the
README's "Works with" rows as written. `required` and named calls are constrained by the
tool-call grammar, so even the random-weight model's calls always validate."""

from __future__ import annotations

import json
from typing import Any, Literal

import jsonschema
import openai
import pytest
import requests
from langchain_core.messages import HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from pydantic import BaseModel

from tests.works_with import rows

pytestmark = pytest.mark.e2e

SERVED = "mistral-7b-instruct"
# Bounded arguments: a random-weight model cannot loop inside them (unbounded strings can
# run to max_tokens, and the answer then comes back as text with finish_reason length).
WEATHER_PARAMS = {
    "type": "object",
    "properties": {"city": {"enum": ["Paris", "Lyon"]}, "unit": {"enum": ["C", "F"]}},
    "required": ["city"],
    "additionalProperties": False,
}
CLOCK_PARAMS = {
    "type": "object",
    "properties": {"hour": {"type": "integer", "minimum": 0, "maximum": 23}},
    "required": ["hour"],
    "additionalProperties": False,
}
TOOLS: list[Any] = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city", "parameters": WEATHER_PARAMS}},
    {"type": "function", "function": {"name": "set_alarm", "parameters": CLOCK_PARAMS}},
]  # fmt: skip
PARAMS = {"get_weather": WEATHER_PARAMS, "set_alarm": CLOCK_PARAMS}
MESSAGES: list[Any] = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def client(server_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=server_url + "/v1", api_key="unused", max_retries=0)


def assert_valid(calls: list[Any], forced: str | None = None) -> None:
    assert calls
    for call in calls:
        assert call.type == "function" and call.id
        assert call.function.name in PARAMS and forced in (None, call.function.name)
        jsonschema.validate(json.loads(call.function.arguments), PARAMS[call.function.name])


@pytest.mark.parametrize("seed", [None, 1, 2, 3])
def test_required_calls_always_validate_on_the_random_model(
    client: openai.OpenAI, seed: Any
) -> None:
    extra = {"temperature": 0} if seed is None else {"temperature": 1.0, "seed": seed}
    r = client.chat.completions.create(
        model=SERVED,
        messages=MESSAGES,
        tools=TOOLS,
        tool_choice="required",
        max_tokens=400,  # room for MAX_PARALLEL_CALLS calls of ~25 tokens
        **extra,
    )
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    assert_valid(choice.message.tool_calls)
    assert len({c.id for c in choice.message.tool_calls}) == len(choice.message.tool_calls)


def test_a_named_call_streams_in_openais_shape_and_equals_the_answer(client: openai.OpenAI) -> None:
    body: dict[str, Any] = dict(
        model=SERVED,
        messages=MESSAGES,
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "set_alarm"}},
        parallel_tool_calls=False,
        max_tokens=64,
        temperature=0,
    )
    whole = client.chat.completions.create(**body)
    (call,) = whole.choices[0].message.tool_calls
    assert_valid([call], forced="set_alarm")
    names, args, ids, finish = [], {}, set(), None
    for chunk in client.chat.completions.create(stream=True, **body):
        for c in chunk.choices:
            finish = c.finish_reason or finish
            assert not c.delta.content
            for tc in c.delta.tool_calls or []:
                if tc.id:  # the first delta of a call: id, type and its (non-empty) name
                    assert tc.type == "function" and tc.function.name
                    names.append(tc.function.name)
                    ids.add(tc.id)
                else:
                    assert tc.function.name is None
                args[tc.index] = args.get(tc.index, "") + (tc.function.arguments or "")
    assert names == ["set_alarm"] and len(ids) == 1 and finish == "tool_calls"
    assert args[0] == call.function.arguments  # byte for byte (greedy: the same answer)


@pytest.mark.parametrize("seed", [1, 2])
def test_a_required_call_streams_its_arguments_in_pieces_equal_to_the_answer(
    client: openai.OpenAI, seed: int
) -> None:
    body: dict[str, Any] = dict(
        model=SERVED,
        messages=MESSAGES,
        tools=TOOLS,
        tool_choice="required",
        max_tokens=400,
        temperature=1.0,
        seed=seed,
    )
    whole = client.chat.completions.create(**body)
    assert whole.choices[0].finish_reason == "tool_calls"
    calls = whole.choices[0].message.tool_calls
    assert_valid(calls)
    names: dict[int, str] = {}
    args: dict[int, list[str]] = {}
    finish = None
    for chunk in client.chat.completions.create(stream=True, **body):
        for c in chunk.choices:
            finish = c.finish_reason or finish
            assert not c.delta.content
            for tc in c.delta.tool_calls or []:
                if tc.id:
                    assert tc.index not in names and tc.function.name
                    names[tc.index] = tc.function.name
                else:
                    assert tc.index in names  # the name came first
                if tc.function.arguments:
                    args.setdefault(tc.index, []).append(tc.function.arguments)
    assert finish == "tool_calls"
    assert [names[i] for i in sorted(names)] == [c.function.name for c in calls]
    # The same seed, the same answer: each call's fragments, joined, are its arguments,
    # and they came as the model wrote them (several chunks, not one at the end).
    assert ["".join(args[i]) for i in sorted(args)] == [c.function.arguments for c in calls]
    assert all(len(args[i]) > 1 for i in args)


class Weather(BaseModel):
    city: Literal["Paris", "Lyon"]
    unit: Literal["C", "F"]


def test_the_sdks_parse_and_stream_helpers_read_the_calls(client: openai.OpenAI) -> None:
    tools = [openai.pydantic_function_tool(Weather, name="get_weather")]
    parsed = client.chat.completions.parse(
        model=SERVED,
        messages=MESSAGES,
        tools=tools,
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=64,
        temperature=0,
    )
    (call,) = parsed.choices[0].message.tool_calls
    assert isinstance(call.function.parsed_arguments, Weather)
    with client.chat.completions.stream(
        model=SERVED,
        messages=MESSAGES,
        tools=tools,
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=64,
        temperature=0,
    ) as stream:
        events = list(stream)
        final = stream.get_final_completion()
    done = [e for e in events if e.type == "tool_calls.function.arguments.done"]
    pieces = [e for e in events if e.type == "tool_calls.function.arguments.delta"]
    assert [e.name for e in done] == ["get_weather"]
    assert len(pieces) > 1  # the arguments streamed in pieces, as generated
    assert isinstance(done[0].parsed_arguments, Weather)
    assert final.choices[0].message.tool_calls[0].function.arguments == call.function.arguments


def test_auto_on_the_random_model_is_text_or_valid_calls(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model=SERVED, messages=MESSAGES, tools=TOOLS, max_tokens=16, temperature=0
    )
    message = r.choices[0].message
    if message.tool_calls:
        assert r.choices[0].finish_reason == "tool_calls"
    else:  # random weights: text, with no markup in it
        assert message.content and "TOOL_CALLS:" not in message.content


def test_bad_tool_fields_are_400s_naming_the_field(client: openai.OpenAI, server_url: str) -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice.function.name"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "obj"}}}]}, "tools[0].function.parameters.type"),
        ({"tools": TOOLS, "messages": MESSAGES + [{"role": "tool", "tool_call_id": "c1", "content": "x"}]}, "messages[1].tool_call_id"),
    ]  # fmt: skip
    for extra, param in cases:
        body = {"model": SERVED, "messages": MESSAGES, "max_tokens": 4} | extra
        r = requests.post(f"{server_url}/v1/chat/completions", json=body, timeout=60)
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == param
    # and the server goes on serving
    assert client.chat.completions.create(model=SERVED, messages=MESSAGES, max_tokens=2).choices


def test_version_says_which_chat_and_tool_format_is_loaded(server_url: str) -> None:
    chat = requests.get(f"{server_url}/version", timeout=30).json()["chat"]
    assert chat == {"format": "mistral", "tools": "fallback_json"}  # the v1 tokenizer


# -- LangChain --------------------------------------------------------------------------


@tool
def get_weather(city: Literal["Paris", "Lyon"]) -> str:
    """Weather in a city."""
    return f"20 C and sunny in {city}"


def test_langchain_two_step_agent_loop(server_url: str) -> None:
    llm = ChatOpenAI(
        base_url=f"{server_url}/v1", api_key="unused", model=SERVED, max_tokens=48, temperature=0
    )
    history: list[Any] = [HumanMessage("What is the weather in Paris?")]
    # Step 1, forced: the model must call the tool.
    first = llm.bind_tools([get_weather], tool_choice="get_weather").invoke(history)
    (call,) = first.tool_calls
    assert call["name"] == "get_weather" and call["args"]["city"] in ("Paris", "Lyon")
    assert first.response_metadata["finish_reason"] == "tool_calls"
    result = get_weather.invoke(call)
    assert isinstance(result, ToolMessage) and result.tool_call_id == call["id"]
    # Step 2: the tool's result goes back; the model answers (auto).
    history += [first, result]
    final = llm.bind_tools([get_weather]).invoke(history)
    assert final.response_metadata["finish_reason"] in ("stop", "length", "tool_calls")
    assert final.content or final.tool_calls


def test_langchain_streams_a_forced_call(server_url: str) -> None:
    llm = ChatOpenAI(
        base_url=f"{server_url}/v1", api_key="unused", model=SERVED, max_tokens=48, temperature=0
    )
    bound = llm.bind_tools([get_weather], tool_choice="get_weather")
    merged = None
    for chunk in bound.stream("What is the weather in Paris?"):
        merged = chunk if merged is None else merged + chunk
    assert merged is not None
    whole = bound.invoke("What is the weather in Paris?")
    assert merged.tool_calls[0]["args"] == whole.tool_calls[0]["args"]
    assert merged.tool_calls[0]["name"] == "get_weather"


# -- the README's "Works with" rows, as written ------------------------------------------


def test_readme_openai_tools_row(server_url: str) -> None:
    row = rows()["openai SDK (tools)"]
    r = eval(row.local(server_url), {"OpenAI": openai.OpenAI})  # the README's command
    assert r.choices[0].finish_reason == "tool_calls"
    assert r.choices[0].message.tool_calls[0].function.name == "get_weather"


def test_readme_langchain_tools_row(server_url: str) -> None:
    row = rows()["LangChain (tools)"]
    ai = eval(row.local(server_url), {"ChatOpenAI": ChatOpenAI})  # the README's command
    assert ai.tool_calls[0]["name"] == "get_weather"
    assert ai.tool_calls[0]["args"]["city"] in ("Paris", "Lyon")


# -- SmolLM2 (a real model; its template takes no tools: the fallback format) ------------

CITY_TOOL = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]


@pytest.fixture(scope="module")
def smollm2_client(smollm2_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=smollm2_url + "/v1", api_key="unused", max_retries=0)


def test_smollm2_required_call_has_the_right_argument(smollm2_client: openai.OpenAI) -> None:
    question = [{"role": "user", "content": "What is the weather in Paris?"}]
    r = smollm2_client.chat.completions.create(
        model="m", messages=question, tools=CITY_TOOL, tool_choice="required",
        parallel_tool_calls=False, max_tokens=60, temperature=0,
    )  # fmt: skip
    (call,) = r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason == "tool_calls"
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}  # a real model's choice


def test_smollm2_auto_answers_in_text_without_markup(smollm2_client: openai.OpenAI) -> None:
    # 135M parameters do not follow the fallback's instruction to call: the answer is text,
    # parsed as such, with the tools in its prompt (not dropped).
    question = [{"role": "user", "content": "What is the weather in Paris?"}]
    r = smollm2_client.chat.completions.create(
        model="m", messages=question, tools=CITY_TOOL, max_tokens=60, temperature=0
    )
    message = r.choices[0].message
    assert message.tool_calls is None and message.content and "Paris" in message.content
    assert r.usage.prompt_tokens > 100  # the tool description is in the prompt
