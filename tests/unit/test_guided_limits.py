"""The response_format gate (`mistral_serving.structured.grammar`): static bounds, refused keywords,
the timed compile in a killable child process (real xgrammar, real processes), cached
verdicts; the engine-side decoder's bounded cache and its errors without build paths."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mistral_serving.engines.base import EngineRequestError
from mistral_serving.engines.pytorch.guided import GuidedDecoder
from mistral_serving.errors import RequestError
from mistral_serving.settings import Settings
from mistral_serving.structured.constraint import GuidedDecoding
from mistral_serving.structured.grammar import (
    IGNORED_KEYWORDS,
    GrammarGate,
    SchemaLimits,
    check_schema,
    gate_for,
    pattern_repeat,
)
from mistral_serving.structured.grammar_pool import clean_xgrammar_error
from mistral_serving.text.tokenizer import Tokenizer

LIMITS = SchemaLimits.from_settings(Settings())
BOMB = "((a{0,30}){0,30}){0,30}"  # the issue's 285-byte request: minutes in xgrammar


def refusal(schema: object) -> str:
    text = json.dumps(schema)
    with pytest.raises(RequestError) as info:
        check_schema(schema, len(text.encode()), LIMITS)
    assert info.value.status == 400 and info.value.param == "response_format"
    return info.value.message


def passes(schema: object) -> None:
    check_schema(schema, len(json.dumps(schema).encode()), LIMITS)


@pytest.mark.parametrize(
    ("pattern", "cost"),
    [
        (BOMB, 27_000),
        ("[a-z]{1,20}", 20),
        ("[a-z]{0,1000}", 1000),
        ("(a{0,30}){0,30}", 900),
        ("^\\d{4}-\\d{2}-\\d{2}$", 8 + 2),
        ("(ab|cd){3}", 12),
        ("a{2,}", 3),
        ("[{]{5}", 5),  # a brace in a class is a character, not a repetition
        ("a*b+c?", 3),
        ("(((", 0),
    ],
)
def test_pattern_repeat_counts_the_expansion(pattern: str, cost: int) -> None:
    assert pattern_repeat(pattern) == cost


# Seconds xgrammar 0.2.9 took to compile `{"type": "string", "pattern": ...}` with the
# Mistral vocabulary on the 2-core development machine (one run each; docs/reliability.md):
# what the price must keep out (over ~1 s, most far over) and let in.
SLOW = {
    "(.{0,9}){0,9}": 9.0,  # 13 bytes: the issue's 118-byte schema nests these
    "(.{0,9}){0,9}x": 18.1,
    ".{0,9}" * 10: 13.8,
    "(.{1,9}){1,9}": 6.2,
    "(\\w{0,9}){0,9}": 4.7,
    "(.{0,2}){0,20}": 3.9,
    ".{0,9}" * 5: 2.9,
    "(.?){0,30}": 2.1,
    ".{0,3}" * 10: 1.6,
    "([a-z]{0,9}){0,9}": 1.6,
    "(.{0,3}){0,9}": 1.4,
    "([^a]{0,9}){0,9}": 6.9,
}
FAST = {
    ".{0,128}": 0.62,
    "(x.{0,9}){0,9}": 0.55,
    ".{0,18}.{0,18}": 0.51,
    "^[^@]{1,64}@[^@]{1,255}$": 0.51,
    "^[a-z0-9-]{1,63}(\\.[a-z0-9-]{1,63}){0,4}$": 0.51,
    "[^x]{0,1000}": 0.47,
    "^[A-Za-z]{1,30}( [A-Za-z]{1,30}){0,5}$": 0.44,
    "(.{9}){9}": 0.39,
    "(.{0,9})*": 0.31,
    "a.{0,9}a.{0,9}a.{0,9}a.{0,9}a.{0,9}": 0.31,
    "^\\w{1,20}(\\.\\w{1,20}){0,3}@\\w{1,20}\\.\\w{2,6}$": 0.29,
    "(.{2}){0,40}": 0.23,
    "\\w{0,1000}": 0.11,
    "(.{0,3}){0,3}": 0.08,
    "([0-9a-f]{0,9}){0,9}": 0.04,
}


@pytest.mark.parametrize("pattern", sorted(SLOW))
def test_a_slow_pattern_of_a_broad_class_is_priced_over_the_bound(pattern: str) -> None:
    """`.`, negated classes and other broad ones priced by what they cost: variable runs
    of them that meet (nested or side by side) are ambiguous, each split a parse. Priced
    as a literal, `(.{0,9}){0,9}` was 81 and ran the compile worker to its kill."""
    message = refusal({"type": "string", "pattern": pattern})
    assert "grammar_max_pattern_repeat" in message


@pytest.mark.parametrize("pattern", sorted(FAST))
def test_a_fast_pattern_is_within_the_bound(pattern: str) -> None:
    passes({"type": "string", "pattern": pattern})


PATTERN_PIECES = st.sampled_from(
    ["a", "b", ".", "[^a]", "\\w", "\\d", "[a-z]", "[0-9]", "(", ")", "|", "?", "*", "+",
     "{0,3}", "{2}", "{1,9}", "{0,30}", "x"]
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(pieces=st.lists(PATTERN_PIECES, max_size=24), where=st.integers(0, 23))
def test_a_broad_class_never_prices_below_a_literal(pieces: list[str], where: int) -> None:
    """Replacing a literal by `.` or a negated class never lowers the price."""
    literal = [i for i, p in enumerate(pieces) if p in ("a", "b", "x")]
    if not literal:
        return
    i = literal[where % len(literal)]
    before = pattern_repeat("".join(pieces))
    for broad in (".", "[^a]"):
        after = pattern_repeat("".join([*pieces[:i], broad, *pieces[i + 1 :]]))
        assert after >= before, (pieces, i, broad)


def test_the_nested_quantifier_bomb_is_refused_naming_the_limit() -> None:
    message = refusal({"type": "string", "pattern": BOMB})
    assert "grammar_max_pattern_repeat" in message and "27000" in message


def test_many_moderate_patterns_are_refused_in_all() -> None:
    props = {f"p{i}": {"type": "string", "pattern": "[a-z]{0,900}"} for i in range(12)}
    message = refusal({"type": "object", "properties": props})
    assert "in all" in message and "grammar_max_pattern_repeat" in message


def test_pattern_properties_keys_count_as_patterns() -> None:
    message = refusal({"type": "object", "patternProperties": {BOMB: {"type": "string"}}})
    assert "grammar_max_pattern_repeat" in message


def test_a_huge_enum_is_refused_by_count_and_by_bytes() -> None:
    many = {"type": "string", "enum": [f"v{i}" for i in range(LIMITS.max_enum_values + 1)]}
    assert "grammar_max_enum_values" in refusal(many)
    long = {"type": "string", "enum": ["x" * 1000] * 70}  # 70 KB, few values
    assert "grammar_max_schema_bytes" in refusal(long)


def test_enum_values_across_the_schema_are_counted_together() -> None:
    half = [f"v{i}" for i in range(LIMITS.max_enum_values // 2 + 1)]
    schema = {"type": "object", "properties": {"a": {"enum": half}, "b": {"enum": half}}}
    assert "grammar_max_enum_values" in refusal(schema)


def test_deep_nesting_is_refused_naming_the_limit() -> None:
    schema: dict = {"type": "string"}
    for _ in range(LIMITS.max_depth):
        schema = {"type": "array", "items": schema}
    assert "grammar_max_schema_depth" in refusal(schema)


@pytest.mark.parametrize("keyword", sorted(IGNORED_KEYWORDS))
def test_keywords_xgrammar_ignores_are_refused_by_name(keyword: str) -> None:
    schema = {"type": "object", "properties": {"a": {"type": "string", keyword: {}}}}
    message = refusal(schema)
    assert repr(keyword) in message and "#/properties/a" in message


@pytest.mark.parametrize(
    ("schema", "named"),
    [
        ({"type": "number", "multipleOf": 0.5}, "multipleOf"),
        ({"type": "number", "multipleOf": 2}, "multipleOf"),
        ({"type": "string", "format": "idn-email"}, "idn-email"),
        ({"$ref": "http://example.com/s.json"}, "$ref"),
        ({"$defs": {"a": {"$anchor": "a"}}, "$ref": "#a"}, "$ref"),
        ({"allOf": [{"type": "integer"}, {"minimum": 5}]}, "allOf"),
        ({"type": "object", "allOf": [{"required": ["a"]}, {"type": "object"}]}, "allOf"),
    ],
)
def test_partly_supported_keywords_are_refused_where_ignored(schema: dict, named: str) -> None:
    assert named in refusal(schema)


@pytest.mark.parametrize(
    "schema",
    [
        # Names and data that look like keywords are not schema keywords.
        {"type": "object", "properties": {"not": {"type": "string"}, "if": {"const": "else"}}},
        {"enum": [{"not": 1}, {"pattern": BOMB}]},
        {"type": "integer", "multipleOf": 3},
        {"type": "string", "format": "date-time"},
        {"$defs": {"a": {"type": "string"}}, "$ref": "#/$defs/a"},
        {"type": "object", "properties": {"a": {"$ref": "#"}}},
        {"allOf": [{"type": "string", "maxLength": 2}]},
        {
            "allOf": [{"type": "object", "properties": {"a": {}}}, {"$ref": "#/$defs/b"}],
            "$defs": {"b": {"type": "object"}},
        },  # fmt: skip
        {"type": "string", "pattern": "[a-z]{1,64}", "description": "x" * 1000},
    ],
)
def test_supported_schemas_pass(schema: dict) -> None:
    passes(schema)


@given(st.text(max_size=200))
def test_pattern_repeat_takes_any_text(pattern: str) -> None:
    assert pattern_repeat(pattern) >= 0


def test_xgrammar_errors_lose_their_build_paths() -> None:
    import xgrammar as xgr

    with pytest.raises(RuntimeError) as info:
        xgr.Grammar.from_json_schema('{"type": "nonsense"}')
    assert ".cc:" in str(info.value)  # what xgrammar says: a path of its build machine
    cleaned = clean_xgrammar_error(info.value)
    assert cleaned == 'Unsupported type "nonsense"'


# ---- the gate, with real child processes ----


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.run_until_complete(asyncio.sleep(0.5))  # let killed compiler processes be reaped
    loop.close()


@pytest.fixture(scope="module")
def gate(tok: Tokenizer, loop) -> Iterator[GrammarGate]:
    gate = gate_for(Settings(grammar_compile_timeout_seconds=30.0), tok)
    yield gate
    gate.close()


def check(loop, gate: GrammarGate, schema: object) -> RequestError | None:
    try:
        loop.run_until_complete(gate.check(GuidedDecoding("json_schema", json.dumps(schema))))
    except RequestError as exc:
        return exc
    return None


def test_a_compile_that_overruns_is_killed_refused_and_cached(tok, loop) -> None:
    # Static bounds lifted, so the bomb reaches a compiler process and overruns its limit.
    gate = gate_for(Settings(grammar_compile_timeout_seconds=2.0), tok)
    gate.limits = SchemaLimits(10**9, 32, 10**9, 10**9)
    pool = gate._pool
    try:
        refused = check(loop, gate, {"type": "string", "pattern": BOMB})
        assert refused is not None and refused.status == 400
        assert "grammar_compile_timeout_seconds" in refused.message
        assert (gate.compiles, pool.killed) == (1, 1)
        # Asked again: the cached refusal, no compile.
        again = check(loop, gate, {"type": "string", "pattern": BOMB})
        assert again is not None and again.message == refused.message
        assert gate.compiles == 1
        # A replacement process, started at the kill, serves the next schema.
        assert pool._refill is not None
        assert check(loop, gate, {"type": "integer"}) is None
        assert (gate.compiles, pool.killed, pool.started) == (2, 1, 2)
    finally:
        gate.close()


def test_concurrent_requests_for_one_schema_share_one_compile(gate, loop) -> None:
    schema = json.dumps({"type": "object", "properties": {"shared": {"type": "integer"}}})
    before = gate.compiles

    async def many() -> list:
        guided = GuidedDecoding("json_schema", schema)
        return await asyncio.gather(*(gate.check(guided) for _ in range(5)))

    assert loop.run_until_complete(many()) == [None] * 5
    assert gate.compiles == before + 1


def test_a_schema_xgrammar_refuses_is_a_400_without_paths(gate, loop) -> None:
    refused = check(loop, gate, {"type": "nonsense"})
    assert refused is not None and refused.status == 400
    assert refused.message == 'response_format: cannot use this schema: Unsupported type "nonsense"'


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.floats(allow_nan=False) | st.text(),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(
            st.sampled_from(
                [
                    "type",
                    "properties",
                    "items",
                    "enum",
                    "const",
                    "pattern",
                    "required",
                    "anyOf",
                    "$ref",
                    "$defs",
                    "minItems",
                    "maxLength",
                    "format",
                    "additionalProperties",
                    "prefixItems",
                    "minimum",
                    "not",
                    "x",
                ]  # fmt: skip
            )
            | st.text(max_size=5),
            children,
            max_size=4,
        )
    ),
    max_leaves=12,
)
TYPES = st.sampled_from(["object", "array", "string", "integer", "number", "boolean", "null"])
SCHEMAS = st.dictionaries(st.just("type"), TYPES) | st.dictionaries(
    st.sampled_from(["type", "properties", "items", "enum", "pattern", "anyOf", "x"]),
    JSON,
    max_size=4,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schema=SCHEMAS)
def test_any_json_as_a_schema_is_accepted_or_a_400_and_accepted_ones_compile(
    gate, loop, tok, schema
) -> None:
    refused = check(loop, gate, schema)
    if refused is not None:
        assert refused.status == 400 and refused.message.startswith("response_format: ")
        assert ".cc:" not in refused.message
        return
    # What the gate lets through, the engine's decoder compiles (the same call).
    decoder = _decoder(tok)
    decoder.compile(GuidedDecoding("json_schema", json.dumps(schema)))


_DECODERS: dict[int, GuidedDecoder] = {}


def _decoder(tok: Tokenizer) -> GuidedDecoder:
    return _DECODERS.setdefault(id(tok), GuidedDecoder(tok))


# ---- the engine-side decoder ----


def enum_schema(i: int) -> GuidedDecoding:
    values = [f"schema{i}-value{j}" for j in range(300)]
    return GuidedDecoding("json_schema", json.dumps({"type": "string", "enum": values}))


def test_the_compiled_grammar_cache_is_bounded(tok) -> None:
    limit = 150_000
    decoder = GuidedDecoder(tok, cache_limit_bytes=limit)
    sizes = [decoder.compile(enum_schema(i)).memory_size_bytes for i in range(12)]
    assert sum(sizes) > 2 * limit  # unbounded, the cache would hold all of them
    assert 0 < decoder.cache_bytes() <= limit


def test_without_the_bound_the_cache_keeps_every_grammar(tok) -> None:
    # The control for the test above: with room for all, all of them stay.
    decoder = GuidedDecoder(tok, cache_limit_bytes=10**12)
    sizes = [decoder.compile(enum_schema(100 + i)).memory_size_bytes for i in range(6)]
    assert decoder.cache_bytes() >= 0.9 * sum(sizes)


def test_matcher_later_hands_back_the_error_on_its_own_thread(tok) -> None:
    import threading

    decoder = GuidedDecoder(tok)
    got: list[tuple[object, str]] = []
    done = threading.Event()

    def record(result: object) -> None:
        got.append((result, threading.current_thread().name))
        done.set()

    decoder.matcher_later(GuidedDecoding("json_schema", '{"type": "nonsense"}'), record)
    assert done.wait(60)
    (result, thread), = got  # fmt: skip
    assert isinstance(result, EngineRequestError) and ".cc:" not in str(result)
    assert thread.startswith("grammar-compile")
