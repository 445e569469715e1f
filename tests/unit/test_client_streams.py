"""Incremental UTF-8 decoding and SSE parsing (httpx-sse under the client's streams), with
chunk boundaries everywhere."""

from __future__ import annotations

import json

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from client.client import StreamingText
from client.errors import StreamError
from client.protocol import build_request
from client.streams import OpenAIStreamParser, PredictStreamParser, Utf8Decoder

TEXT = "Hé 世界 🙂 👩‍💻 naïve Ça ñ — ok"


def splits(data: bytes) -> list[list[bytes]]:
    """Every way to cut data in two, plus one byte at a time."""
    cuts = [[data[:i], data[i:]] for i in range(len(data) + 1)]
    return cuts + [[data[i : i + 1] for i in range(len(data))]]


def test_utf8_decoder_every_split_point() -> None:
    data = TEXT.encode()
    for parts in splits(data):
        dec = Utf8Decoder()
        out = "".join(dec.feed(p) for p in parts) + dec.close()
        assert out == TEXT


def test_utf8_decoder_holds_back_partial_character() -> None:
    emoji = "🙂".encode()  # 4 bytes
    dec = Utf8Decoder()
    assert dec.feed(emoji[:1]) == ""
    assert dec.feed(emoji[1:3]) == ""
    assert dec.feed(emoji[3:] + "世".encode()[:2]) == "🙂"
    assert dec.feed("世".encode()[2:]) == "世"


def test_naive_bytewise_decoding_would_fail() -> None:
    # The article's client decodes each byte on its own; this is what it hits.
    with pytest.raises(UnicodeDecodeError):
        "é".encode()[:1].decode("utf-8")


def test_truncated_character_is_an_error_at_close() -> None:
    parser = PredictStreamParser()
    assert parser.feed("a🙂".encode()[:3]) == ["a"]
    with pytest.raises(StreamError):
        parser.close()
    lenient = PredictStreamParser(errors="replace")
    lenient.feed("a🙂".encode()[:3])
    assert lenient.close() == ["\ufffd"]


@settings(max_examples=200, deadline=None)
@given(st.text(), st.lists(st.integers(min_value=0, max_value=400), max_size=10))
def test_predict_stream_any_chunking(text: str, cuts: list[int]) -> None:
    data = text.encode()
    bounds = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    parser = PredictStreamParser()
    pieces: list[str] = []
    for a, b in zip(bounds, bounds[1:], strict=False):
        pieces += parser.feed(data[a:b])
    pieces += parser.close()
    assert "".join(pieces) == text
    assert all(p for p in pieces)  # no empty pieces reach the user


def sse(*payloads: object, done: bool = True, eol: bytes = b"\n") -> bytes:
    out = b""
    for p in payloads:
        out += b"data: " + json.dumps(p, ensure_ascii=False).encode() + eol + eol
    if done:
        out += b"data: [DONE]" + eol + eol
    return out


def openai_stream(parts: list[bytes], chat: bool = False, **headers: str) -> StreamingText:
    """A client stream over an answer that arrives in exactly these network reads."""
    spec = build_request(
        "openai", messages=[{"role": "user", "content": "x"}] if chat else None,
        prompt=None if chat else "x", stream=True,
    )  # fmt: skip
    response = httpx.Response(
        200,
        headers={"content-type": "text/event-stream", **headers},
        content=iter(parts),
    )
    return StreamingText(response, spec, "strict")


def read_all(parts: list[bytes], chat: bool = False) -> tuple[list[str], StreamingText]:
    stream = openai_stream(parts, chat)
    return list(stream), stream


def test_sse_comments_multiline_data_and_line_ends() -> None:
    """Comment lines and other fields are skipped; CRLF, LF and bare CR all end lines."""
    for eol in (b"\n", b"\r\n", b"\r"):
        raw = (
            b": keep-alive" + eol + b"event: message" + eol + b"id: 7" + eol
            + b'data: {"choices": [{"index": 0,' + eol + b'data: "text": "a"}]}' + eol + eol
            + b'data:{"choices": [{"index": 0, "text": "b"}]}' + eol + eol
            + b"data: [DONE]" + eol + eol
        )  # fmt: skip
        for parts in splits(raw):
            pieces, _ = read_all(parts)
            assert pieces == ["a", "b"], (eol, parts)


def test_line_separators_inside_json_strings_do_not_split_lines() -> None:
    """U+2028, U+2029 and U+0085 may stand raw inside a JSON string; only CR/LF end SSE
    lines (str.splitlines, which httpx's aiter_lines uses, would cut the event)."""
    text = "a\u2028b\u2029c\u0085d\x1ce"
    raw = sse(completion_chunk(text), completion_chunk("!", "stop"))
    for parts in splits(raw):
        pieces, stream = read_all(parts)
        assert "".join(pieces) == text + "!"
        assert stream.finish_reason == "stop"


def test_not_an_event_stream_is_a_stream_error() -> None:
    stream = openai_stream([b'{"choices": []}'], **{"content-type": "application/json"})
    with pytest.raises(StreamError, match="not an event stream"):
        list(stream)


def completion_chunk(text: str, finish: str | None = None) -> dict:
    return {
        "object": "text_completion",
        "choices": [{"index": 0, "text": text, "finish_reason": finish}],
    }


def chat_chunk(delta: dict, finish: str | None = None) -> dict:
    return {
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


USAGE = {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}


@pytest.mark.parametrize("eol", [b"\n", b"\r\n"])
def test_openai_completions_stream_every_split(eol: bytes) -> None:
    raw = sse(
        completion_chunk("Hé"),
        completion_chunk(" 世界"),
        completion_chunk(" 🙂", "length"),
        {"choices": [], "usage": USAGE},
        eol=eol,
    )
    for parts in splits(raw):
        pieces, stream = read_all(parts)
        assert "".join(pieces) == "Hé 世界 🙂"
        assert stream.usage is not None and stream.usage.completion_tokens == 3
        assert stream.finish_reason == "length"
        assert stream.state.done


def test_openai_chat_stream_skips_role_only_chunk() -> None:
    raw = sse(
        chat_chunk({"role": "assistant"}),
        chat_chunk({"content": "a"}),
        chat_chunk({"content": "b"}, "stop"),
    )
    pieces, stream = read_all([raw], chat=True)
    assert pieces == ["a", "b"]
    assert stream.state.chunks == 2
    assert stream.usage is None


def test_openai_stream_without_done_is_an_error() -> None:
    stream = openai_stream([sse(completion_chunk("x"), done=False)])
    with pytest.raises(StreamError, match="DONE"):
        list(stream)
    assert stream.text == "x"  # what arrived before the end stays readable


def test_openai_stream_error_event_raises_with_message() -> None:
    raw = sse(
        completion_chunk("x"),
        {"error": {"message": "engine died", "type": "server_error", "param": None, "code": 500}},
    )
    with pytest.raises(StreamError) as info:
        list(openai_stream([raw]))
    assert info.value.message == "engine died"
    assert info.value.status == 500


def test_openai_stream_bad_json_is_an_error() -> None:
    with pytest.raises(StreamError, match="not JSON"):
        OpenAIStreamParser(chat=False).event("{oops")


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200))
def test_any_event_data_is_text_or_a_stream_error(data: str) -> None:
    """Whatever an event carries, the parser returns text pieces or raises StreamError."""
    parser = OpenAIStreamParser(chat=False)
    try:
        pieces = parser.event(data)
    except StreamError:
        return
    assert all(isinstance(p, str) and p for p in pieces)


@settings(max_examples=300, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=5),
        lambda inner: (
            st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
        ),
        max_leaves=10,
    ),
    st.booleans(),
)
def test_any_json_payload_is_text_or_a_stream_error(payload: object, chat: bool) -> None:
    parser = OpenAIStreamParser(chat=chat)
    for shaped in (
        payload,
        {"choices": [payload]},
        {"choices": [{"delta": payload, "text": payload}]},
    ):
        try:
            pieces = parser.event(json.dumps(shaped))
        except StreamError:
            continue
        assert all(isinstance(p, str) and p for p in pieces)
