"""The artifact tokenizer against its references: SentencePiece and mistral-common for
encoding, the Hugging Face decoder for decoding (SentencePiece and byte-level tables)."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mistral_serving.text.tokenizer import load_tokenizer
from tests.decoding import decode, expected_text
from tests.tokenizer_cache import tokenizer_at

FAST = settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
SLOW = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)

SNIPPETS = [
    "😀",
    "👍🏽",
    "👨‍👩‍👧",
    "🇫🇷",
    "中文",
    "日本語のテキスト",
    "한국어",
    "café",
    "naïve",
    "Ωμέγα",
    " ",
    "  ",
    "   ",
    "\n",
    "\n\n",
    "\t",
    " \n ",
    "\r\n",
    "[INST]",
    "[/INST]",
    "<s>",
    "</s>",
    "Hello",
    "world",
    ".",
    ",",
    "'",
    "1234",
    "\u200b",
    "\x00",
    "ﬁ",
    "é",
]
unicode_text = st.lists(
    st.one_of(
        st.sampled_from(SNIPPETS),
        st.text(st.characters(blacklist_categories=("Cs",)), max_size=6),
        st.text(st.characters(min_codepoint=0x4E00, max_codepoint=0x9FFF), max_size=4),
        st.text(st.characters(min_codepoint=0x1F300, max_codepoint=0x1FAFF), max_size=3),
    ),
    max_size=12,
).map("".join)


@functools.cache
def _sp(path: str):
    import sentencepiece

    return sentencepiece.SentencePieceProcessor(model_file=path)


@functools.cache
def _mistral_common_raw(path: str):
    from mistral_common.tokens.tokenizers.mistral import MistralTokenizer

    return MistralTokenizer.from_file(path).instruct_tokenizer.tokenizer


@functools.cache
def _hf(path: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


# -- SentencePiece path -------------------------------------------------------------------


def test_loads_sentencepiece_when_model_present(model_dir: str) -> None:
    tok = tokenizer_at(model_dir)
    sp = _sp(str(Path(model_dir) / "tokenizer.model"))
    assert tok.table.kind == "sentencepiece"
    assert tok.table.strip_leading_space
    assert (tok.bos_id, tok.eos_id) == (1, 2) == (sp.bos_id(), sp.eos_id())
    assert tok.vocab_size == sp.get_piece_size() == 32000
    # control and unknown tokens have no text; byte-fallback tokens are the 256 bytes
    assert tok.table.token_bytes[0] is None and tok.table.token_bytes[1] is None
    assert tok.table.token_bytes[2] is None
    assert [tok.table.token_bytes[3 + b] for b in range(256)] == [bytes([b]) for b in range(256)]
    assert all(tok.table.is_byte_token[3:259]) and not any(tok.table.is_byte_token[259:])


@FAST
@given(text=unicode_text)
def test_encode_equals_sentencepiece_and_mistral_common(model_dir: str, text: str) -> None:
    tok = tokenizer_at(model_dir)
    model = str(Path(model_dir) / "tokenizer.model")
    ids = tok.encode(text)
    assert ids == _sp(model).encode(text)
    assert ids == _mistral_common_raw(model).encode(text, bos=False, eos=False)
    assert tok.encode(text, bos=True) == _mistral_common_raw(model).encode(
        text, bos=True, eos=False
    )


@FAST
@given(text=unicode_text)
def test_decode_roundtrips_and_matches_hf(model_dir: str, text: str) -> None:
    tok = tokenizer_at(model_dir)
    ids = tok.encode(text, bos=True)
    # identity normalizer: the round trip is exact (a literal "▁" is SentencePiece's space)
    assert decode(tok, ids) == text.replace("\u2581", " ")
    assert decode(tok, ids) == expected_text(_hf(model_dir), tok.table, ids)


@pytest.mark.parametrize("text", ["", "a", " a", "  leading", "trailing  ", "\n", "😀中文"])
def test_bos_handling(model_dir: str, text: str) -> None:
    tok = tokenizer_at(model_dir)
    plain = tok.encode(text)
    assert 1 not in plain and 2 not in plain
    assert tok.encode(text, bos=False) == plain
    assert tok.encode(text, bos=True) == [1, *plain]


def test_encode_known_ids(model_dir: str) -> None:
    tok = tokenizer_at(model_dir)
    assert tok.encode("[INST]") == [733, 16289, 28793]
    # the whitespace runs the converted tokenizer.json merges differently
    assert tok.encode("  Hello  world") == [259, 22557, 28705, 1526]
    assert tok.encode("😀") == [28705, 30575]  # in the vocabulary
    assert tok.encode("🫠") == [28705, 243, 162, 174, 163]  # byte fallback: F0 9F AB A0


def test_missing_tokenizer_files(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="tokenizer"):
        load_tokenizer(tmp_path)


# -- Hugging Face tokenizer.json fallback --------------------------------------------------


def test_hf_fallback_table_equals_sentencepiece_table(model_dir: str) -> None:
    sp_tok, hf_tok = tokenizer_at(model_dir), tokenizer_at(model_dir, prefer_sentencepiece=False)
    assert hf_tok.table.kind == "sentencepiece"
    assert (hf_tok.bos_id, hf_tok.eos_id) == (1, 2)
    assert hf_tok.table == sp_tok.table


@SLOW
@given(ids=st.lists(st.integers(0, 31999), max_size=40), text=unicode_text)
def test_hf_fallback_decodes_identically(model_dir: str, ids: list[int], text: str) -> None:
    hf_tok = tokenizer_at(model_dir, prefer_sentencepiece=False)
    for seq in (ids, tokenizer_at(model_dir).encode(text, bos=True)):
        expected = expected_text(_hf(model_dir), hf_tok.table, seq)
        assert decode(hf_tok, seq) == expected
        assert decode(tokenizer_at(model_dir), seq) == expected


@SLOW
@given(text=unicode_text)
def test_hf_fallback_encodes_like_hf(model_dir: str, text: str) -> None:
    hf_tok = tokenizer_at(model_dir, prefer_sentencepiece=False)
    assert hf_tok.encode(text) == _hf(model_dir).encode(text, add_special_tokens=False)
    ids = hf_tok.encode(text)
    assert decode(hf_tok, ids) == expected_text(_hf(model_dir), hf_tok.table, ids)


# -- byte-level (GPT-2 / Llama 3 style) tables ----------------------------------------------

BYTE_LEVEL_CORPUS = [
    "Hello world, hello there. The quick brown fox jumps over the lazy dog.",
    "Emoji 😀😃😄 and CJK 中文字符 and accents café naïve résumé.",
    "def f(x):\n    return x * 2\n\n\tindented  double  spaces",
] * 20


@functools.cache
def _byte_level_dir(root: str) -> str:
    from tokenizers import Tokenizer as RawTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    raw = RawTokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<|begin_of_text|>", "<|end_of_text|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    raw.train_from_iterator(BYTE_LEVEL_CORPUS, trainer)
    # non-special added tokens: the HF decoder runs them through ByteLevel too
    raw.add_tokens(["<tool>", "ĠSPACE", "中文", "<café>"])
    out = Path(root)
    out.mkdir(parents=True, exist_ok=True)
    raw.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<|begin_of_text|>",
                "eos_token": "<|end_of_text|>",
                "clean_up_tokenization_spaces": False,
            }
        )
    )
    return str(out)


@pytest.fixture(scope="module")
def byte_level_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return _byte_level_dir(str(tmp_path_factory.mktemp("byte_level") / "tok"))


def test_byte_level_table(byte_level_dir: str) -> None:
    tok = load_tokenizer(Path(byte_level_dir))
    hf = _hf(byte_level_dir)
    assert tok.table.kind == "byte_level"
    assert not tok.table.strip_leading_space
    assert tok.eos_id == hf.convert_tokens_to_ids("<|end_of_text|>")
    assert tok.bos_id == hf.convert_tokens_to_ids("<|begin_of_text|>")
    assert tok.table.token_bytes[tok.eos_id] is None
    # the 256 single-byte tokens map back to all 256 bytes
    singles = {b for b in tok.table.token_bytes if b is not None and len(b) == 1}
    assert singles == {bytes([i]) for i in range(256)}
    assert hf.convert_tokens_to_ids("Ġ") is not None
    assert tok.table.token_bytes[hf.convert_tokens_to_ids("Ġ")] == b" "


@SLOW
@given(text=unicode_text)
def test_byte_level_roundtrip_matches_hf(byte_level_dir: str, text: str) -> None:
    tok = tokenizer_at(byte_level_dir)
    hf = _hf(byte_level_dir)
    ids = tok.encode(text)
    assert ids == hf.encode(text, add_special_tokens=False)
    assert decode(tok, ids) == text  # byte-level: no leading space handling
    assert decode(tok, ids) == expected_text(hf, tok.table, ids)


@SLOW
@given(data=st.data())
def test_byte_level_random_ids_decode_like_hf(byte_level_dir: str, data: st.DataObject) -> None:
    tok = tokenizer_at(byte_level_dir)
    ids = data.draw(st.lists(st.integers(0, tok.vocab_size - 1), max_size=30))
    assert decode(tok, ids) == expected_text(_hf(byte_level_dir), tok.table, ids)


def test_byte_level_split_multibyte_chars(byte_level_dir: str) -> None:
    tok = tokenizer_at(byte_level_dir)
    hf = _hf(byte_level_dir)
    byte_ids = {b[0]: i for i, b in enumerate(tok.table.token_bytes) if b and len(b) == 1}
    for text in ["😀", "中", "é", "a😀b中c"]:
        ids = [byte_ids[b] for b in text.encode()]  # one token per byte
        assert decode(tok, ids) == text == hf.decode(ids, skip_special_tokens=True)
    # a truncated character decodes with a replacement, as the HF decoder does
    ids = [byte_ids[b] for b in "😀".encode()[:2]] + [byte_ids[ord("x")]]
    assert decode(tok, ids) == expected_text(hf, tok.table, ids)
    assert decode(tok, ids).endswith("x") and "\ufffd" in decode(tok, ids)
    # a special token between the bytes of one character does not break it
    eos = tok.eos_id
    ids = [byte_ids[b] for b in "中".encode()]
    assert decode(tok, [ids[0], eos, *ids[1:]]) == "中"


# -- what the artifact's files decide: BOS, stop ids, chat format ---------------------------


def test_mistral_artifact_adds_bos_and_keeps_mistral_chat(model_dir: str) -> None:
    for tok in (tokenizer_at(model_dir), tokenizer_at(model_dir, prefer_sentencepiece=False)):
        assert tok.add_bos and tok.chat_format == "mistral"
        assert tok.stop_token_ids == (2,)
        assert tok.encode("hi", bos=True)[0] == 1
    # the HF tokenizer.json agrees with SentencePiece: BOS before a text
    assert _hf(model_dir).encode("hi")[0] == 1


EOS = "eos"  # stands for the tokenizer's EOS id in the cases below


@pytest.mark.parametrize(
    ("eos_token_id", "expected"),
    [
        ("absent", (EOS,)),
        (None, (EOS,)),
        (EOS, (EOS,)),
        (300, (EOS, 300)),
        ([9, EOS, 9, 3], (EOS, 9, 3)),  # EOS first, no duplicates
        ([], (EOS,)),
    ],
)
def test_stop_token_ids_from_generation_config(
    byte_level_dir: str, tmp_path: Path, eos_token_id: object, expected: tuple
) -> None:
    eos = tokenizer_at(byte_level_dir).eos_id

    def real(v: object) -> object:
        return [real(i) for i in v] if isinstance(v, list) else eos if v == EOS else v

    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / name).write_bytes((Path(byte_level_dir) / name).read_bytes())
    if eos_token_id != "absent":
        config = {"eos_token_id": real(eos_token_id)}
        (tmp_path / "generation_config.json").write_text(json.dumps(config))
    assert load_tokenizer(tmp_path).stop_token_ids == tuple(real(list(expected)))


@pytest.mark.parametrize(
    "text", ['{"eos_token_id": "2"}', '{"eos_token_id": [2, true]}', "[1, 2]", "{not json"]
)
def test_bad_generation_config_is_a_clear_error(
    byte_level_dir: str, tmp_path: Path, text: str
) -> None:
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / name).write_bytes((Path(byte_level_dir) / name).read_bytes())
    (tmp_path / "generation_config.json").write_text(text)
    with pytest.raises(ValueError, match="generation_config.json"):
        load_tokenizer(tmp_path)


def test_tokenizer_without_chat_template_has_no_chat_format(byte_level_dir: str) -> None:
    tok = tokenizer_at(byte_level_dir)
    assert tok.chat_format == "none"
    assert tok.add_bos is False  # its post-processor adds nothing
    assert tok.encode("Hello", bos=True) == _hf(byte_level_dir).encode("Hello")


# -- SmolLM2 (byte-level BPE, ChatML): the tokenizer of `make serve`'s model ---------------


def test_smollm2_tokenizer_is_byte_level_chatml(smollm2_dir: str) -> None:
    tok = tokenizer_at(smollm2_dir)
    hf = _hf(smollm2_dir)
    assert tok.table.kind == "byte_level" and not tok.table.strip_leading_space
    assert tok.vocab_size == len(hf) == 49152
    assert tok.eos_id == hf.convert_tokens_to_ids("<|im_end|>") == 2
    assert tok.stop_token_ids == (2,)
    assert tok.chat_format == "template"
    # its "BOS" is <|im_start|>, which its own tokenizer never puts before a text
    assert tok.bos_id == hf.convert_tokens_to_ids("<|im_start|>") and not tok.add_bos
    assert tok.encode("What is the capital of France?", bos=True) == hf.encode(
        "What is the capital of France?"
    )
    # every added token marked special decodes to nothing, as in the HF decoder
    specials = [i for i, t in hf.added_tokens_decoder.items() if t.special]
    assert len(specials) == 17 and all(tok.table.token_bytes[i] is None for i in specials)


@SLOW
@given(text=unicode_text)
def test_smollm2_encode_and_decode_match_hf(smollm2_dir: str, text: str) -> None:
    tok = tokenizer_at(smollm2_dir)
    hf = _hf(smollm2_dir)
    ids = tok.encode(text)
    assert ids == hf.encode(text, add_special_tokens=False)
    # (not always `text`: bytes missing from this GGUF's vocabulary, such as 0x1D, are
    # dropped by the encoder itself)
    assert decode(tok, ids) == expected_text(hf, tok.table, ids)
    if text.isprintable():
        assert decode(tok, ids) == text


@SLOW
@given(data=st.data())
def test_smollm2_random_ids_decode_like_hf(smollm2_dir: str, data: st.DataObject) -> None:
    tok = tokenizer_at(smollm2_dir)
    ids = data.draw(
        st.lists(st.one_of(st.integers(0, 20), st.integers(0, tok.vocab_size - 1)), max_size=30)
    )
    assert decode(tok, ids) == expected_text(_hf(smollm2_dir), tok.table, ids)
