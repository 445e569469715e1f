"""decode_json_object: raw request bytes -> a JSON object, or one RequestError line for
anything a strict parser refuses; never another exception."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mistral_serving.errors import RequestError
from mistral_serving.protocols.body import MAX_DEPTH, decode_json_object

JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


def refused(raw: bytes) -> RequestError:
    with pytest.raises(RequestError) as err:
        decode_json_object(raw)
    assert err.value.status == 400
    assert "\n" not in err.value.message
    return err.value


def nested(depth: int, leaf: str = "{}") -> bytes:
    """An object `depth` levels deep: {"a": {"a": ... leaf}}."""
    return ('{"a": ' * (depth - 1) + leaf + "}" * (depth - 1)).encode()


def test_an_object_is_decoded() -> None:
    raw = '{"prompt": "café 😀", "n": [1, 2.5, null, true], "o": {}}'.encode()
    assert decode_json_object(raw) == {"prompt": "café 😀", "n": [1, 2.5, None, True], "o": {}}


def test_surrogate_pairs_written_as_escapes_are_one_character() -> None:
    assert decode_json_object(b'{"a": "\\ud83d\\ude00"}') == {"a": "😀"}


@pytest.mark.parametrize("raw", [b"", b"   ", b"\n\t"])
def test_empty_body(raw: bytes) -> None:
    assert "empty" in refused(raw).message


@pytest.mark.parametrize("raw", [b'{"a": "\xff"}', b'{"a": "\xc3"}', b"\xed\xa0\x80", b"\x80"])
def test_invalid_utf8(raw: bytes) -> None:
    assert "UTF-8" in refused(raw).message


@pytest.mark.parametrize(
    "raw",
    [b"{", b'{"a": }', b"{'a': 1}", b'{"a": 1,}', b'{"a": 1} x', b"\x00", b'{"a": 01}'],
)
def test_malformed_json_says_where(raw: bytes) -> None:
    message = refused(raw).message
    assert message.startswith("request body is not valid JSON")
    assert "line 1, column" in message


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_nan_and_infinity_are_refused(constant: str) -> None:
    err = refused(f'{{"temperature": {constant}}}'.encode())
    assert constant.lstrip("-") in err.message


@pytest.mark.parametrize("number", ["1e999", "-1e999", "1" + "0" * 400 + ".0"])
def test_numbers_that_overflow_to_infinity_are_refused(number: str) -> None:
    """A finite literal too large for a float would become inf: what NaN/Infinity are
    refused for."""
    refused(f'{{"temperature": {number}}}'.encode())


def test_huge_integers_are_refused_not_a_crash() -> None:
    """int() refuses more than 4300 digits with a plain ValueError."""
    err = refused(b'{"seed": ' + b"9" * 5000 + b"}")
    assert "digits" in err.message


def test_large_but_allowed_integers_decode() -> None:
    assert decode_json_object(b'{"seed": ' + b"9" * 4000 + b"}") == {"seed": int("9" * 4000)}


@pytest.mark.parametrize(
    ("raw", "kind"),
    [
        (b"[]", "an array"),
        (b'"text"', "a string"),
        (b"null", "null"),
        (b"true", "a boolean"),
        (b"3", "a number"),
        (b"-0.5", "a number"),
    ],
)
def test_the_top_level_must_be_an_object(raw: bytes, kind: str) -> None:
    assert refused(raw).message == f"request body must be a JSON object, not {kind}"


def test_depth_limit() -> None:
    assert decode_json_object(nested(MAX_DEPTH)) is not None  # 32 objects deep: fine
    assert f"deeper than {MAX_DEPTH}" in refused(nested(MAX_DEPTH + 1)).message
    lists = b'{"a": ' + b"[" * MAX_DEPTH + b"]" * MAX_DEPTH + b"}"
    assert "deeper" in refused(lists).message


def test_very_deep_bodies_are_refused_not_a_recursion_crash() -> None:
    n = 200_000
    assert "deeper" in refused(b'{"a": ' + b"[" * n + b"]" * n + b"}").message
    assert "deeper" in refused(nested(n)).message


@pytest.mark.parametrize(
    ("raw", "param"),
    [
        (b'{"prompt": "\\ud800"}', "prompt"),
        (b'{"prompt": "ok \\udfff end"}', "prompt"),
        (b'{"messages": [{"role": "user", "content": "\\ud83d"}]}', "messages.0.content"),
        (b'{"stop": ["a", "\\ude00"]}', "stop.1"),
        (b'["\\ud800"]', None),  # not an object: refused for that first
    ],
)
def test_lone_surrogates_are_refused_naming_the_field(raw: bytes, param: str | None) -> None:
    err = refused(raw)
    assert err.param == param
    if param is not None:
        assert "surrogate" in err.message


def test_lone_surrogate_in_a_key() -> None:
    err = refused(b'{"\\ud800": 1}')
    assert "a key" in err.message and "surrogate" in err.message
    assert err.param is None
    json.dumps(err.message, ensure_ascii=False).encode()  # the message itself encodes


@settings(max_examples=500, deadline=None)
@given(raw=st.binary(max_size=64))
def test_any_bytes_give_an_object_or_a_request_error(raw: bytes) -> None:
    try:
        value = decode_json_object(raw)
    except RequestError as err:
        assert err.status == 400 and err.message and "\n" not in err.message
        err.message.encode("utf-8")  # printable in any error body
    else:
        assert isinstance(value, dict)


JSONISH = st.lists(
    st.sampled_from(
        [
            "{",
            "}",
            "[",
            "]",
            '"',
            ":",
            ",",
            '"a"',
            "1",
            "-",
            "e9",
            ".5",
            "null",
            "true",
            "NaN",
            "Infinity",
            "\\u",
            "d800",
            "\\",
            " ",
            "\xff",
            "é",
            "😀",
            "1e999",
            "0" * 5,
        ]
    ),
    max_size=24,
).map("".join)


@settings(max_examples=500, deadline=None)
@given(text=JSONISH, errors=st.sampled_from(["strict", "surrogatepass"]))
def test_json_like_text_gives_an_object_or_a_request_error(text: str, errors: str) -> None:
    try:
        value = decode_json_object(text.encode("utf-8", errors))
    except RequestError as err:
        assert err.status == 400 and "\n" not in err.message
    else:
        assert isinstance(value, dict)


def has_lone_surrogate(value: Any) -> bool:
    if isinstance(value, str):
        return any(0xD800 <= ord(c) <= 0xDFFF for c in value)
    if isinstance(value, list):
        return any(has_lone_surrogate(v) for v in value)
    if isinstance(value, dict):
        return any(has_lone_surrogate(k) or has_lone_surrogate(v) for k, v in value.items())
    return False


def depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max((depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((depth(v) for v in value), default=0)
    return 1


@settings(max_examples=300, deadline=None)
@given(value=st.dictionaries(st.text(), JSON, max_size=4), ascii_only=st.booleans())
def test_any_json_object_round_trips_or_names_its_surrogate(
    value: dict[str, Any], ascii_only: bool
) -> None:
    raw = json.dumps(value, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")
    try:
        decoded = decode_json_object(raw)
    except RequestError as err:
        # Only a lone surrogate (escaped, or raw and so invalid UTF-8) is refused here:
        # hypothesis' integers stay well under 4300 digits and the depth under 32.
        assert has_lone_surrogate(value), err.message
    else:
        assert decoded == value
        assert not has_lone_surrogate(value)
        assert depth(value) <= MAX_DEPTH


def test_a_long_token_id_prompt_decodes() -> None:
    ids = list(range(32000))
    assert decode_json_object(json.dumps({"prompt": ids}).encode()) == {"prompt": ids}


@pytest.mark.parametrize(
    ("raw", "where"),
    [
        (b'{"temperature": 1e999}', "temperature"),
        (b'{"prompt": [1, 2, -1e999]}', "prompt.2"),
        (b'{"a": [{"b": [0.5, 1e400]}]}', "a.0.b.1"),
    ],
)
def test_an_overflowing_number_is_refused_naming_where(raw: bytes, where: str) -> None:
    err = refused(raw)
    assert "out of range" in err.message and err.message.endswith(where)


def test_a_huge_integer_inside_a_list_is_refused() -> None:
    err = refused(b'{"prompt": [1, ' + b"7" * 4400 + b"]}")
    assert "digits" in err.message


def reference_refuses(value: Any) -> bool:
    """What the body check refuses, written plainly (recursively) from its rules."""
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, str):
        return has_lone_surrogate(value)
    if isinstance(value, list):
        return any(reference_refuses(v) for v in value)
    if isinstance(value, dict):
        return any(has_lone_surrogate(k) or reference_refuses(v) for k, v in value.items())
    return False


def wrapped(value: Any, shells: list[bool]) -> Any:
    for as_list in shells:
        value = [value] if as_list else {"k": value}
    return value


# Bodies whose depth lands near the limit, with lists of plain numbers (token ids) at the
# bottom, where the check passes over a list of numbers in one step.
DEEP = st.builds(
    wrapped,
    st.lists(st.integers(-3, 3) | st.booleans() | st.none(), max_size=4) | JSON,
    st.lists(st.booleans(), min_size=MAX_DEPTH - 4, max_size=MAX_DEPTH + 2),
)


@settings(max_examples=400, deadline=None)
@given(value=DEEP | st.dictionaries(st.text(max_size=3), JSON, max_size=4))
def test_refusals_match_the_rules_at_any_depth(value: Any) -> None:
    body = value if isinstance(value, dict) else {"b": value}
    raw = json.dumps(body).encode("utf-8", "surrogatepass")
    should_refuse = depth(body) > MAX_DEPTH or reference_refuses(body)
    try:
        decoded = decode_json_object(raw)
    except RequestError as err:
        assert should_refuse, err.message
    else:
        assert not should_refuse and decoded == body
