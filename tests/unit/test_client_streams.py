"""Incremental UTF-8 decoding and SSE parsing, with chunk boundaries everywhere."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from client.errors import StreamError
from client.streams import OpenAIStreamParser, PredictStreamParser, SSEParser, Utf8Decoder

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


def feed_all(parser: OpenAIStreamParser | SSEParser, parts: list[bytes]) -> list:
    out: list = []
    for p in parts:
        out += parser.feed(p)
    return out + parser.close()


def test_sse_parser_fields_comments_multiline_and_crlf() -> None:
    raw = (
        b": keep-alive\r\nevent: message\r\nid: 7\r\ndata: line1\r\ndata:line2\r\n\r\n"
        b'data: {"a": 1}\n\n'
        b"data: last-without-blank-line"
    )
    for parts in splits(raw):
        events = feed_all(SSEParser(), parts)
        assert [e.data for e in events] == ["line1\nline2", '{"a": 1}', "last-without-blank-line"]
        assert events[0].event == "message" and events[0].id == "7"
        assert events[1].event is None


def test_sse_bare_cr_line_ends() -> None:
    raw = b"data: x\r\rdata: y\r\r"
    for parts in splits(raw):
        assert [e.data for e in feed_all(SSEParser(), parts)] == ["x", "y"]


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
        parser = OpenAIStreamParser(chat=False)
        assert "".join(feed_all(parser, parts)) == "Hé 世界 🙂"
        assert parser.state.usage is not None and parser.state.usage.completion_tokens == 3
        assert parser.state.finish_reason == "length"
        assert parser.state.done


def test_openai_chat_stream_skips_role_only_chunk() -> None:
    raw = sse(
        chat_chunk({"role": "assistant"}),
        chat_chunk({"content": "a"}),
        chat_chunk({"content": "b"}, "stop"),
    )
    parser = OpenAIStreamParser(chat=True)
    assert feed_all(parser, [raw]) == ["a", "b"]
    assert parser.state.chunks == 2
    assert parser.state.usage is None


def test_openai_stream_without_done_is_an_error() -> None:
    parser = OpenAIStreamParser(chat=False)
    parser.feed(sse(completion_chunk("x"), done=False))
    with pytest.raises(StreamError, match="DONE"):
        parser.close()


def test_openai_stream_error_event_raises_with_message() -> None:
    raw = sse(
        completion_chunk("x"),
        {"error": {"message": "engine died", "type": "server_error", "param": None, "code": 500}},
    )
    parser = OpenAIStreamParser(chat=False)
    with pytest.raises(StreamError) as info:
        feed_all(parser, [raw])
    assert info.value.message == "engine died"
    assert info.value.status == 500


def test_openai_stream_bad_json_is_an_error() -> None:
    with pytest.raises(StreamError, match="not JSON"):
        OpenAIStreamParser(chat=False).feed(b"data: {oops\n\n")
