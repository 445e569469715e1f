"""The agents' APIs against the real Truss server, with the real SDKs unchanged: the
openai SDK's `responses.create` / `responses.stream` (streamed and not, with tools, a
two-turn tool loop chained by previous_response_id and the same turn with the whole input
resent, GET and DELETE of a stored response) and the anthropic SDK's `messages.create` /
`messages.stream` (a tool loop, count_tokens), each README "Works with" row as written;
on the random-weight dev model (forced calls valid with bounded arguments; streamed
answers equal to the non-streamed ones, greedy) and on SmolLM2 (a real model, answering)."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import jsonschema
import openai
import pytest

from tests.works_with import rows

pytestmark = pytest.mark.e2e

SERVED = "mistral-7b-instruct"
# Bounded arguments: a random-weight model cannot run on inside them.
PARAMS = {
    "type": "object",
    "properties": {"city": {"enum": ["Paris", "Lyon"]}, "unit": {"enum": ["C", "F"]}},
    "required": ["city"],
    "additionalProperties": False,
}
TOOL = {"type": "function", "name": "get_weather", "description": "Weather", "parameters": PARAMS}
ANTHROPIC_TOOL = {"name": "get_weather", "description": "Weather", "input_schema": PARAMS}
QUESTION = "What is the weather in Paris?"
# anthropic 2.10's messages.create has no sampling parameters (Anthropic's newer models
# take none); the API's temperature, top_p and top_k still reach the server as body fields.
GREEDY = {"extra_body": {"temperature": 0}}


@pytest.fixture(scope="module")
def oai(server_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server_url}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def claude(server_url: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server_url, api_key="unused", max_retries=0)


def function_calls(response: Any) -> list[Any]:
    return [item for item in response.output if item.type == "function_call"]


# ---- the Responses API ----


def test_the_readme_responses_row_forces_a_valid_call(server_url: str) -> None:
    response = eval(rows()["openai SDK (Responses)"].local(server_url), {"OpenAI": openai.OpenAI})
    assert response.status == "completed"
    (call,) = function_calls(response)
    assert call.name == "get_weather" and call.call_id
    jsonschema.validate(json.loads(call.arguments), PARAMS)


@pytest.mark.parametrize("seed", [None, 1, 2])
def test_required_calls_validate_on_the_random_model(oai: openai.OpenAI, seed: Any) -> None:
    extra = {"temperature": 0} if seed is None else {"temperature": 1.0, "top_p": 0.9}
    r = oai.responses.create(
        model=SERVED, input=QUESTION, tools=[TOOL], tool_choice="required",
        max_output_tokens=400, **extra,
    )  # fmt: skip
    calls = function_calls(r)
    assert calls and r.status == "completed"
    for call in calls:
        jsonschema.validate(json.loads(call.arguments), PARAMS)


@pytest.mark.parametrize("tools", [False, True])
def test_a_stream_joins_to_the_non_streamed_response(oai: openai.OpenAI, tools: bool) -> None:
    body: dict[str, Any] = dict(model=SERVED, input=QUESTION, max_output_tokens=24, temperature=0)
    if tools:  # the grammar ends the answer: it completes
        body |= dict(tools=[TOOL], tool_choice={"type": "function", "name": "get_weather"})
        body["max_output_tokens"] = 64
    whole = oai.responses.create(**body)
    text, arguments, kinds = "", "", []
    for event in oai.responses.create(stream=True, **body):
        kinds.append(event.type)
        text += event.delta if event.type == "response.output_text.delta" else ""
        arguments += event.delta if event.type == "response.function_call_arguments.delta" else ""
    assert kinds[0] == "response.created" and kinds[-1] == f"response.{whole.status}"
    assert text == whole.output_text  # greedy: the same answer, joined exactly
    assert arguments == "".join(c.arguments for c in function_calls(whole))
    if whole.status != "completed":
        return  # the SDK's stream helper wants response.completed (the random model runs on)
    with oai.responses.stream(**body) as stream:
        final = stream.get_final_response()
    assert [i.type for i in final.output] == [i.type for i in whole.output]
    assert final.output_text == whole.output_text and final.usage == whole.usage
    assert [c.arguments for c in function_calls(final)] == [
        c.arguments for c in function_calls(whole)
    ]


def run_tool(call: Any) -> dict[str, Any]:
    city = json.loads(call.arguments)["city"]
    return {"type": "function_call_output", "call_id": call.call_id, "output": f"20 C in {city}"}


def test_a_tool_loop_by_previous_response_id_or_by_resending_gives_one_answer(
    oai: openai.OpenAI,
) -> None:
    common: dict[str, Any] = dict(model=SERVED, tools=[TOOL], max_output_tokens=16, temperature=0)
    forced = dict(tool_choice="required", parallel_tool_calls=False, max_output_tokens=64)
    first = oai.responses.create(input=QUESTION, **(common | forced))
    results = [run_tool(c) for c in function_calls(first)]
    assert len(results) == 1
    chained = oai.responses.create(previous_response_id=first.id, input=results, **common)
    assert chained.previous_response_id == first.id and chained.status != "failed"
    history = [{"role": "user", "content": QUESTION}, *first.output]  # as the SDK sends them
    resent = oai.responses.create(input=[*history, *results], **common)
    assert resent.output_text == chained.output_text  # the same prompt: the same greedy answer
    assert resent.usage.input_tokens == chained.usage.input_tokens
    assert oai.responses.retrieve(chained.id).output_text == chained.output_text
    oai.responses.delete(chained.id)
    with pytest.raises(openai.NotFoundError):
        oai.responses.retrieve(chained.id)
    with pytest.raises(openai.NotFoundError) as missed:
        oai.responses.create(previous_response_id=chained.id, input="and Lyon?", **common)
    assert chained.id in str(missed.value)


# ---- Anthropic's Messages API ----


def test_the_readme_anthropic_row_forces_one_valid_call(server_url: str) -> None:
    message = eval(rows()["anthropic SDK"].local(server_url), {"Anthropic": anthropic.Anthropic})
    assert message.stop_reason == "tool_use"
    (use,) = [b for b in message.content if b.type == "tool_use"]
    assert use.name == "get_weather"
    jsonschema.validate(use.input, PARAMS)


@pytest.mark.parametrize("tools", [False, True])
def test_a_message_stream_joins_to_the_non_streamed_message(
    claude: anthropic.Anthropic, tools: bool
) -> None:
    body: dict[str, Any] = dict(
        model=SERVED, max_tokens=24, messages=[{"role": "user", "content": QUESTION}], **GREEDY
    )
    if tools:  # room for the whole call (one cut short is text: docs/anthropic-messages.md)
        body |= dict(tools=[ANTHROPIC_TOOL], tool_choice={"type": "tool", "name": "get_weather"})
        body["max_tokens"] = 64
    whole = claude.messages.create(**body)
    with claude.messages.stream(**body) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "".join(b.text for b in whole.content if b.type == "text")
    assert [b.model_dump(exclude={"id"}) for b in final.content] == [
        b.model_dump(exclude={"id"}) for b in whole.content
    ]
    assert (final.stop_reason, final.usage.output_tokens) == (
        whole.stop_reason,
        whole.usage.output_tokens,
    )


def test_a_tool_loop_and_count_tokens(claude: anthropic.Anthropic) -> None:
    messages: list[Any] = [{"role": "user", "content": QUESTION}]
    common: dict[str, Any] = dict(model=SERVED, tools=[ANTHROPIC_TOOL], **GREEDY)
    first = claude.messages.create(
        max_tokens=64,
        tool_choice={"type": "any", "disable_parallel_tool_use": True},  # one call: bounded
        messages=messages,
        **common,
    )
    assert first.stop_reason == "tool_use"
    uses = [b for b in first.content if b.type == "tool_use"]
    results = [
        {"type": "tool_result", "tool_use_id": u.id, "content": f"20 C in {u.input['city']}"}
        for u in uses
    ]
    messages += [
        {"role": "assistant", "content": first.content},
        {"role": "user", "content": results},
    ]
    counted = claude.messages.count_tokens(model=SERVED, tools=[ANTHROPIC_TOOL], messages=messages)
    second = claude.messages.create(max_tokens=16, messages=messages, **common)
    assert second.usage.input_tokens == counted.input_tokens  # count_tokens counts that prompt
    assert second.stop_reason in ("end_turn", "max_tokens", "tool_use")
    with pytest.raises(anthropic.BadRequestError) as bad:
        claude.messages.create(max_tokens=0, messages=messages, **common)
    assert bad.value.body["error"]["type"] == "invalid_request_error"


# ---- SmolLM2: a real model ----


def test_a_real_model_answers_on_both_apis_and_calls_when_told(smollm2_url: str) -> None:
    oai = openai.OpenAI(base_url=f"{smollm2_url}/v1", api_key="unused", max_retries=0)
    claude = anthropic.Anthropic(base_url=smollm2_url, api_key="unused", max_retries=0)
    asked = "What is the capital of France?"
    r = oai.responses.create(model=SERVED, input=asked, max_output_tokens=16, temperature=0)
    assert "Paris" in r.output_text
    m = claude.messages.create(
        model=SERVED, max_tokens=16, messages=[{"role": "user", "content": asked}], **GREEDY
    )
    assert "Paris" in m.content[0].text and m.stop_reason in ("end_turn", "max_tokens")
    forced = claude.messages.create(
        model=SERVED, max_tokens=48, tools=[ANTHROPIC_TOOL], **GREEDY,
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
        messages=[{"role": "user", "content": QUESTION}],
    )  # fmt: skip
    (use,) = [b for b in forced.content if b.type == "tool_use"]
    jsonschema.validate(use.input, PARAMS)
