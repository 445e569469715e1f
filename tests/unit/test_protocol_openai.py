"""The OpenAI routes' format: parsing (refusals by field, strict types, defaults, chat and
completion prompts, logprobs, response_format), answers and SSE event sequences in
OpenAI's exact shapes (logprobs included), the error shape, and any body giving a call
or a RequestError."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from mistral_serving.engines.base import EngineLimits, TokenLogprob
from mistral_serving.errors import RequestError
from mistral_serving.generation.outcome import Outcome
from mistral_serving.generation.service import Chunk, GenerationService, PreparedRequest
from mistral_serving.ops.metrics import Metrics
from mistral_serving.protocols import ParseContext
from mistral_serving.protocols.openai.base import OpenAICall, OpenAIRoute
from mistral_serving.protocols.openai.chat import ChatCall, ChatCompletionsFormat
from mistral_serving.protocols.openai.completions import CompletionsFormat
from mistral_serving.protocols.openai.requests import MAX_TOP_LOGPROBS
from mistral_serving.settings import Settings
from mistral_serving.structured.constraint import GuidedDecoding
from mistral_serving.text.chat import ChatMessage, encode_chat
from mistral_serving.text.tokenizer import Tokenizer
from tests.doubles.generations import scripted
from tests.doubles.scripted_engine import ScriptedEngine

LIMITS = EngineLimits(max_input_len=48, max_seq_len=96, max_batch_size=4)
CTX = ParseContext(default_max_tokens=2048)
MODEL = "mistral-7b-instruct"
USER = [{"role": "user", "content": "Hi there"}]

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


def token_bytes_of(tok: Tokenizer):
    def token_bytes(token_id: int) -> bytes:
        return tok.table.token_bytes[token_id] or b""

    return token_bytes


@pytest.fixture(scope="module")
def chat_fmt(tok: Tokenizer) -> ChatCompletionsFormat:
    return ChatCompletionsFormat(MODEL, token_bytes_of(tok))


@pytest.fixture(scope="module")
def comp_fmt(tok: Tokenizer) -> CompletionsFormat:
    return CompletionsFormat(MODEL, token_bytes_of(tok))


@pytest.fixture
def service(tok: Tokenizer) -> GenerationService:
    return GenerationService(
        Settings(), tok, ScriptedEngine(limits=LIMITS), metrics=Metrics(CollectorRegistry())
    )


def chat(fmt: OpenAIRoute[Any], body: dict[str, Any]) -> OpenAICall:
    return fmt.parse({"messages": USER} | body, CTX)


def refusal(fmt: OpenAIRoute[Any], body: dict[str, Any]) -> RequestError:
    with pytest.raises(RequestError) as err:
        fmt.parse(body, CTX)
    assert err.value.status == 400
    return err.value


def prepare(service: GenerationService, call: OpenAICall) -> PreparedRequest:
    return asyncio.run(service.prepare(call.gen))


# ---- refusals ----


@pytest.mark.parametrize(
    ("chat_route", "body", "param"),
    [
        (True, {"messages": USER, "tools": []}, "tools"),
        (True, {"messages": USER, "tool_choice": "auto"}, "tool_choice"),
        (True, {"messages": USER, "logit_bias": {"1": 5}}, "logit_bias"),
        (True, {"messages": USER, "n": 2}, "n"),
        (True, {"messages": USER, "top_p": 0}, "top_p"),
        (True, {"messages": USER, "top_logprobs": 21, "logprobs": True}, "top_logprobs"),
        (True, {"messages": USER, "logprobs": 3}, "logprobs"),  # chat: a boolean
        (True, {"messages": USER, "max_tokens": "5"}, "max_tokens"),  # "5" is no int
        (True, {"messages": USER, "temperature": True}, "temperature"),  # true no number
        (True, {"messages": USER, "stream": "true"}, "stream"),
        (True, {"messages": USER, "response_format": {"type": "xml"}}, "response_format"),
        (True, {"messages": USER, "response_format": {"type": "json_schema"}}, "response_format"),
        (True, {"messages": USER, "min_tokens": -1}, "min_tokens"),
        (True, {"messages": USER, "ignore_eos": 1}, "ignore_eos"),
        (True, {"messages": USER, "prompt": "x"}, "prompt"),
        (False, {"prompt": "x", "echo": True, "stream": True}, "echo"),
        (False, {"prompt": "x", "max_tokens": 0}, "max_tokens"),  # 0: only with echo
        (False, {"prompt": "x", "logprobs": 21}, "logprobs"),
        (False, {"prompt": "x", "logprobs": True}, "logprobs"),  # completions: a count
        (False, {"prompt": "x", "best_of": 2}, "best_of"),
        (False, {"prompt": "x", "suffix": "y"}, "suffix"),
        (False, {"prompt": "x", "n": 3}, "n"),
        (True, {"messages": USER, "n": True}, "n"),  # true == 1 in Python: still refused
        (False, {"prompt": "x", "n": 1.0}, "n"),
        (False, {"prompt": "x", "best_of": True}, "best_of"),
        (False, {"prompt": "x", "logit_bias": {}}, "logit_bias"),
        (False, {"prompt": "x", "messages": USER}, "messages"),
    ],
)
def test_unsupported_or_bad_fields_are_refused_by_name(
    chat_fmt: ChatCompletionsFormat,
    comp_fmt: CompletionsFormat,
    chat_route: bool,
    body: dict,
    param: str,
) -> None:
    err = refusal(chat_fmt if chat_route else comp_fmt, body)
    assert err.param is not None and err.param.split(".")[0] == param
    assert param in err.message


@pytest.mark.parametrize(("field", "value"), [("best_of", 3), ("suffix", "s")])
def test_fields_with_only_a_default_say_unsupported(
    comp_fmt: CompletionsFormat, field: str, value: object
) -> None:
    err = refusal(comp_fmt, {"prompt": "x", field: value})
    assert err.message.startswith(f"unsupported field: {field}")


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"stream_options": {"include_usage": True}}, "stream_options"),
        ({"top_logprobs": 2}, "top_logprobs"),
    ],
)
def test_fields_that_need_another_are_refused(
    chat_fmt: ChatCompletionsFormat, body: dict, needle: str
) -> None:
    err = refusal(chat_fmt, {"messages": USER} | body)
    assert needle in err.message


def test_stream_options_allowed_with_stream(chat_fmt: ChatCompletionsFormat) -> None:
    call = chat(chat_fmt, {"stream": True, "stream_options": {"include_usage": True}})
    assert (call.stream, call.include_usage) == (True, True)
    call = chat(chat_fmt, {"stream": True})
    assert (call.stream, call.include_usage) == (True, False)


def test_missing_or_empty_messages_are_refused(chat_fmt: ChatCompletionsFormat) -> None:
    for body in ({}, {"messages": []}):
        assert refusal(chat_fmt, body).param == "messages"


def test_non_text_content_part_is_refused(chat_fmt: ChatCompletionsFormat) -> None:
    part = {"type": "image_url", "image_url": {"url": "http://x"}}
    err = refusal(chat_fmt, {"messages": [{"role": "user", "content": [part]}]})
    assert err.param is not None and err.param.startswith("messages.0.content")


# ---- chat: prompts and options ----


def test_developer_role_is_a_system_message(
    chat_fmt: ChatCompletionsFormat, service: GenerationService, tok: Tokenizer
) -> None:
    # After the user turn, so that as a user message it would be merged into that turn
    # ("Hi there\n\nBe terse.") instead of leading it as the system prompt.
    call = chat_fmt.parse({"messages": [*USER, {"role": "developer", "content": "Be terse."}]}, CTX)
    assert call.gen.messages == (
        ChatMessage(role="user", content="Hi there"),
        ChatMessage(role="system", content="Be terse."),
    )
    ids = prepare(service, call).prompt_ids
    assert ids == encode_chat(list(call.gen.messages), tok)
    as_user = [
        ChatMessage(role="user", content="Hi there"),
        ChatMessage(role="user", content="Be terse."),
    ]
    assert ids != encode_chat(as_user, tok)


def test_content_as_text_parts(chat_fmt: ChatCompletionsFormat) -> None:
    parts = [{"type": "text", "text": "first"}, {"type": "text", "text": "second"}]
    call = chat_fmt.parse({"messages": [{"role": "user", "content": parts, "name": "n"}]}, CTX)
    assert call.gen.messages == (ChatMessage(role="user", content="first\n\nsecond"),)


def test_chat_defaults(chat_fmt: ChatCompletionsFormat, service: GenerationService) -> None:
    call = chat(chat_fmt, {})
    s = call.gen.sampling
    assert isinstance(call, ChatCall) and call.stream is False and call.include_usage is False
    assert s.max_new_tokens == CTX.default_max_tokens  # clamped later, by the service
    assert (s.temperature, s.top_p, s.top_k, s.logprobs, s.guided) == (1.0, 1.0, 0, None, None)
    assert (s.ignore_eos, s.min_tokens) == (False, 0)
    assert call.gen.stop == () and call.gen.interval == 1
    assert call.gen.param == "messages"
    req = prepare(service, call)
    assert req.sampling.max_new_tokens == LIMITS.max_seq_len - len(req.prompt_ids)


def test_max_completion_tokens_preferred_over_max_tokens(chat_fmt: ChatCompletionsFormat) -> None:
    def wanted(body: dict) -> int:
        return chat(chat_fmt, body).gen.sampling.max_new_tokens

    assert wanted({"max_tokens": 5, "max_completion_tokens": 7}) == 7
    assert wanted({"max_tokens": 5}) == 5
    assert wanted({"max_completion_tokens": 9}) == 9


def test_options_map_to_sampling(chat_fmt: ChatCompletionsFormat) -> None:
    call = chat(
        chat_fmt,
        {
            "temperature": 0,
            "top_p": 0.9,
            "seed": 3,
            "stop": "###",
            "top_k": 5,
            "presence_penalty": 1.0,
            "frequency_penalty": 0.5,
            "repetition_penalty": 1.2,
            "ignore_eos": True,
            "min_tokens": 4,
            "user": "u",
            "model": "anything",
            "n": 1,
        },
    )
    s = call.gen.sampling
    assert (s.temperature, s.top_p, s.seed, s.top_k) == (0.0, 0.9, 3, 5)
    assert (s.presence_penalty, s.frequency_penalty, s.repetition_penalty) == (1.0, 0.5, 1.2)
    assert (s.ignore_eos, s.min_tokens) == (True, 4)
    assert call.gen.stop == ("###",)


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({}, None),
        ({"logprobs": False}, None),
        ({"logprobs": True}, 0),
        ({"logprobs": True, "top_logprobs": 0}, 0),
        ({"logprobs": True, "top_logprobs": MAX_TOP_LOGPROBS}, MAX_TOP_LOGPROBS),
    ],
)
def test_chat_logprobs_options(
    chat_fmt: ChatCompletionsFormat, body: dict, expected: int | None
) -> None:
    assert chat(chat_fmt, body).gen.sampling.logprobs == expected


@pytest.mark.parametrize(
    ("response_format", "guided"),
    [
        ({"type": "text"}, None),
        ({"type": "json_object"}, GuidedDecoding("json_object")),
        (
            {
                "type": "json_schema",
                "json_schema": {
                    "name": "answer",
                    "schema": {"type": "object", "properties": {"a": {"type": "integer"}}},
                    "strict": True,
                },
            },
            GuidedDecoding(
                "json_schema", '{"type": "object", "properties": {"a": {"type": "integer"}}}'
            ),
        ),
        (
            {"type": "json_schema", "json_schema": {"name": "any"}},
            GuidedDecoding("json_schema", "{}"),
        ),
    ],
)
def test_response_format_becomes_guided_decoding(
    chat_fmt: ChatCompletionsFormat,
    comp_fmt: CompletionsFormat,
    response_format: dict,
    guided: object,
) -> None:
    assert chat(chat_fmt, {"response_format": response_format}).gen.sampling.guided == guided
    call = comp_fmt.parse({"prompt": "x", "response_format": response_format}, CTX)
    assert call.gen.sampling.guided == guided


@pytest.mark.parametrize(
    "response_format",
    [
        {"type": "json_object", "json_schema": {"name": "a"}},  # a schema only with json_schema
        {"type": "json_schema", "json_schema": {"schema": {}}},  # name is required
        {"type": "json_schema", "json_schema": {"name": "a", "schema": "{}"}},
        {"type": "json_schema", "json_schema": {"name": "a", "extra": 1}},
        {"type": "json_object", "other": 1},
        "json_object",
    ],
)
def test_bad_response_format_is_refused(
    chat_fmt: ChatCompletionsFormat, response_format: object
) -> None:
    err = refusal(chat_fmt, {"messages": USER, "response_format": response_format})
    assert err.param is not None and err.param.startswith("response_format")


def test_chat_prompt_over_the_limit_names_messages(
    chat_fmt: ChatCompletionsFormat, service: GenerationService
) -> None:
    """The error's `param` must name a field of the request: a chat request has no
    `prompt`, its prompt is `messages` (OpenAI answers param "messages" here too)."""
    call = chat_fmt.parse({"messages": [{"role": "user", "content": " ".join(["word"] * 60)}]}, CTX)
    with pytest.raises(RequestError, match="input tokens") as err:
        prepare(service, call)
    assert err.value.param == "messages"


# ---- completions: prompts ----


def test_completion_prompt_over_the_limit_names_prompt(
    comp_fmt: CompletionsFormat, service: GenerationService
) -> None:
    call = comp_fmt.parse({"prompt": " ".join(["word"] * 60)}, CTX)
    with pytest.raises(RequestError) as err:
        prepare(service, call)
    assert err.value.param == "prompt"


def test_completions_default_max_tokens_is_16(
    comp_fmt: CompletionsFormat, service: GenerationService, tok: Tokenizer
) -> None:
    call = comp_fmt.parse({"prompt": "Once upon"}, CTX)
    assert call.gen.sampling.max_new_tokens == 16
    assert not isinstance(call, ChatCall) and call.gen.param == "prompt"
    assert prepare(service, call).prompt_ids == tok.encode("Once upon", bos=True)


def test_completions_logprobs_is_a_count(comp_fmt: CompletionsFormat) -> None:
    assert comp_fmt.parse({"prompt": "x"}, CTX).gen.sampling.logprobs is None
    assert comp_fmt.parse({"prompt": "x", "logprobs": 0}, CTX).gen.sampling.logprobs == 0
    assert comp_fmt.parse({"prompt": "x", "logprobs": 5}, CTX).gen.sampling.logprobs == 5


def test_completions_prompt_forms(
    comp_fmt: CompletionsFormat, service: GenerationService, tok: Tokenizer
) -> None:
    one = comp_fmt.parse({"prompt": ["Once upon"]}, CTX)
    assert prepare(service, one).prompt_ids == tok.encode("Once upon", bos=True)
    ids = tok.encode("Once upon")
    as_ids = comp_fmt.parse({"prompt": ids}, CTX)
    assert as_ids.gen.prompt_ids == tuple(ids)
    assert prepare(service, as_ids).prompt_ids == ids  # used as given: no BOS added


@pytest.mark.parametrize("prompt", [["a", "b"], [], [[1, 2], [3]], [[]], [1, "a"], [True]])
def test_completions_batches_and_mixtures_are_refused(
    comp_fmt: CompletionsFormat, prompt: list
) -> None:
    err = refusal(comp_fmt, {"prompt": prompt})
    assert err.param is not None and err.param.startswith("prompt")


@pytest.mark.parametrize("bad", [-1, 32000, 10**6])
def test_token_id_prompt_is_checked_against_the_vocab(
    comp_fmt: CompletionsFormat, service: GenerationService, bad: int
) -> None:
    call = comp_fmt.parse({"prompt": [1, 100, bad]}, CTX)
    with pytest.raises(RequestError) as err:
        prepare(service, call)
    assert err.value.param == "prompt"
    assert "32000" in err.value.message


def test_token_id_prompt_at_the_vocab_edge_is_accepted(
    comp_fmt: CompletionsFormat, service: GenerationService
) -> None:
    call = comp_fmt.parse({"prompt": [0, 31999]}, CTX)
    assert prepare(service, call).prompt_ids == [0, 31999]


# ---- answers ----


def finished_record(
    output: str,
    reason: str,
    prompt_tokens: int = 4,
    completion_tokens: int = 3,
    logprobs: list[TokenLogprob] | None = None,
) -> Outcome:
    """How a request ended (answers are built from this; the answer id is "abc")."""
    lps = tuple(logprobs) if logprobs is not None else None
    return Outcome(reason, output, prompt_tokens, completion_tokens, lps)


def test_chat_response_body(chat_fmt: ChatCompletionsFormat) -> None:
    call = chat(chat_fmt, {})
    body = chat_fmt.response_body(call, finished_record("Hello!", "stop"), "abc")
    assert body == {
        "id": "chatcmpl-abc",
        "object": "chat.completion",
        "created": call.created,
        "model": MODEL,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Hello!"},
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7},
    }


def test_completion_response_body(comp_fmt: CompletionsFormat) -> None:
    call = comp_fmt.parse({"prompt": "x"}, CTX)
    body = comp_fmt.response_body(call, finished_record("yz", "length"), "abc")
    assert body["id"] == "cmpl-abc" and body["object"] == "text_completion"
    assert body["model"] == MODEL and body["created"] == call.created
    assert body["choices"] == [
        {"index": 0, "text": "yz", "logprobs": None, "finish_reason": "length"}
    ]


def logprobs_for(tok: Tokenizer, text: str) -> tuple[list[int], list[TokenLogprob]]:
    ids = tok.encode(text)
    (alt,) = tok.encode("the")  # " the" (SentencePiece adds the space)
    return ids, [
        TokenLogprob(t, -0.25 * (i + 1), ((t, -0.25 * (i + 1)), (alt, -2.5)))
        for i, t in enumerate(ids)
    ]


def test_chat_logprobs_in_openais_shape(chat_fmt: ChatCompletionsFormat, tok: Tokenizer) -> None:
    ids, lps = logprobs_for(tok, "Hello world")  # " Hello", " world"
    call = chat(chat_fmt, {"logprobs": True, "top_logprobs": 1})
    body = chat_fmt.response_body(call, finished_record("Hello world", "stop", logprobs=lps), "abc")
    logprobs = body["choices"][0]["logprobs"]
    assert logprobs == {
        "content": [
            {
                "token": " Hello",
                "logprob": -0.25,
                "bytes": list(b" Hello"),
                "top_logprobs": [
                    {"token": " Hello", "logprob": -0.25, "bytes": list(b" Hello")},
                    {"token": " the", "logprob": -2.5, "bytes": list(b" the")},
                ],
            },
            {
                "token": " world",
                "logprob": -0.5,
                "bytes": list(b" world"),
                "top_logprobs": [
                    {"token": " world", "logprob": -0.5, "bytes": list(b" world")},
                    {"token": " the", "logprob": -2.5, "bytes": list(b" the")},
                ],
            },
        ],
        "refusal": None,
    }
    # OpenAI's key order, so that the JSON reads as theirs.
    assert list(body["choices"][0]) == ["index", "message", "logprobs", "finish_reason"]
    assert list(logprobs["content"][0]) == ["token", "logprob", "bytes", "top_logprobs"]


def test_chat_logprobs_of_byte_tokens_carry_their_bytes(
    chat_fmt: ChatCompletionsFormat, tok: Tokenizer
) -> None:
    ids = tok.encode("🫠")
    byte_ids = [t for t in ids if tok.table.is_byte_token[t]]
    assert len(byte_ids) == 4
    call = chat(chat_fmt, {"logprobs": True})
    lps = [TokenLogprob(t, -1.0) for t in byte_ids]
    content = chat_fmt.response_body(call, finished_record("🫠", "stop", logprobs=lps), "abc")[
        "choices"
    ][0]["logprobs"]["content"]
    assert b"".join(bytes(e["bytes"]) for e in content) == "🫠".encode()
    assert all(e["top_logprobs"] == [] for e in content)
    json.dumps(content)  # every token string is valid JSON text (no lone surrogates)


def test_completion_logprobs_in_openais_shape(comp_fmt: CompletionsFormat, tok: Tokenizer) -> None:
    ids, lps = logprobs_for(tok, "Hello world")
    call = comp_fmt.parse({"prompt": "x", "logprobs": 1}, CTX)
    body = comp_fmt.response_body(
        call, finished_record(" Hello world", "length", logprobs=lps), "abc"
    )
    assert body["choices"][0]["logprobs"] == {
        "tokens": [" Hello", " world"],
        "token_logprobs": [-0.25, -0.5],
        "top_logprobs": [{" Hello": -0.25, " the": -2.5}, {" world": -0.5, " the": -2.5}],
        "text_offset": [0, 6],
    }


# ---- streams ----


def run_sse(
    fmt: OpenAIRoute[Any],
    call: OpenAICall,
    parts: list[str] | list[Chunk],
    outcome: Outcome,
    error: RequestError | None = None,
) -> list[str]:
    """The events of a stream of `parts` that ends with `outcome` (or `error`)."""

    async def main() -> list[str]:
        generation = scripted(parts, outcome, error)
        return [e async for e in fmt.stream_events(call, generation, "abc")]

    return asyncio.run(main())


def decode(events: list[str]) -> list[dict]:
    assert events[-1] == "data: [DONE]\n\n"
    out = []
    for e in events[:-1]:
        assert e.startswith("data: ") and e.endswith("\n\n")
        data = json.loads(e[len("data: ") :])
        # Byte-identical to a plain rendering of the same event, with Unicode's own line
        # breaks escaped: one line however a client splits lines.
        plain = json.dumps(data, ensure_ascii=False)
        assert e == f"data: {plain.translate(LINE_BREAKS)}\n\n"
        assert e[: -len("\n\n")].splitlines() == [e[: -len("\n\n")]]
        out.append(data)
    return out


LINE_BREAKS = {0x85: "\\u0085", 0x2028: "\\u2028", 0x2029: "\\u2029"}

TRICKY = [
    'He said "hi"\n',
    "\\ back\tslash",
    "café 😀 東京",
    "\x00text\x00 </s>",
    "",
    "line\u2028sep\u2029para\x85nel",
]


@pytest.mark.parametrize("include_usage", [False, True])
def test_chat_sse_sequence(chat_fmt: ChatCompletionsFormat, include_usage: bool) -> None:
    body = {"stream": True} | ({"stream_options": {"include_usage": True}} if include_usage else {})
    call = chat(chat_fmt, body)
    outcome = finished_record("", "stop")
    events = decode(run_sse(chat_fmt, call, TRICKY, outcome))
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
    assert all(d["choices"][0]["logprobs"] is None for d in deltas)
    assert finish["choices"] == [
        {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}
    ]
    if include_usage:
        assert all("usage" in e and e["usage"] is None for e in events[:-1])
        assert events[-1]["choices"] == []
        assert events[-1]["usage"] == outcome.usage
    else:
        assert all("usage" not in e for e in events)


def test_completion_sse_sequence(comp_fmt: CompletionsFormat) -> None:
    call = comp_fmt.parse({"prompt": "x", "stream": True}, CTX)
    outcome = finished_record("", "stop")
    events = decode(run_sse(comp_fmt, call, ["a", "b c"], outcome))
    assert all(e["object"] == "text_completion" and e["id"] == "cmpl-abc" for e in events)
    assert [e["choices"][0]["text"] for e in events] == ["a", "b c", ""]
    assert [e["choices"][0]["finish_reason"] for e in events] == [None, None, "stop"]
    assert all(
        list(e["choices"][0]) == ["index", "text", "logprobs", "finish_reason"] for e in events
    )


def test_a_cut_stream_says_abort_in_band(chat_fmt: ChatCompletionsFormat) -> None:
    call = chat(chat_fmt, {"stream": True})
    events = decode(run_sse(chat_fmt, call, [Chunk("par")], finished_record("par", "abort")))
    assert events[-1]["choices"][0]["finish_reason"] == "abort"


def test_chat_sse_with_logprobs(chat_fmt: ChatCompletionsFormat, tok: Tokenizer) -> None:
    ids, lps = logprobs_for(tok, "Hello world")
    call = chat(chat_fmt, {"stream": True, "logprobs": True, "top_logprobs": 1})
    outcome = finished_record("", "stop")
    parts = [Chunk(" Hello", lps[:1]), Chunk(" world", lps[1:])]
    events = decode(run_sse(chat_fmt, call, parts, outcome))
    _, first, second, finish = events
    assert first["choices"][0]["delta"] == {"content": " Hello"}
    whole = finished_record("", "stop", logprobs=lps)
    expected = chat_fmt.response_body(call, whole, "abc")["choices"][0]["logprobs"]
    assert first["choices"][0]["logprobs"] == {
        "content": expected["content"][:1],
        "refusal": None,
    }
    assert second["choices"][0]["logprobs"]["content"] == expected["content"][1:]
    assert finish["choices"][0]["logprobs"] is None


def test_completion_sse_logprob_offsets_run_on(comp_fmt: CompletionsFormat, tok: Tokenizer) -> None:
    ids, lps = logprobs_for(tok, "Hello world")
    call = comp_fmt.parse({"prompt": "x", "stream": True, "logprobs": 1}, CTX)
    outcome = finished_record("", "stop")
    parts = [Chunk(" Hello", lps[:1]), Chunk(" world", lps[1:])]
    first, second, _ = decode(run_sse(comp_fmt, call, parts, outcome))
    assert first["choices"][0]["logprobs"]["text_offset"] == [0]
    assert second["choices"][0]["logprobs"] == {
        "tokens": [" world"],
        "token_logprobs": [-0.5],
        "top_logprobs": [{" world": -0.5, " the": -2.5}],
        "text_offset": [6],
    }


def test_sse_error_mid_stream_ends_with_an_error_event(chat_fmt: ChatCompletionsFormat) -> None:
    call = chat(chat_fmt, {"stream": True})
    outcome = finished_record("", "invalid")
    error = RequestError("bad token", param="prompt")
    events = decode(run_sse(chat_fmt, call, ["partial"], outcome, error))
    assert events[-1] == {
        "error": {
            "message": "bad token",
            "type": "invalid_request_error",
            "param": "prompt",
            "code": None,
        }
    }
    assert all(e.get("choices", [{}])[0].get("finish_reason") is None for e in events[:-1])


@settings(max_examples=100, deadline=None)
@given(parts=st.lists(st.text(), max_size=6), chat_route=st.booleans())
def test_any_text_streams_back_exactly(
    chat_fmt: ChatCompletionsFormat, comp_fmt: CompletionsFormat, parts: list[str], chat_route: bool
) -> None:
    fmt = chat_fmt if chat_route else comp_fmt
    body = {"messages": USER} if chat_route else {"prompt": "x"}
    call = fmt.parse(body | {"stream": True}, CTX)
    events = decode(run_sse(fmt, call, parts, finished_record("", "stop")))
    content = events[1:-1] if chat_route else events[:-1]
    key = "delta" if chat_route else None
    got = [e["choices"][0][key]["content"] if key else e["choices"][0]["text"] for e in content]
    assert got == parts


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, "invalid_request_error"),
        (404, "not_found_error"),
        (408, "invalid_request_error"),
        (413, "invalid_request_error"),
        (429, "rate_limit_error"),
        (503, "service_unavailable"),
        (500, "server_error"),
    ],
)
def test_error_body_shape(chat_fmt: ChatCompletionsFormat, status: int, kind: str) -> None:
    err = RequestError("nope", status=status, param="messages", code="x")
    assert chat_fmt.error_body(err) == {
        "error": {"message": "nope", "type": kind, "param": "messages", "code": "x"}
    }


# ---- any body ----


CHAT_FIELDS = [
    "messages",
    "model",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "stop",
    "seed",
    "stream",
    "stream_options",
    "n",
    "logprobs",
    "top_logprobs",
    "response_format",
    "top_k",
    "repetition_penalty",
    "ignore_eos",
    "min_tokens",
    "presence_penalty",
    "user",
]
COMPLETION_FIELDS = [f for f in CHAT_FIELDS if f not in ("messages", "max_completion_tokens")]
COMPLETION_FIELDS += ["prompt", "echo", "best_of", "suffix"]
VALID_CHAT = {
    "messages": [
        {"role": "system", "content": "s"},
        {"role": "user", "content": [{"type": "text", "text": "u"}]},
    ],
    "max_tokens": 8,
    "temperature": 0.3,
    "stream": True,
    "stream_options": {"include_usage": True},
    "logprobs": True,
    "top_logprobs": 2,
    "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {}}},
    "stop": ["x"],
}
# lm-evaluation-harness's loglikelihood request (a batch of one token-id prompt, echo).
VALID_COMPLETION = {
    "prompt": [[1, 2, 3]],
    "max_tokens": 1,
    "logprobs": 2,
    "echo": True,
    "temperature": 0,
    "stream": False,
    "seed": 4,
}


def check_outcome(fmt: OpenAIRoute[Any], body: dict[str, Any]) -> None:
    try:
        call = fmt.parse(body, CTX)
    except RequestError as err:
        assert err.status == 400 and err.message
        named = set(body) | {
            "messages" if isinstance(fmt, ChatCompletionsFormat) else "prompt"
        }  # required ones too
        assert err.param is None or err.param in named or err.param.split(".")[0] in named, (
            err.param
        )
        json.dumps(fmt.error_body(err))
    else:
        s = call.gen.sampling
        echo = call.gen.echo  # completions' only
        # 0 new tokens: only echo (a prefill scoring the prompt).
        assert s.max_new_tokens >= 1 or (echo and s.max_new_tokens == 0)
        assert 0 < s.top_p <= 1 and 0 <= s.temperature <= 2
        assert s.prompt_logprobs == (s.logprobs if echo else None)
        assert s.logprobs is None or 0 <= s.logprobs <= MAX_TOP_LOGPROBS
        if isinstance(call, ChatCall):
            assert call.gen.messages and call.gen.prompt is None and call.gen.prompt_ids is None
        else:
            assert (call.gen.prompt is None) != (call.gen.prompt_ids is None)
        if s.guided is not None and s.guided.json_schema is not None:
            assert isinstance(json.loads(s.guided.json_schema), dict)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), chat_route=st.booleans())
def test_any_json_body_parses_or_is_refused(
    chat_fmt: ChatCompletionsFormat,
    comp_fmt: CompletionsFormat,
    data: st.DataObject,
    chat_route: bool,
) -> None:
    names = CHAT_FIELDS if chat_route else COMPLETION_FIELDS
    body = data.draw(st.dictionaries(st.sampled_from(names) | st.text(max_size=5), JSON))
    check_outcome(chat_fmt if chat_route else comp_fmt, body)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), chat_route=st.booleans())
def test_mutated_valid_bodies_parse_or_are_refused(
    chat_fmt: ChatCompletionsFormat,
    comp_fmt: CompletionsFormat,
    data: st.DataObject,
    chat_route: bool,
) -> None:
    valid = VALID_CHAT if chat_route else VALID_COMPLETION
    names = CHAT_FIELDS if chat_route else COMPLETION_FIELDS
    fmt = chat_fmt if chat_route else comp_fmt
    check_outcome(fmt, valid)  # the seed itself parses
    fmt.parse(valid, CTX)
    drop = data.draw(st.sets(st.sampled_from(sorted(valid))))
    change = data.draw(st.dictionaries(st.sampled_from(names), JSON, max_size=2))
    # A value one level down replaced too (a message's role, the schema's name, ...).
    body = {k: v for k, v in valid.items() if k not in drop} | change
    nested = [k for k, v in body.items() if isinstance(v, dict) and v]
    if nested:
        key = data.draw(st.sampled_from(nested))
        inner = data.draw(st.sampled_from(sorted(body[key])))
        body[key] = body[key] | {inner: data.draw(JSON)}
    check_outcome(fmt, body)


def is_token_ids(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(type(t) is int for t in value)


PROMPT_ITEM = (
    st.integers(-5, 40000)
    | st.booleans()
    | st.text(max_size=4)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.none()
    | st.lists(st.integers(-5, 40000) | st.booleans() | st.text(max_size=2), max_size=3)
)


@settings(max_examples=300, deadline=None)
@given(prompt=st.lists(PROMPT_ITEM, max_size=5) | st.text(max_size=6) | JSON)
def test_a_prompt_is_taken_exactly_in_its_supported_forms(
    comp_fmt: CompletionsFormat, prompt: Any
) -> None:
    """The prompt's form is picked from its first element (a plain union checked a long
    token-id list against every form); whatever the mixture, the outcome is what the
    four forms allow: a string, token ids, or a batch of one of either."""
    if isinstance(prompt, str):
        expected: tuple[str | None, tuple[int, ...] | None] | None = (prompt, None)
    elif is_token_ids(prompt):
        expected = (None, tuple(prompt))
    elif isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        expected = (prompt[0], None)
    elif isinstance(prompt, list) and len(prompt) == 1 and is_token_ids(prompt[0]):
        expected = (None, tuple(prompt[0]))
    else:
        expected = None
    try:
        call = comp_fmt.parse({"prompt": prompt}, CTX)
    except RequestError as err:
        assert expected is None, (prompt, err.message)
        assert err.status == 400 and err.param is not None and err.param.startswith("prompt")
    else:
        assert (call.gen.prompt, call.gen.prompt_ids) == expected


@pytest.mark.parametrize(
    ("prompt", "param"),
    [
        ([1, "a"], "prompt.ids.1"),
        (["a", 1], "prompt.texts.1"),
        ([[1], [2, "x"]], "prompt.batch.1.1"),
    ],
)
def test_a_mixed_prompt_names_its_first_odd_element(
    comp_fmt: CompletionsFormat, prompt: list, param: str
) -> None:
    """Checked as the form its first element says, so the refusal is one line about the
    element that does not fit, not one per form tried."""
    err = refusal(comp_fmt, {"prompt": prompt})
    assert err.param == param and ";" not in err.message
