"""The OpenAI routes' parsing (refusals by field, defaults, chat and completion prompts),
response bodies, SSE event sequences and the error shape, on a scripted engine."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from mistral_serving.chat import ChatMessage, encode_chat
from mistral_serving.engines.base import EngineLimits
from mistral_serving.metrics import Metrics
from mistral_serving.openai_api import (
    Route,
    error_response,
    parse,
    response_body,
    sse_events,
)
from mistral_serving.service import GenerationService, RequestError
from mistral_serving.settings import Settings
from mistral_serving.telemetry import RequestRecord
from mistral_serving.tokenizer import Tokenizer, load_tokenizer
from tests.doubles.scripted_engine import ScriptedEngine

LIMITS = EngineLimits(max_input_len=48, max_seq_len=96, max_batch_size=4)
MODEL = "mistral-7b-instruct"
USER = [{"role": "user", "content": "Hi there"}]


@pytest.fixture(scope="module")
def tok(dev_model: Path) -> Tokenizer:
    return load_tokenizer(dev_model)


@pytest.fixture
def service(tok: Tokenizer) -> GenerationService:
    return GenerationService(
        Settings(), tok, ScriptedEngine(limits=LIMITS), metrics=Metrics(CollectorRegistry())
    )


def chat(body: dict, service: GenerationService):
    return parse(Route.CHAT, {"messages": USER} | body, service)


# ---- parse: refusals ----


@pytest.mark.parametrize(
    ("route", "body", "param"),
    [
        (Route.CHAT, {"messages": USER, "tools": []}, "tools"),
        (
            Route.CHAT,
            {"messages": USER, "response_format": {"type": "json_object"}},
            "response_format",
        ),
        (Route.CHAT, {"messages": USER, "logit_bias": {"1": 5}}, "logit_bias"),
        (Route.CHAT, {"messages": USER, "n": 2}, "n"),
        (Route.CHAT, {"messages": USER, "logprobs": True}, "logprobs"),
        (
            Route.CHAT,
            {"messages": USER, "stream_options": {"include_usage": True}},
            "stream_options",
        ),
        (Route.CHAT, {"messages": USER, "top_p": 0}, "top_p"),
        (Route.COMPLETIONS, {"prompt": "x", "echo": True}, "echo"),
        (Route.COMPLETIONS, {"prompt": "x", "logprobs": 3}, "logprobs"),
        (Route.COMPLETIONS, {"prompt": "x", "best_of": 2}, "best_of"),
        (Route.COMPLETIONS, {"prompt": "x", "suffix": "y"}, "suffix"),
        (Route.COMPLETIONS, {"prompt": "x", "n": 3}, "n"),
        (Route.COMPLETIONS, {"prompt": "x", "logit_bias": {}}, "logit_bias"),
    ],
)
def test_unsupported_fields_are_refused_by_name(
    service: GenerationService, route: Route, body: dict, param: str
) -> None:
    with pytest.raises(RequestError) as err:
        parse(route, body, service)
    assert err.value.status == 400
    assert err.value.param == param
    assert param in err.value.message


@pytest.mark.parametrize("field", ["tools", "response_format", "logit_bias"])
def test_unsupported_field_message_says_unsupported(service: GenerationService, field: str) -> None:
    with pytest.raises(RequestError, match=f"unsupported field: {field}"):
        chat({field: {}}, service)


def test_stream_options_allowed_with_stream(service: GenerationService) -> None:
    call = chat({"stream": True, "stream_options": {"include_usage": True}}, service)
    assert (call.stream, call.include_usage) == (True, True)
    call = chat({"stream": True}, service)
    assert (call.stream, call.include_usage) == (True, False)


def test_missing_or_empty_messages_are_refused(service: GenerationService) -> None:
    for body in ({}, {"messages": []}):
        with pytest.raises(RequestError) as err:
            parse(Route.CHAT, body, service)
        assert err.value.param == "messages"


def test_non_text_content_part_is_refused(service: GenerationService) -> None:
    part = {"type": "image_url", "image_url": {"url": "http://x"}}
    with pytest.raises(RequestError) as err:
        parse(Route.CHAT, {"messages": [{"role": "user", "content": [part]}]}, service)
    assert err.value.param is not None and err.value.param.startswith("messages.0.content")


# ---- parse: chat prompts and options ----


def test_developer_role_is_a_system_message(service: GenerationService, tok: Tokenizer) -> None:
    # After the user turn, so that as a user message it would be merged into that turn
    # ("Hi there\n\nBe terse.") instead of leading it as the system prompt.
    msgs = [*USER, {"role": "developer", "content": "Be terse."}]
    call = parse(Route.CHAT, {"messages": msgs}, service)
    expected = encode_chat(
        [
            ChatMessage(role="user", content="Hi there"),
            ChatMessage(role="system", content="Be terse."),
        ],
        tok,
    )
    assert call.gen.prompt_ids == expected
    as_user = encode_chat(
        [
            ChatMessage(role="user", content="Hi there"),
            ChatMessage(role="user", content="Be terse."),
        ],
        tok,
    )
    assert call.gen.prompt_ids != as_user


def test_content_as_text_parts(service: GenerationService, tok: Tokenizer) -> None:
    parts = [{"type": "text", "text": "first"}, {"type": "text", "text": "second"}]
    call = parse(Route.CHAT, {"messages": [{"role": "user", "content": parts}]}, service)
    expected = encode_chat([ChatMessage(role="user", content="first\n\nsecond")], tok)
    assert call.gen.prompt_ids == expected


def test_chat_defaults(service: GenerationService) -> None:
    call = chat({}, service)
    s = call.gen.sampling
    assert call.route is Route.CHAT and call.stream is False and call.include_usage is False
    assert s.max_new_tokens == LIMITS.max_seq_len - len(call.gen.prompt_ids)
    assert (s.temperature, s.top_p, s.top_k) == (1.0, 1.0, 0)
    assert call.gen.stop == () and call.gen.interval == 1


def test_max_completion_tokens_preferred_over_max_tokens(service: GenerationService) -> None:
    assert (
        chat({"max_tokens": 5, "max_completion_tokens": 7}, service).gen.sampling.max_new_tokens
        == 7
    )
    assert chat({"max_tokens": 5}, service).gen.sampling.max_new_tokens == 5
    assert chat({"max_completion_tokens": 9}, service).gen.sampling.max_new_tokens == 9


def test_options_map_to_sampling(service: GenerationService) -> None:
    call = chat(
        {
            "temperature": 0,
            "top_p": 0.9,
            "seed": 3,
            "stop": "###",
            "top_k": 5,
            "presence_penalty": 1.0,
            "frequency_penalty": 0.5,
            "repetition_penalty": 1.2,
            "user": "u",
            "model": "anything",
        },
        service,
    )
    s = call.gen.sampling
    assert (s.temperature, s.top_p, s.seed, s.top_k) == (0.0, 0.9, 3, 5)
    assert (s.presence_penalty, s.frequency_penalty, s.repetition_penalty) == (1.0, 0.5, 1.2)
    assert call.gen.stop == ("###",)


def test_chat_prompt_over_the_input_limit(service: GenerationService) -> None:
    long = [{"role": "user", "content": " ".join(["word"] * 60)}]
    with pytest.raises(RequestError, match="input tokens"):
        parse(Route.CHAT, {"messages": long}, service)


def test_chat_prompt_over_the_limit_names_messages(service: GenerationService) -> None:
    """The error's `param` must name a field of the request: a chat request has no
    `prompt`, its prompt is `messages` (OpenAI answers param "messages" here too)."""
    long = [{"role": "user", "content": " ".join(["word"] * 60)}]
    with pytest.raises(RequestError) as err:
        parse(Route.CHAT, {"messages": long}, service)
    assert err.value.param == "messages"


def test_completion_prompt_over_the_limit_names_prompt(service: GenerationService) -> None:
    with pytest.raises(RequestError) as err:
        parse(Route.COMPLETIONS, {"prompt": " ".join(["word"] * 60)}, service)
    assert err.value.param == "prompt"


# ---- parse: completions ----


def test_completions_default_max_tokens_is_16(service: GenerationService, tok: Tokenizer) -> None:
    call = parse(Route.COMPLETIONS, {"prompt": "Once upon"}, service)
    assert call.gen.sampling.max_new_tokens == 16
    assert call.gen.prompt_ids == tok.encode("Once upon", bos=True)


def test_completions_prompt_forms(service: GenerationService, tok: Tokenizer) -> None:
    one = parse(Route.COMPLETIONS, {"prompt": ["Once upon"]}, service)
    assert one.gen.prompt_ids == tok.encode("Once upon", bos=True)
    ids = tok.encode("Once upon")
    as_ids = parse(Route.COMPLETIONS, {"prompt": ids}, service)
    assert as_ids.gen.prompt_ids == ids  # used as given: no BOS added


@pytest.mark.parametrize("prompt", [["a", "b"], []])
def test_completions_batches_are_refused(service: GenerationService, prompt: list) -> None:
    with pytest.raises(RequestError) as err:
        parse(Route.COMPLETIONS, {"prompt": prompt}, service)
    assert err.value.param == "prompt"


@pytest.mark.parametrize("bad", [-1, 32000, 10**6])
def test_token_id_prompt_is_checked_against_the_vocab(service: GenerationService, bad: int) -> None:
    with pytest.raises(RequestError) as err:
        parse(Route.COMPLETIONS, {"prompt": [1, 100, bad]}, service)
    assert err.value.param == "prompt"
    assert "32000" in err.value.message


def test_token_id_prompt_at_the_vocab_edge_is_accepted(service: GenerationService) -> None:
    call = parse(Route.COMPLETIONS, {"prompt": [0, 31999]}, service)
    assert call.gen.prompt_ids == [0, 31999]


# ---- bodies and streams ----


def finished_record(
    output: str, reason: str, prompt_tokens: int = 4, completion_tokens: int = 3
) -> RequestRecord:
    record = RequestRecord("req-1", "chat_completions", engine_id="abc")
    record.output, record.finish_reason = output, reason
    record.prompt_tokens, record.completion_tokens = prompt_tokens, completion_tokens
    return record


def test_chat_response_body(service: GenerationService) -> None:
    call = chat({}, service)
    body = response_body(call, finished_record("Hello!", "stop"), MODEL)
    assert body["id"] == "chatcmpl-abc"
    assert body["object"] == "chat.completion"
    assert body["model"] == MODEL and body["created"] == call.created
    assert body["choices"] == [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "Hello!"},
            "logprobs": None,
            "finish_reason": "stop",
        }
    ]
    assert body["usage"] == {"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7}


def test_completion_response_body(service: GenerationService) -> None:
    call = parse(Route.COMPLETIONS, {"prompt": "x"}, service)
    body = response_body(call, finished_record("yz", "length"), MODEL)
    assert body["id"] == "cmpl-abc" and body["object"] == "text_completion"
    assert body["choices"] == [
        {"index": 0, "text": "yz", "logprobs": None, "finish_reason": "length"}
    ]


async def chunks_of(
    parts: list[str], record: RequestRecord, error: RequestError | None = None
) -> AsyncIterator[str]:
    for p in parts:
        yield p
    if error is not None:
        raise error
    record.finish_reason = "stop"


def run_sse(
    call, parts: list[str], record: RequestRecord, error: RequestError | None = None
) -> list[str]:
    async def main() -> list[str]:
        return [e async for e in sse_events(call, chunks_of(parts, record, error), record, MODEL)]

    return asyncio.run(main())


def decode(events: list[str]) -> list[dict]:
    assert events[-1] == "data: [DONE]\n\n"
    out = []
    for e in events[:-1]:
        assert e.startswith("data: ") and e.endswith("\n\n")
        out.append(json.loads(e[len("data: ") :]))
    return out


TRICKY = ['He said "hi"\n', "\\ back\tslash", "café 😀 東京", "\x00text\x00 </s>"]


@pytest.mark.parametrize("include_usage", [False, True])
def test_chat_sse_sequence(service: GenerationService, include_usage: bool) -> None:
    body = {"stream": True} | ({"stream_options": {"include_usage": True}} if include_usage else {})
    call = chat(body, service)
    record = finished_record("", "stop")
    events = decode(run_sse(call, TRICKY, record))
    assert all(
        e["id"] == "chatcmpl-abc"
        and e["object"] == "chat.completion.chunk"
        and e["model"] == MODEL
        and e["created"] == call.created
        for e in events
    )
    role, *deltas, finish = events[:-1] if include_usage else events
    assert role["choices"] == [
        {
            "index": 0,
            "delta": {"role": "assistant", "content": ""},
            "logprobs": None,
            "finish_reason": None,
        }
    ]
    assert [d["choices"][0]["delta"] for d in deltas] == [{"content": t} for t in TRICKY]
    assert all(d["choices"][0]["finish_reason"] is None for d in deltas)
    assert finish["choices"] == [
        {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}
    ]
    if include_usage:
        assert all("usage" in e and e["usage"] is None for e in events[:-1])
        assert events[-1]["choices"] == []
        assert events[-1]["usage"] == record.usage
    else:
        assert all("usage" not in e for e in events)


def test_completion_sse_sequence(service: GenerationService) -> None:
    call = parse(Route.COMPLETIONS, {"prompt": "x", "stream": True}, service)
    record = finished_record("", "length")
    events = decode(run_sse(call, ["a", "b c"], record))
    assert all(e["object"] == "text_completion" and e["id"] == "cmpl-abc" for e in events)
    assert [e["choices"][0]["text"] for e in events] == ["a", "b c", ""]
    assert [e["choices"][0]["finish_reason"] for e in events] == [None, None, "stop"]


def test_sse_error_mid_stream_ends_with_an_error_event(service: GenerationService) -> None:
    call = chat({"stream": True}, service)
    record = finished_record("", "error")
    events = decode(run_sse(call, ["partial"], record, RequestError("bad token", param="prompt")))
    assert events[-1] == {
        "error": {
            "message": "bad token",
            "type": "invalid_request_error",
            "param": "prompt",
            "code": None,
        }
    }
    assert all(e.get("choices", [{}])[0].get("finish_reason") is None for e in events[:-1])


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, "invalid_request_error"),
        (404, "not_found_error"),
        (429, "rate_limit_error"),
        (503, "service_unavailable"),
        (500, "server_error"),
    ],
)
def test_error_response_shape(status: int, kind: str) -> None:
    resp = error_response(
        status, "nope", "messages", "rid-1", headers={"Retry-After": "1"}, code="x"
    )
    assert resp.status_code == status
    assert json.loads(resp.body) == {
        "error": {"message": "nope", "type": kind, "param": "messages", "code": "x"}
    }
    assert resp.headers["X-Request-Id"] == "rid-1"
    assert resp.headers["Retry-After"] == "1"
