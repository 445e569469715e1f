"""IncrementalDetokenizer: chunks joined equal the Hugging Face whole-sequence decode
(less a character the sequence ends inside, held back where the decode has U+FFFD),
whole characters only, one leading space stripped, linear work; for Mistral's
SentencePiece tokenizer and for SmolLM2's byte-level BPE."""

from __future__ import annotations

import functools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mistral_serving.text.detokenizer import IncrementalDetokenizer, partial_tail
from mistral_serving.text.tokenizer import TokenTable
from tests.decoding import decode, expected_text
from tests.tokenizer_cache import tokenizer_at

SETTINGS = settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)

VALID_TEXTS = [
    "😀",
    "🫠",
    "🦩 flamingo",
    "中文",
    "日本語のテキスト",
    "한국어",
    "café",
    "naïve résumé",
    "Ωμέγα",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
    "hello world",
    "  two  spaces",
    "\n\nnew lines\n",
    "\tTab",
    "a😀b",
    "x 🫠 y",
    "emoji👨‍👩‍👧family",
    "[INST]",
    "1 + 1 = 2",
]
valid_text = (
    st.lists(
        st.one_of(
            st.sampled_from(VALID_TEXTS),
            st.text(st.characters(blacklist_categories=("Cs",)), max_size=5),
            st.text(st.characters(min_codepoint=0x4E00, max_codepoint=0x9FFF), max_size=3),
            st.text(st.characters(min_codepoint=0x1F300, max_codepoint=0x1FAFF), max_size=3),
        ),
        min_size=1,
        max_size=8,
    )
    .map("".join)
    .map(lambda t: t.replace("\u2581", "_"))
)  # a literal "▁" decodes as a space


@functools.cache
def _hf(path: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


@functools.cache
def _piece_ids(path: str) -> tuple[int, ...]:
    tok = tokenizer_at(path)
    ids: set[int] = set()
    for text in VALID_TEXTS:
        ids.update(tok.encode(text))
    return tuple(sorted(ids))


def _id_sequences(path: str) -> st.SearchStrategy[list[int]]:
    return st.lists(
        st.one_of(
            st.integers(3, 258),  # byte fallback <0x00>..<0xFF>
            st.sampled_from(_piece_ids(path)),  # pieces of emoji / CJK / accented text
            st.sampled_from([0, 1, 2]),  # <unk>, <s>, </s>
            st.integers(0, 31999),
        ),
        max_size=40,
    )


def _split(ids: list[int], cuts: list[int]) -> list[list[int]]:
    points = sorted({c % (len(ids) + 1) for c in cuts})
    bounds = [0, *points, len(ids)]
    return [ids[a:b] for a, b in zip(bounds, bounds[1:])]


def _stream(table: TokenTable, parts: list[list[int]]) -> list[str]:
    detok = IncrementalDetokenizer(table)
    chunks = [detok.push(p) for p in parts]
    chunks.append(detok.flush())
    return chunks


def ends_inside_a_character(data: bytes) -> int:
    """The oracle for `partial_tail`, by brute force: how many bytes at the end are the
    start of one character that some continuation bytes complete (0: none)."""
    for size in range(1, min(3, len(data)) + 1):
        if size == 1:  # the second byte is the one a lead byte limits: try each
            extras = [bytes([b]) + b"\x80" * n for n in range(3) for b in range(0x80, 0xC0)]
        else:
            extras = [b"\x80" * n for n in range(1, 4 - size + 1)]
        for extra in extras:
            try:
                decoded = (data[-size:] + extra).decode("utf-8")
            except UnicodeDecodeError:
                continue
            if len(decoded) == 1:
                return size
    return 0


@SETTINGS
@given(
    data=st.binary(max_size=6)
    | st.text(min_size=1, max_size=3).map(lambda t: t.encode("utf-8", "surrogatepass")[:-1])
)
def test_a_cut_character_is_told_from_bytes_that_are_none(data: bytes) -> None:
    assert partial_tail(data) == ends_inside_a_character(data)


def test_a_sequence_cut_inside_a_character_ends_before_it(model_dir: str, smollm2_dir: str) -> None:
    """A length limit that cuts an emoji: the answer ends before it (as vLLM's does),
    not with a U+FFFD the model never chose."""
    for path in (model_dir, smollm2_dir):
        tok = tokenizer_at(path)
        ids = tok.encode("ok 😀")
        for cut in range(1, len(ids)):
            text = "".join(_stream(tok.table, [[i] for i in ids[:cut]]))
            assert "\ufffd" not in text and "ok 😀".startswith(text), (path, cut, text)
        assert "".join(_stream(tok.table, [[i] for i in ids])) == "ok 😀"


@SETTINGS
@given(data=st.data())
def test_random_ids_random_splits_equal_hf_decode(model_dir: str, data: st.DataObject) -> None:
    ids = data.draw(_id_sequences(model_dir), label="ids")
    cuts = data.draw(st.lists(st.integers(0, 1000), max_size=10), label="cuts")
    tok = tokenizer_at(model_dir)
    expected = expected_text(_hf(model_dir), tok.table, ids)
    assert decode(tok, ids) == expected
    chunks = _stream(tok.table, _split(ids, cuts))
    assert "".join(chunks) == expected
    # one token at a time, too
    assert "".join(_stream(tok.table, [[i] for i in ids])) == expected


@SETTINGS
@given(text=valid_text, bos=st.booleans())
def test_streaming_valid_text_never_emits_partial_characters(
    model_dir: str, text: str, bos: bool
) -> None:
    tok = tokenizer_at(model_dir)
    ids = tok.encode(text, bos=bos)
    detok = IncrementalDetokenizer(tok.table)
    so_far = ""
    for i in ids:
        chunk = detok.push([i])
        assert "\ufffd" not in chunk
        so_far += chunk
        assert text.startswith(so_far), (so_far, text)
    so_far += detok.flush()
    assert so_far == text


@SETTINGS
@given(text=valid_text, eos_every=st.integers(1, 5))
def test_special_tokens_inside_text_are_skipped(model_dir: str, text: str, eos_every: int) -> None:
    tok = tokenizer_at(model_dir)
    ids = tok.encode(text)
    mixed: list[int] = [1]
    for n, i in enumerate(ids):
        mixed.append(i)
        if n % eos_every == 0:
            mixed.append(2)
    assert "".join(_stream(tok.table, [[i] for i in mixed])) == text
    assert _hf(model_dir).decode(mixed, skip_special_tokens=True) == text


def test_leading_space_stripped_exactly_once(model_dir: str) -> None:
    tok = tokenizer_at(model_dir)
    table = tok.table
    hello = tok.encode("hello")  # "▁hello"
    world = tok.encode("world")  # "▁world"
    # first piece's space stripped; later pieces keep theirs
    assert _stream(table, [hello, world]) == ["hello", " world", ""]
    assert _stream(table, [[1], [2], hello, world]) == ["", "", "hello", " world", ""]
    # two leading spaces: only one is stripped
    assert "".join(_stream(table, [[i] for i in tok.encode(" hello")])) == " hello"
    # a leading space given as a byte token <0x20> is stripped too (HF Strip decoder)
    space_byte = 3 + 0x20
    for parts in ([[space_byte], hello], [[space_byte, *hello]], [[1, space_byte], [2], hello]):
        out = "".join(_stream(table, parts))
        assert out == _hf(model_dir).decode([i for p in parts for i in p], skip_special_tokens=True)
        assert out == " hello"
    # a lone space token decodes to nothing, and the next word keeps its space
    only_space = [28705]  # "▁"
    assert tok.table.token_bytes[28705] == b" "
    assert _stream(table, [only_space, hello]) == ["", " hello", ""]


def test_spaces_between_words_never_dropped(model_dir: str) -> None:
    tok = tokenizer_at(model_dir)
    text = "The quick  brown fox\njumps over  the 🫠 lazy 中文 dog ."
    chunks = _stream(tok.table, [[i] for i in tok.encode(text)])
    assert "".join(chunks) == text
    assert sum(c.count(" ") for c in chunks) == text.count(" ")


class _CountingTuple(tuple):
    lookups = 0

    def __getitem__(self, key):  # type: ignore[override]
        type(self).lookups += 1
        return super().__getitem__(key)


@pytest.mark.parametrize("n", [200, 2000])
def test_incremental_no_reemission_linear_work(model_dir: str, n: int) -> None:
    tok = tokenizer_at(model_dir)
    text = ("Streaming 🫠 text, 中文 and café. " * n)[: n * 4]
    ids = tok.encode(text)
    _CountingTuple.lookups = 0
    counted = TokenTable(
        tok.table.kind,
        _CountingTuple(tok.table.token_bytes),
        tok.table.is_byte_token,
        tok.table.strip_leading_space,
    )
    detok = IncrementalDetokenizer(counted)
    chunks = [detok.push([i]) for i in ids] + [detok.flush()]
    # each push returns only new text: the chunks add up to the output exactly
    assert sum(len(c) for c in chunks) == len(text)
    assert "".join(chunks) == text
    # each token's bytes are looked up a bounded number of times: O(N) in total
    assert _CountingTuple.lookups <= 2 * len(ids)


@SETTINGS
@given(
    data=st.lists(st.integers(0, 255), max_size=30),
    cuts=st.lists(st.integers(0, 100)),
    specials=st.lists(st.integers(0, 30), max_size=3),
)
def test_byte_level_streaming_matches_whole_decode(
    data: list[int], cuts: list[int], specials: list[int]
) -> None:
    # a synthetic byte-level table: ids 0..255 are the bytes, 256 is a special token
    table = TokenTable(
        "byte_level", tuple(bytes([b]) for b in range(256)) + (None,), (False,) * 257, False
    )
    ids = list(data)
    for pos in sorted(specials, reverse=True):
        ids.insert(min(pos, len(ids)), 256)
    expected = bytes(data).decode("utf-8", errors="replace")
    if partial_tail(bytes(data)):  # held back: no U+FFFD for a character cut at the end
        expected = expected[:-1]
    assert "".join(_stream(table, _split(ids, cuts))) == expected


def test_byte_level_split_multibyte_char_waits() -> None:
    table = TokenTable("byte_level", tuple(bytes([b]) for b in range(256)), (False,) * 256, False)
    detok = IncrementalDetokenizer(table)
    raw = " 😀中".encode()
    out = [detok.push([b]) for b in raw] + [detok.flush()]
    assert out[0] == " "  # byte-level: no leading space stripping
    assert "".join(out) == " 😀中"
    assert all("\ufffd" not in c for c in out)
    assert [c for c in out if c] == [" ", "😀", "中"]


# -- SmolLM2: a real byte-level BPE vocabulary (49152 tokens, 17 special) -----------------


@SETTINGS
@given(data=st.data())
def test_smollm2_random_ids_stream_like_hf_decode(smollm2_dir: str, data: st.DataObject) -> None:
    tok = tokenizer_at(smollm2_dir)
    assert tok.table.kind == "byte_level"
    ids = data.draw(
        st.lists(
            st.one_of(
                st.integers(0, 20),  # the special tokens and their neighbours
                st.sampled_from(_piece_ids(smollm2_dir)),  # pieces of emoji / CJK text
                st.integers(0, tok.vocab_size - 1),
            ),
            max_size=40,
        ),
        label="ids",
    )
    cuts = data.draw(st.lists(st.integers(0, 1000), max_size=10), label="cuts")
    expected = expected_text(_hf(smollm2_dir), tok.table, ids)
    assert decode(tok, ids) == expected
    assert "".join(_stream(tok.table, _split(ids, cuts))) == expected
    assert "".join(_stream(tok.table, [[i] for i in ids])) == expected


@SETTINGS
@given(text=valid_text)
def test_smollm2_streaming_never_emits_partial_characters(smollm2_dir: str, text: str) -> None:
    tok = tokenizer_at(smollm2_dir)
    ids = tok.encode(text)
    expected = _hf(smollm2_dir).decode(ids, skip_special_tokens=True)
    detok = IncrementalDetokenizer(tok.table)
    so_far = ""
    # (expected is not always `text`: bytes missing from this vocabulary, such as 0x1D,
    # are dropped by the encoder, and what is left of their character decodes as U+FFFD)
    for i in [2, *ids, 2]:  # <|im_end|> around the text: skipped
        so_far += detok.push([i])
        # a character is emitted only once complete: a partial one would be a U+FFFD
        # where the whole decode has the character
        assert expected.startswith(so_far), (so_far, expected)
    assert so_far + detok.flush() == expected
