"""The OpenAI answers are built from the typed structs of `protocols/openai/types.py`:
every whole answer, stream event and error body the format sends converts strictly to its
type and back to the same JSON; the stream's spliced fast path is byte-identical to
rendering each chunk from its struct; and the types refuse what is not their shape."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mistral_serving.engines.base import TokenLogprob
from mistral_serving.errors import RequestError
from mistral_serving.generation.outcome import Outcome
from mistral_serving.generation.service import Chunk
from mistral_serving.protocols import ParseContext
from mistral_serving.protocols.openai.base import OpenAICall, OpenAIRoute, sse
from mistral_serving.protocols.openai.types import (
    OPENAI_ERROR_TYPES,
    ChatCompletion,
    ChatCompletionChunk,
    Completion,
    CompletionChunk,
    Delta,
    ErrorResponse,
    ModelCard,
    ModelList,
    Usage,
    openai_error_body,
)
from mistral_serving.text.tokenizer import Tokenizer
from tests.doubles.generations import openai_format, scripted

CTX = ParseContext(default_max_tokens=64)
USER = [{"role": "user", "content": "Hi"}]


def strictly(wire: dict[str, Any], kind: type) -> Any:
    """`wire` as `kind`, refusing unknown keys anywhere (msgspec's own check is opt-in:
    round-tripping catches a key the type does not declare)."""
    value = msgspec.convert(wire, kind)
    assert msgspec.to_builtins(value) == wire, "a key the type does not declare"
    return value


def fmt_for(tok: Tokenizer, chat: bool) -> OpenAIRoute[Any]:
    return openai_format(chat, "m", lambda t: tok.table.token_bytes[t] or b"")


def record(
    output: str = "Hello world", reason: str = "stop", logprobs: list[TokenLogprob] | None = None
) -> Outcome:
    return Outcome(reason, output, 5, 2, tuple(logprobs) if logprobs is not None else None)


def lps(tok: Tokenizer, text: str) -> list[TokenLogprob]:
    (alt,) = tok.encode("the")
    return [TokenLogprob(t, -0.5, ((t, -0.5), (alt, -1e-05))) for t in tok.encode(text)]


def events(fmt: OpenAIRoute[Any], call: OpenAICall, parts: list[Chunk]) -> list[dict[str, Any]]:
    async def main() -> list[str]:
        return [e async for e in fmt.stream_events(call, scripted(parts, record("")), "e")]

    out = asyncio.run(main())
    assert out[-1] == "data: [DONE]\n\n"
    return [json.loads(e.removeprefix("data: ")) for e in out[:-1]]


CHAT_BODIES = [{}, {"logprobs": True, "top_logprobs": 2}]
COMPLETION_BODIES = [{}, {"logprobs": 2}, {"echo": True, "logprobs": 1}, {"echo": True}]


@pytest.mark.parametrize("body", CHAT_BODIES)
def test_chat_answers_are_chat_completions(tok: Tokenizer, body: dict[str, Any]) -> None:
    fmt = fmt_for(tok, True)
    call = fmt.parse({"messages": USER} | body, CTX)
    wire = fmt.response_body(call, record(logprobs=lps(tok, "Hello world") if body else None), "e")
    answer = strictly(wire, ChatCompletion)
    assert answer.choices[0].message.content == "Hello world"


@pytest.mark.parametrize("body", COMPLETION_BODIES)
def test_completion_answers_are_completions(tok: Tokenizer, body: dict[str, Any]) -> None:
    fmt = fmt_for(tok, False)
    call = fmt.parse({"prompt": "Hi"} | body, CTX)
    logprobs = lps(tok, "Hi Hello world") if "logprobs" in body else None
    if logprobs and call.gen.echo:
        logprobs[0] = TokenLogprob(logprobs[0].token_id, None)  # the prompt's first: null
    strictly(fmt.response_body(call, record(logprobs=logprobs), "e"), Completion)


@pytest.mark.parametrize("chat", [True, False])
@pytest.mark.parametrize(
    "usage",
    [None, {"include_usage": True}, {"include_usage": True, "continuous_usage_stats": True}],
)
@pytest.mark.parametrize("with_logprobs", [False, True])
def test_every_stream_event_is_a_chunk(
    tok: Tokenizer, chat: bool, usage: dict[str, bool] | None, with_logprobs: bool
) -> None:
    fmt = fmt_for(tok, chat)
    body: dict[str, Any] = {"messages": USER} if chat else {"prompt": "Hi"}
    body |= {"stream": True} | ({"stream_options": usage} if usage else {})
    call = fmt.parse(body, CTX)
    parts = [Chunk(t, lps(tok, t) if with_logprobs else None) for t in (" Hello", " world")]
    seen = events(fmt, call, parts)
    kind = ChatCompletionChunk if chat else CompletionChunk
    for event in seen:
        strictly(event, kind)
        assert ("usage" in event) == (usage is not None)
    assert len(seen) == len(parts) + 1 + chat + (usage is not None)


@given(
    text=st.text(max_size=40),
    chat=st.booleans(),
    include_usage=st.booleans(),
    logprobs=st.lists(st.tuples(st.integers(0, 9), st.floats(max_value=0)), max_size=3) | st.none(),
)
@settings(max_examples=200, deadline=None)
def test_the_spliced_stream_chunk_is_the_struct_rendered(
    text: str, chat: bool, include_usage: bool, logprobs: list[tuple[int, float]] | None
) -> None:
    """The stream splices text (and logprobs) into one pre-rendered chunk: it must send
    exactly what rendering that chunk's struct sends."""
    fmt = openai_format(chat, "m", lambda t: bytes([65 + t]))
    body: dict[str, Any] = {"messages": USER} if chat else {"prompt": "Hi"}
    body |= {"stream": True}
    if include_usage:
        body["stream_options"] = {"include_usage": True}
    call = fmt.parse(body, CTX)
    lps = None if logprobs is None else [TokenLogprob(t, v, ((t, v),)) for t, v in logprobs]
    two = [Chunk("ab", lps), Chunk(text, lps)]

    async def main() -> list[str]:
        return [e async for e in fmt.stream_events(call, scripted(two, record("")), "e")]

    sent = asyncio.run(main())[2 if chat else 1]
    usage = None if include_usage else msgspec.UNSET
    rid = "chatcmpl-e" if chat else "cmpl-e"
    expected = fmt.chunk(call, rid, text, None, lps, 2, usage=usage)  # offset: after "ab"
    assert sent == sse(expected.wire())


@pytest.mark.parametrize("status", sorted(OPENAI_ERROR_TYPES) + [418])
def test_error_bodies_are_error_responses(status: int) -> None:
    err = RequestError("no", status, param="p", code="c")
    answer = strictly(openai_error_body(err), ErrorResponse)
    assert answer.error.type == OPENAI_ERROR_TYPES.get(status, "server_error")


def test_unset_fields_are_absent_and_null_ones_are_null() -> None:
    assert Delta().wire() == {}
    assert Delta(role="assistant", content="").wire() == {"role": "assistant", "content": ""}
    bare = CompletionChunk(id="i", created=0, model="m", choices=[])
    assert "usage" not in bare.wire()
    assert (
        CompletionChunk(id="i", created=0, model="m", choices=[], usage=None).wire()["usage"]
        is None
    )
    card = ModelCard(id="m", created=1, owned_by="o", max_model_len=8)
    assert ModelList(data=[card]).wire() == {
        "object": "list",
        "data": [{"id": "m", "object": "model", "created": 1, "owned_by": "o", "max_model_len": 8}],
    }


def test_floats_keep_pythons_spelling_on_the_wire() -> None:
    """`wire()` leaves rendering to `json.dumps`: 1e-05 stays `1e-05`, as before the
    structs (msgspec's own encoder would send `0.00001`)."""
    fmt = openai_format(False, "m", lambda t: b"x")
    tiny = fmt.completion_logprobs([TokenLogprob(1, -1e-05, ((1, -1e-05),))], 0)
    assert tiny is not None
    assert '"token_logprobs": [-1e-05]' in json.dumps(tiny.wire())
    assert b"-1e-05" not in msgspec.json.encode(tiny)


@pytest.mark.parametrize(
    "wire, kind",
    [
        ({"error": {"message": "m", "type": "t", "param": None}}, ErrorResponse),  # no code
        ({"prompt_tokens": 1, "completion_tokens": "2", "total_tokens": 3}, Usage),
        ({"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3, "x": 1}, Usage),
        ({"role": "user"}, Delta),
    ],
)
def test_the_types_refuse_what_is_not_their_shape(wire: dict[str, Any], kind: type) -> None:
    with pytest.raises((msgspec.ValidationError, AssertionError)):
        strictly(wire, kind)
