"""StopMatcher and TextStream: stop strings (never sent, never half-sent), chunking by
`interval` tokens, and the streamed chunks joining to the non-streaming text."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from mistral_serving.text.detokenizer import IncrementalDetokenizer
from mistral_serving.text.streaming import StopMatcher, TextStream
from mistral_serving.text.tokenizer import Tokenizer
from tests.decoding import decode

SETTINGS = settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
TOKEN_SETTINGS = settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)

small_text = st.text(alphabet="ab c\n😀中", max_size=30)
stop_string = st.text(alphabet="ab c\n😀中", min_size=1, max_size=4)


def _split(text: str, cuts: list[int]) -> list[str]:
    points = sorted({c % (len(text) + 1) for c in cuts})
    bounds = [0, *points, len(text)]
    return [text[a:b] for a, b in zip(bounds, bounds[1:])]


def _substring_free(stops: list[str]) -> bool:
    return not any(a != b and a in b for a in stops for b in stops)


def _expected(text: str, stops: list[str]) -> tuple[str, bool]:
    hits = [text.find(s) for s in stops if s and s in text]
    return (text[: min(hits)], True) if hits else (text, False)


def _run_matcher(stops: list[str], parts: list[str]) -> tuple[list[str], str, bool, str]:
    """(emitted chunks, output, stopped, text seen up to the stop)."""
    m = StopMatcher(stops)
    chunks: list[str] = []
    seen = ""
    for part in parts:
        seen += part
        chunks.append(m.push(part))
        if m.stopped:
            break
    chunks.append(m.flush())
    return chunks, "".join(chunks), m.stopped, seen


@SETTINGS
@given(
    text=small_text,
    stops=st.lists(stop_string, min_size=1, max_size=3),
    cuts=st.lists(st.integers(0, 100), max_size=12),
)
def test_stop_matcher_earliest_stop_any_split(text: str, stops: list[str], cuts: list[int]) -> None:
    # With no stop string inside another, "first to appear" and "earliest position"
    # agree, so the output does not depend on how the text is split.
    assume(_substring_free(stops))
    chunks, out, stopped, _ = _run_matcher(stops, _split(text, cuts))
    expected, expect_stop = _expected(text, stops)
    assert out == expected
    assert stopped == expect_stop
    assert not any(s in out for s in stops)
    # what was emitted at every point is a prefix of the final answer
    so_far = ""
    for c in chunks:
        so_far += c
        assert expected.startswith(so_far)


@SETTINGS
@given(
    text=small_text,
    stops=st.lists(stop_string, max_size=3),
    cuts=st.lists(st.integers(0, 100), max_size=12),
)
def test_stop_matcher_any_stops(text: str, stops: list[str], cuts: list[int]) -> None:
    # Any stop set (also one inside another): the output is the text seen until the
    # matcher stopped, cut at the earliest stop occurrence in it; emitted text never
    # holds a stop string and is always a prefix of that answer.
    parts = _split(text, cuts)
    chunks, out, stopped, seen = _run_matcher(stops, parts)
    expected, expect_stop = _expected(seen, stops)
    assert (out, stopped) == (expected, expect_stop)
    if not stopped:
        assert seen == text and out == text
    assert not any(s in out for s in stops)
    so_far = ""
    for c in chunks:
        so_far += c
        assert expected.startswith(so_far)
    # stopping happens on the first part after which a stop string is in the text
    n = 0
    for part in parts:
        n += len(part)
        if any(s in text[:n] for s in stops):
            assert len(seen) == n
            break


@SETTINGS
@given(text=small_text, stop=stop_string)
def test_stop_matcher_holds_back_only_possible_stop_prefixes(text: str, stop: str) -> None:
    # character by character: nothing is held back that cannot still become the stop
    m = StopMatcher([stop])
    sent = ""
    for i, ch in enumerate(text):
        sent += m.push(ch)
        if m.stopped:
            break
        held = text[len(sent) : i + 1]
        assert len(held) < len(stop)
        assert stop.startswith(held)
        # and the longest such suffix is the one held
        for n in range(len(held) + 1, min(len(stop), i + 2)):
            assert not stop.startswith(text[i + 1 - n : i + 1])


def test_stop_matcher_examples() -> None:
    m = StopMatcher(["</answer>"])
    assert m.push("The answer is 4<") == "The answer is 4"  # "<" held back
    assert m.push("/ans") == ""
    assert m.push("wer> trailing") == ""
    assert m.stopped and m.flush() == ""
    # a held-back prefix that turns out not to be the stop is released
    m = StopMatcher(["STOP"])
    assert m.push("a ST") == "a "
    assert m.push("ART") == "START"
    assert m.flush() == "" and not m.stopped
    m = StopMatcher(["STOP"])
    assert m.push("ST") == ""
    assert m.flush() == "ST"
    # no stops, empty stops: passthrough
    assert StopMatcher([]).push("abc") == "abc"
    assert StopMatcher(["", ""]).push("abc") == "abc"
    # after stopping, nothing more
    m = StopMatcher(["x"])
    assert m.push("axb") == "a"
    assert m.push("more") == "" and m.flush() == ""


def test_stop_matcher_earliest_of_several() -> None:
    m = StopMatcher(["zz", "b", "abc"])
    # "abc" (at 0) and "b" (at 1) both complete in this push: the earliest wins
    assert m.push("abcd") == ""
    assert m.stopped
    m = StopMatcher(["world", "o"])
    assert m.push("hello world") == "hell"
    assert m.matched == "o"  # the one that ended it (Anthropic's stop_sequence)


def test_the_stop_string_that_ended_the_text_is_named() -> None:
    m = StopMatcher(["b", "ab"])
    assert m.matched is None and m.push("xab") == "x"
    assert m.matched == "ab"  # earliest position, not the first listed
    tie = StopMatcher(["ab", "a"])
    assert tie.push("ab") == "" and tie.matched == "ab"  # a tie: the first listed
    assert StopMatcher(["q"]).matched is None


# -- TextStream with the real tokenizer -----------------------------------------------------


words = st.lists(
    st.sampled_from(
        [
            "Hello",
            "world",
            "😀",
            "🫠",
            "中文",
            "café",
            " ",
            "\n",
            "stop",
            "END",
            "a",
            "b",
            ",",
            "  ",
        ]
    ),
    max_size=15,
).map(" ".join)


def _visible(tok: Tokenizer, ids: list[int]) -> str:
    return IncrementalDetokenizer(tok.table).push(ids)


def _feed(stream: TextStream, ids: list[int], group: int = 1) -> tuple[list, int]:
    """Feed ids `group` at a time until stopped: (add() results, ids fed)."""
    results = []
    fed = 0
    for k in range(0, len(ids), group):
        if stream.stopped:
            break
        batch = ids[k : k + group]
        results.append(stream.add(batch))
        fed += len(batch)
    return results, fed


@TOKEN_SETTINGS
@given(text=words, interval=st.integers(1, 6), group=st.integers(1, 4))
def test_text_stream_no_stop_joins_to_decode(
    tok: Tokenizer, text: str, interval: int, group: int
) -> None:
    ids = tok.encode(text, bos=True) + [tok.eos_id]
    stream = TextStream(tok.table, (), interval)
    results, fed = _feed(stream, ids, group)
    last = stream.finish()
    chunks = [r for r in results if r is not None]
    assert all(chunks), "a returned chunk is never empty"
    assert "".join(chunks) + last == stream.text == decode(tok, ids) == text
    assert not stream.stopped
    assert stream.num_tokens == fed == len(ids)


@TOKEN_SETTINGS
@given(text=words, interval=st.integers(1, 6))
def test_text_stream_interval_one_token_at_a_time(tok: Tokenizer, text: str, interval: int) -> None:
    ids = tok.encode(text)
    stream = TextStream(tok.table, (), interval)
    sent = ""
    for n, i in enumerate(ids, start=1):
        chunk = stream.add([i])
        if n % interval:
            assert chunk is None  # chunks only when `interval` tokens have gathered
        else:
            # at each interval: a chunk exactly when there is unsent text
            assert chunk == (stream.text[len(sent) :] or None)
        sent += chunk or ""
        assert stream.text.startswith(sent)
    sent += stream.finish()
    assert sent == stream.text == text


def test_text_stream_interval_counts(tok: Tokenizer) -> None:
    ids = tok.encode("one two three four five six seven")
    assert len(ids) == 7
    stream = TextStream(tok.table, (), 3)
    out = [stream.add([i]) for i in ids]
    assert out == [None, None, "one two three", None, None, " four five six", None]
    assert stream.finish() == " seven"
    assert stream.text == "one two three four five six seven"
    assert stream.num_tokens == 7
    # a run of byte tokens: no chunk until the run ends (HF decodes a run as a whole)
    ids = tok.encode("🫠 x")  # "▁" + 4 byte tokens + "▁x"
    assert len(ids) == 6
    stream = TextStream(tok.table, (), 2)
    assert [stream.add([i]) for i in ids] == [None, None, None, None, None, "🫠 x"]
    assert stream.finish() == ""
    stream = TextStream(tok.table, (), 1)
    assert [stream.add([i]) for i in ids[:5]] == [None] * 5
    assert stream.finish() == "🫠"
    with pytest.raises(ValueError):
        TextStream(tok.table, (), 0)


@TOKEN_SETTINGS
@given(
    text=words,
    stops=st.lists(
        st.sampled_from(["stop", "END", "o w", "😀", "中", "café", "\n", "lo", "d 🫠", "xyz"]),
        min_size=1,
        max_size=3,
    ),
    interval=st.integers(1, 4),
    group=st.integers(1, 3),
)
def test_text_stream_with_stops(
    tok: Tokenizer, text: str, stops: list[str], interval: int, group: int
) -> None:
    assume(_substring_free(stops))
    ids = tok.encode(text, bos=True)
    stream = TextStream(tok.table, stops, interval)
    results, fed = _feed(stream, ids, group)
    stopped_while_adding = stream.stopped
    last = stream.finish()
    expected, expect_stop = _expected(text, stops)
    assert stream.text == expected
    assert "".join(r for r in results if r) + last == expected
    assert stream.stopped == expect_stop
    assert stream.num_tokens == fed
    if stopped_while_adding:
        # generation ends on the token that completed the stop string
        assert stream.add([ids[-1]]) is None and stream.num_tokens == fed
        # (text visible to a stream: a pending byte run is not decoded until it ends)
        assert any(s in _visible(tok, ids[:fed]) for s in stops)
        if fed > group:
            assert not any(s in _visible(tok, ids[: fed - group]) for s in stops)
    else:
        # no stop, or one completed only by the final byte run (e.g. "\n" is <0x0A>)
        assert fed == len(ids)
        assert not any(s in _visible(tok, ids) for s in stops)


def test_stop_string_spanning_tokens(tok: Tokenizer) -> None:
    ids = tok.encode("Hello world and more")
    stream = TextStream(tok.table, ["lo wor"], 1)
    out = [stream.add([i]) for i in ids[:2]]
    assert stream.stopped
    assert out == ["Hel", None]  # "lo" held back after "Hello", then the stop completes
    assert stream.text == "Hel"
    assert stream.finish() == ""
    assert stream.num_tokens == 2
    assert stream.stop_string == "lo wor"


def test_stop_at_the_very_start(tok: Tokenizer) -> None:
    ids = tok.encode("Hello world")
    stream = TextStream(tok.table, ["Hello"], 1)
    assert stream.add(ids[:1]) is None
    assert stream.stopped
    assert stream.finish() == "" and stream.text == ""
    assert stream.num_tokens == 1
    # tokens after the stop are ignored
    assert stream.add(ids[1:]) is None and stream.num_tokens == 1


def test_stop_held_prefix_released_at_finish(tok: Tokenizer) -> None:
    ids = tok.encode("the end is E")
    stream = TextStream(tok.table, ["END"], 4)
    assert len(ids) == 4
    assert stream.add(ids) == "the end is "  # "E" could still become "END"
    assert stream.finish() == "E"
    assert stream.text == "the end is E" and not stream.stopped


def test_stop_flushes_unsent_text_at_once(tok: Tokenizer) -> None:
    ids = tok.encode("Hello world STOP more")
    stream = TextStream(tok.table, ["STOP"], 100)
    out = [stream.add([i]) for i in ids]
    stop_at = next(n for n, chunk in enumerate(out) if chunk is not None)
    assert out[stop_at] == "Hello world "
    assert stream.stopped and stream.num_tokens == stop_at + 1
    assert all(c is None for c in out[stop_at + 1 :])
    assert stream.finish() == "" and stream.text == "Hello world "


def test_stop_completed_by_the_final_byte_run(tok: Tokenizer) -> None:
    # the byte run of "🫠" is only decoded at finish(): the stop is found there
    ids = tok.encode("a 🫠")
    stream = TextStream(tok.table, ["🫠"], 1)
    chunks = [stream.add([i]) for i in ids]
    assert not stream.stopped
    assert "".join(c for c in chunks if c) + stream.finish() == "a "
    assert stream.stopped and stream.text == "a "


def test_newline_stop_is_seen_when_the_byte_run_ends(tok: Tokenizer) -> None:
    # Mistral encodes "\n" as the byte-fallback token <0x0A>; byte runs decode as a whole
    # (HF semantics), so a "\n" stop is found one token later, never sent, never lost.
    ids = tok.encode("Hello\nWorld")
    assert ids == [22557, 13, 11978]
    assert tok.table.is_byte_token[13]
    stream = TextStream(tok.table, ["\n"], 1)
    assert stream.add(ids[:1]) == "Hello"
    assert stream.add(ids[1:2]) is None and not stream.stopped
    assert stream.add(ids[2:]) is None and stream.stopped
    assert stream.finish() == "" and stream.text == "Hello"
