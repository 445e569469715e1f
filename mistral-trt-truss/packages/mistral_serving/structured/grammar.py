"""Structured output's gate: every `response_format` schema is checked here, in the
service, before any engine sees the request (PyTorch, engine process, TensorRT-LLM alike).

1. Static bounds, in microseconds, on the event loop: the schema's size, nesting depth,
   enum/const values, and the cost of its regular expressions (`pattern_repeat`); and the
   keywords xgrammar 0.2.9 silently ignores (its output would then fail the schema), which
   are refused by name.
2. A compile of the schema in a separate process (`grammar_pool.CompilePool`), with a time
   limit: a compile cannot be interrupted inside xgrammar's C++, so the process that runs
   one too long is killed and replaced. Only a schema proven to compile within the limit
   reaches the engine.

Both verdicts are cached by the schema's hash (refusals included), so a repeated schema
costs a dictionary lookup. Figures behind the defaults: docs/reliability.md.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import json
import logging
import re
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

from prometheus_client.metrics_core import Metric

from mistral_serving.errors import RequestError
from mistral_serving.settings import Settings
from mistral_serving.structured.constraint import GuidedDecoding
from mistral_serving.tools.tool_calls import ToolRequest

log = logging.getLogger(__name__)

PARAM = "response_format"
# Verdicts kept (a 32-byte key and at most a short message each: well under 2 MB).
VERDICT_CACHE_ENTRIES = 4096
# Distinct schemas that may wait for a compile per worker (each compile may take the whole
# grammar_compile_timeout_seconds); more at once get 429.
PENDING_PER_WORKER = 4
# The whole schema may spend this many times one pattern's bound (xgrammar compiles each).
PATTERN_TOTAL_FACTOR = 10
_SATURATE = 10**12

# Keywords xgrammar 0.2.9 accepts and ignores (measured: a grammar built with them accepts
# an instance that violates them). Refused so the output never silently fails the schema.
IGNORED_KEYWORDS = frozenset(
    {
        "not",
        "if",
        "then",
        "else",
        "contains",
        "minContains",
        "maxContains",
        "$dynamicRef",
        "$dynamicAnchor",
        "$recursiveRef",
        "$recursiveAnchor",
    }
)
# `format` values xgrammar 0.2.9 enforces (others are ignored).
SUPPORTED_FORMATS = frozenset(
    {
        "email",
        "uuid",
        "date-time",
        "date",
        "time",
        "duration",
        "ipv4",
        "ipv6",
        "uri",
        "uri-reference",
        "uri-template",
        "hostname",
        "json-pointer",
        "relative-json-pointer",
    }
)
# Where subschemas sit: one schema, a list of schemas, or a name -> schema map. Anything
# else (enum, const, default, examples, ...) is data and is not walked as a schema.
_ONE = ("items", "additionalProperties", "propertyNames", "unevaluatedProperties",
        "unevaluatedItems", "additionalItems", "not", "if", "then", "else", "contains")  # fmt: skip
_LIST = ("prefixItems", "allOf", "anyOf", "oneOf")
_MAP = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


@dataclass(frozen=True)
class SchemaLimits:
    max_bytes: int
    max_depth: int
    max_enum_values: int
    max_pattern_repeat: int

    @classmethod
    def from_settings(cls, settings: Settings) -> SchemaLimits:
        return cls(
            settings.grammar_max_schema_bytes,
            settings.grammar_max_schema_depth,
            settings.grammar_max_enum_values,
            settings.grammar_max_pattern_repeat,
        )


# A pattern's price counts what xgrammar expands it to (`pattern_repeat`). Measured with
# xgrammar 0.2.9 and the Mistral vocabulary (docs/reliability.md): each expanded atom
# costs about 0.1-5 ms of compile; but where variable-length runs of a broad class (`.`,
# a negated class, `\w`, `[a-z]`, ...) meet with nothing fixed between them
# (`.{0,9}.{0,9}`, `(.{0,9}){0,9}`) every split of the text between them is a parse, and
# a 118-byte pattern took minutes. Such overlap is priced AMBIGUITY_WEIGHT per unit.
AMBIGUITY_WEIGHT = 16
# A character class matching at least this many characters is broad (most of a
# vocabulary's word pieces fit it): `[a-z]` is, `[0-9a-f]` is not.
BROAD_CLASS_CHARS = 20
_BROAD_ESCAPES = frozenset("wWSDpP")


@dataclass
class _Piece:
    """One element of a pattern, priced: `size` atoms when expanded, `overlap` the
    ambiguity inside it; `run` (atoms, runs) when it is a variable-length run of a broad
    class, which merges with its neighbours'; `fixed` when it holds a mandatory narrow
    atom, which ends such runs; `broad` when it matches a broad class."""

    size: int
    overlap: int = 0
    run: tuple[int, int] | None = None
    fixed: bool = False
    broad: bool = False


def _sat(value: int) -> int:
    return min(value, _SATURATE)


def _closed(atoms: int, runs: int) -> int:
    """The overlap of `runs` merged runs of `atoms` atoms in all."""
    return _sat(atoms * max(runs - 1, 0))


def _summary(pieces: list[_Piece]) -> _Piece:
    """A sequence of pieces as one: adjacent runs merge (a fixed piece ends them); a
    sequence without a fixed piece stays a run, which may merge further out."""
    if len(pieces) == 1:
        return pieces[0]
    size = overlap = atoms = runs = 0
    fixed = broad = False
    for piece in pieces:
        size, overlap = _sat(size + piece.size), _sat(overlap + piece.overlap)
        broad = broad or piece.broad
        if piece.run is not None:
            atoms, runs = _sat(atoms + piece.run[0]), _sat(runs + piece.run[1])
        elif piece.fixed:
            fixed = True
            overlap = _sat(overlap + _closed(atoms, runs))
            atoms = runs = 0
        elif piece.broad:
            atoms = _sat(atoms + piece.size)  # a fixed-length broad piece lengthens a run
    if runs and not fixed:
        return _Piece(size, overlap, (atoms, runs), broad=True)
    return _Piece(size, _sat(overlap + _closed(atoms, runs)), fixed=fixed, broad=broad)


def _alternatives(alts: list[list[_Piece]]) -> _Piece:
    parts = [_summary(a) for a in alts]
    if len(parts) == 1:
        return parts[0]
    size = overlap = 0
    for part in parts:
        size = _sat(size + part.size)
        overlap = _sat(overlap + part.overlap + _closed(*(part.run or (0, 0))))
    fixed = all(p.fixed for p in parts)
    return _Piece(size, overlap, fixed=fixed, broad=any(p.broad for p in parts))


def _repeat(piece: _Piece, low: int, high: int | None) -> _Piece:
    """`piece` under a quantifier: `{m,n}` copies it max(m, n) times; None is a loop
    (`*`, `+`: one copy, which xgrammar does not expand)."""
    if high is None:
        overlap = _sat(piece.overlap + _closed(*(piece.run or (0, 0))))
        return _Piece(piece.size, overlap, broad=piece.broad)
    times = max(low, high, 1)
    size, overlap = _sat(piece.size * times), _sat(piece.overlap * times)
    if piece.run is not None:  # every copy is variable: they all merge
        run = (_sat(piece.run[0] * times), _sat(piece.run[1] * times))
        return _Piece(size, overlap, run, broad=True)
    if piece.broad and not piece.fixed and high != low:
        return _Piece(size, overlap, (size, 1), broad=True)
    return _Piece(size, overlap, fixed=piece.fixed and low > 0, broad=piece.broad)


def _class_is_broad(body: str) -> bool:
    """A `[...]` class's body (after `[`/`[^`, before `]`): broad when it holds a broad
    escape or spans BROAD_CLASS_CHARS characters or more."""
    count, i, n = 0, 0, len(body)
    while i < n:
        c = body[i]
        if c == "\\" and i + 1 < n:
            if body[i + 1] in _BROAD_ESCAPES:
                return True
            count, i = count + (10 if body[i + 1] == "d" else 1), i + 2
            continue
        if i + 2 < n and body[i + 1] == "-" and body[i + 2] != "\\":
            count += max(ord(body[i + 2]) - ord(c) + 1, 1)
            i += 3
            continue
        count, i = count + 1, i + 1
    return count >= BROAD_CLASS_CHARS


# A pattern's parse, one frame per open group: its finished alternatives and the current
# one's pieces.
_Frames = list[tuple[list[list[_Piece]], list[_Piece]]]


def _read_class(pattern: str, i: int) -> tuple[_Piece, int]:
    """The `[...]` class that starts at `pattern[i]`, priced, and where it ends."""
    n = len(pattern)
    j = i + 1
    negated = j < n and pattern[j] == "^"
    if negated:
        j += 1
    start = j
    if j < n and pattern[j] == "]":
        j += 1
    while j < n and pattern[j] != "]":
        j += 2 if pattern[j] == "\\" else 1
    broad = negated or _class_is_broad(pattern[start:j])
    return _Piece(1, fixed=not broad, broad=broad), j + 1


def _close_group(stack: _Frames) -> None:
    """End the innermost group: its alternatives become one piece of the group around it."""
    done_alts, done_cur = stack.pop()
    stack[-1][1].append(_alternatives([*done_alts, done_cur]))


def pattern_repeat(pattern: str) -> int:
    """The price of `pattern` in xgrammar's regex compiler, as an upper bound: the atoms it
    expands to (a bounded repetition `{m,n}` copies what it repeats max(m, n) times, so
    nested ones multiply: `((a{0,30}){0,30}){0,30}` is 27,000; `*`, `+` and `?` cost
    nothing extra; every alternative counts), or AMBIGUITY_WEIGHT x the overlap of its
    variable-length broad runs (`(.{0,9}){0,9}` is 81 atoms in 9 runs: 16 x 81 x 8),
    whichever is more."""
    stack: _Frames = [([], [])]
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        alts, cur = stack[-1]
        if c == "\\":
            broad = i + 1 < n and pattern[i + 1] in _BROAD_ESCAPES
            cur.append(_Piece(1, fixed=not broad, broad=broad))
            i += 2
            continue
        if c == "[":
            piece, i = _read_class(pattern, i)
            cur.append(piece)
            continue
        if c == "(":
            stack.append(([], []))
            if pattern.startswith("?", i + 1):  # (?:...), (?=...): a group all the same
                i += 2 if i + 2 < n and pattern[i + 2] not in ":=!<" else 3
                continue
        elif c == ")":
            if len(stack) > 1:
                _close_group(stack)
        elif c == "|":
            alts.append(cur)
            stack[-1] = (alts, [])
        elif c == "{":
            m = re.match(r"\{(\d{1,9})(,(\d{0,9}))?\}", pattern[i:])
            if m is not None:
                low = int(m.group(1))
                high = low if m.group(2) is None else (int(m.group(3)) if m.group(3) else low + 1)
                if cur:
                    cur[-1] = _repeat(cur[-1], low, high)
                i += m.end()
                continue
            cur.append(_Piece(1, fixed=True))
        elif c in "*+?":
            if cur:
                cur[-1] = _repeat(cur[-1], 0, 1) if c == "?" else _repeat(cur[-1], 0, None)
        elif c == ".":
            cur.append(_Piece(1, broad=True))
        elif c not in "^$":
            cur.append(_Piece(1, fixed=True))
        i += 1
    while len(stack) > 1:  # unclosed groups: xgrammar refuses them; count them anyway
        _close_group(stack)
    total = _alternatives([*stack[0][0], stack[0][1]])
    run = total.run or (0, 0)
    overlap = _sat(total.overlap + run[0] * max(run[1] - 1, 0))
    return _sat(max(total.size, AMBIGUITY_WEIGHT * overlap))


def _depth(value: Any) -> int:
    """JSON nesting depth (a scalar is 0), without recursion."""
    deepest, todo = 0, [(value, 0)]
    while todo:
        node, d = todo.pop()
        if isinstance(node, dict):
            todo.extend((v, d + 1) for v in node.values())
        elif isinstance(node, list):
            todo.extend((v, d + 1) for v in node)
        else:
            continue
        deepest = max(deepest, d + 1)
    return deepest


def _refuse(message: str, param: str = PARAM) -> RequestError:
    return RequestError(f"{param}: {message}", param=param)


@dataclass(frozen=True)
class ToolCallGrammar(GuidedDecoding):
    """The grammar of `tool_choice` required / a named function: engines see a plain
    json_schema; the gate's refusals name `tools` instead of `response_format`."""

    param: ClassVar[str] = "tools"


# The most calls one constrained answer holds (parallel_tool_calls true): a bound, so that
# a model that keeps calling (a random-weight one does) ends its list.
MAX_PARALLEL_CALLS = 8


def tool_call_schema(request: ToolRequest) -> dict[str, Any]:
    """The JSON schema every constrained answer follows: a list of calls, each
    `{"name": <an offered function>, "arguments": <valid for its parameters>}`; exactly
    one call for a named function or with parallel_tool_calls false, else at most
    MAX_PARALLEL_CALLS. (vLLM constrains
    `required` the same way: `_get_json_schema_from_tool` in its OpenAI protocol.)"""
    offered: Sequence[Any] = [t for t in request.tools if request.forced in (None, t.name)]
    items = [
        {
            "type": "object",
            "properties": {
                "name": {"const": t.name},
                # Its local $refs ("#/$defs/x") named its own root; now they name its place.
                "arguments": _rebase_refs(t.parameters, _arguments_at(i, len(offered))),
            },
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for i, t in enumerate(offered)
    ]
    schema: dict[str, Any] = {
        "type": "array",
        "items": items[0] if len(items) == 1 else {"anyOf": items},
        "minItems": 1,
        "maxItems": 1 if request.forced is not None or not request.parallel else MAX_PARALLEL_CALLS,
    }
    return schema


def _arguments_at(index: int, tools: int) -> str:
    """The JSON pointer of tool `index`'s parameters in tool_call_schema's schema."""
    item = "#/items" if tools == 1 else f"#/items/anyOf/{index}"
    return item + "/properties/arguments"


def _rebase_refs(schema: Any, base: str) -> Any:
    """A copy of `schema` whose local references ("#", "#/...") point under `base`,
    walking subschemas where check_schema walks them (data such as enum is kept as is)."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#"):
        out["$ref"] = base + ref[1:]
    for key in _ONE:
        if key in schema:
            out[key] = _rebase_refs(schema[key], base)
    for key in (*_LIST, "items"):
        if isinstance(schema.get(key), list):
            out[key] = [_rebase_refs(s, base) for s in schema[key]]
    for key in _MAP:
        if isinstance(schema.get(key), dict):
            out[key] = {name: _rebase_refs(s, base) for name, s in schema[key].items()}
    return out


def tool_call_grammar(request: ToolRequest) -> ToolCallGrammar:
    return ToolCallGrammar("json_schema", json.dumps(tool_call_schema(request)))


def check_schema(schema: Any, size_bytes: int, limits: SchemaLimits) -> None:
    """Refuse (RequestError, a 400 naming the limit or keyword) a schema that exceeds the
    static bounds or uses a keyword xgrammar would ignore. Runs before any compile."""
    if size_bytes > limits.max_bytes:
        raise _refuse(
            f"the schema is {size_bytes} bytes; at most {limits.max_bytes} "
            "(grammar_max_schema_bytes)"
        )
    depth = _depth(schema)
    if depth > limits.max_depth:
        raise _refuse(
            f"the schema nests {depth} levels deep; at most {limits.max_depth} "
            "(grammar_max_schema_depth)"
        )
    enum_values = 0
    patterns = _PatternBudget(limits.max_pattern_repeat)
    todo: list[tuple[Any, str]] = [(schema, "#")]
    while todo:
        node, where = todo.pop()
        if not isinstance(node, dict):
            continue  # true/false (or a malformed subschema: the compile answers it)
        _check_keywords(node, where)
        for key in ("enum", "const"):
            if key in node:
                values = node[key]
                enum_values += len(values) if key == "enum" and isinstance(values, list) else 1
        if enum_values > limits.max_enum_values:
            raise _refuse(
                f"the schema has {enum_values} or more enum/const values; at most "
                f"{limits.max_enum_values} (grammar_max_enum_values)"
            )
        patterns.count(node.get("pattern"), f"{where}/pattern")
        if isinstance(node.get("patternProperties"), dict):
            for name in node["patternProperties"]:
                patterns.count(name, f"{where}/patternProperties")
        todo.extend(_subschemas(node, where))


def _check_keywords(node: dict[str, Any], where: str) -> None:
    """Refuse a keyword of one subschema (at `where`) that xgrammar ignores, or supports
    only in part."""
    for key in node:
        if key in IGNORED_KEYWORDS:
            raise _refuse(
                f"the schema keyword {key!r} (at {where}) is not supported by structured "
                "output: the output could not be held to it; remove it"
            )
    if "multipleOf" in node and not (
        node.get("type") == "integer" and isinstance(node["multipleOf"], int)
    ):
        raise _refuse(
            f"the schema keyword 'multipleOf' (at {where}) is supported only with "
            '"type": "integer" and an integer value'
        )
    members = node.get("allOf")
    if (
        isinstance(members, list)
        and len(members) > 1
        and not all(
            isinstance(m, dict) and (m.get("type") == "object" or "$ref" in m) for m in members
        )
    ):
        # xgrammar merges object members; of others it keeps one and drops the rest.
        raise _refuse(
            f"the schema keyword 'allOf' (at {where}) is supported with one subschema, or "
            'with subschemas that are all "type": "object" (or $refs)'
        )
    fmt = node.get("format")
    if isinstance(fmt, str) and fmt not in SUPPORTED_FORMATS:
        raise _refuse(
            f"the schema's format {fmt!r} (at {where}) is not supported by structured "
            f"output; supported: {', '.join(sorted(SUPPORTED_FORMATS))}"
        )
    ref = node.get("$ref")
    if isinstance(ref, str) and not (ref == "#" or ref.startswith("#/")):
        raise _refuse(
            f"the schema's $ref {ref[:80]!r} (at {where}) is not supported: only "
            'references inside the schema ("#/$defs/...") are'
        )


class _PatternBudget:
    """The price of a schema's patterns (`pattern_repeat`): each within
    grammar_max_pattern_repeat, all together within PATTERN_TOTAL_FACTOR times it."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.total_limit = limit * PATTERN_TOTAL_FACTOR
        self.total = 0

    def count(self, pattern: Any, where: str) -> None:
        if not isinstance(pattern, str):
            return  # xgrammar refuses it at compile
        cost = pattern_repeat(pattern)
        if cost > self.limit:
            raise _refuse(
                f"the pattern at {where} repeats {cost} times when expanded; at most "
                f"{self.limit} (grammar_max_pattern_repeat)"
            )
        self.total += cost
        if self.total > self.total_limit:
            raise _refuse(
                f"the schema's patterns repeat {self.total} times in all; at most "
                f"{self.total_limit} ({PATTERN_TOTAL_FACTOR} x grammar_max_pattern_repeat)"
            )


def _subschemas(node: dict[str, Any], where: str) -> list[tuple[Any, str]]:
    """A subschema's own subschemas, each with where it is (a name cut to 40 characters)."""
    found: list[tuple[Any, str]] = []
    for key in _ONE:
        if key in node:
            found.append((node[key], f"{where}/{key}"))
    for key in _LIST:
        items = node.get(key)
        if isinstance(items, list):
            found.extend((s, f"{where}/{key}/{i}") for i, s in enumerate(items))
    if isinstance(node.get("items"), list):  # draft-4 tuple form
        found.extend((s, f"{where}/items/{i}") for i, s in enumerate(node["items"]))
    for key in _MAP:
        table = node.get(key)
        if isinstance(table, dict):
            found.extend((sub, f"{where}/{key}/{str(name)[:40]}") for name, sub in table.items())
    return found


class _GrammarCollector:
    """The grammar figures on /metrics, read when scraped (no lock taken)."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.gates: weakref.WeakSet[GrammarGate] = weakref.WeakSet()
        self.decoders: weakref.WeakSet[Any] = weakref.WeakSet()

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        yield GaugeMetricFamily(
            self.prefix + "grammar_cache_bytes",
            "Memory of compiled grammars kept by the in-process engine (bounded by "
            "grammar_cache_bytes).",
            value=sum(d.cache_bytes() for d in list(self.decoders)),
        )
        gates = list(self.gates)
        yield CounterMetricFamily(
            self.prefix + "grammar_compiles",
            "response_format schemas compiled in the checking child process (cached "
            "verdicts are not counted).",
            value=sum(g.compiles for g in gates),
        )
        yield CounterMetricFamily(
            self.prefix + "grammar_compile_kills",
            "Grammar compiler processes killed (a compile overran its time limit or crashed).",
            value=sum(getattr(g._pool, "killed", 0) for g in gates),
        )


_COLLECTORS: dict[str, _GrammarCollector] = {}


def export_metrics(prefix: str, gate: GrammarGate, decoder: Any | None) -> None:
    """Put the gate's (and the in-process decoder's) figures on the default registry,
    registered once per prefix."""
    from prometheus_client import REGISTRY

    collector = _COLLECTORS.get(prefix)
    if collector is None:
        collector = _COLLECTORS[prefix] = _GrammarCollector(prefix)
        REGISTRY.register(collector)
    collector.gates.add(gate)
    if decoder is not None and hasattr(decoder, "cache_bytes"):
        collector.decoders.add(decoder)


def gate_for(settings: Settings, tokenizer: Any) -> GrammarGate:
    """The service's gate, its child processes started at the first schema."""
    from mistral_serving.structured.grammar_pool import CompilePool, Vocab

    pool = CompilePool(
        lambda: Vocab.of(tokenizer),
        settings.grammar_compile_workers,
        settings.grammar_compile_timeout_seconds,
    )
    return GrammarGate(settings, pool)


class GrammarGate:
    """The service's check of `response_format` schemas: static bounds, then a compile in a
    killable child process, each verdict cached. `check` raises RequestError (a 4xx)."""

    def __init__(self, settings: Settings, pool: Any) -> None:
        self.limits = SchemaLimits.from_settings(settings)
        self._pool = pool  # grammar_pool.CompilePool (or a stand-in with `async compile`)
        # sha256 of the schema -> None (compiles within the limit) or the refusal message.
        self._verdicts: collections.OrderedDict[bytes, str | None] = collections.OrderedDict()
        # Verdicts being reached: one task per schema, shared by every request that sends
        # it, and not cancelled when one of them goes away (the verdict is still cached).
        self._pending: dict[bytes, asyncio.Task[str | None]] = {}
        self.compiles = 0  # schemas sent to the pool (cached ones are not)
        # Distinct schemas compiling or waiting for a worker; more are refused (429).
        self.max_pending = PENDING_PER_WORKER * max(1, getattr(pool, "workers", 1))

    async def check(self, guided: GuidedDecoding) -> None:
        if guided.kind != "json_schema" or guided.json_schema is None:
            return  # json_object: one fixed grammar (xgrammar's builtin JSON), always cheap
        text = guided.json_schema
        param = getattr(guided, "param", PARAM)
        key = hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()
        if key in self._verdicts:
            self._verdicts.move_to_end(key)
            verdict = self._verdicts[key]
        elif (task := self._pending.get(key)) is not None:
            verdict = await asyncio.shield(task)
        elif (verdict := self._static_verdict(text)) is not None:
            self._remember(key, verdict)
        else:
            if len(self._pending) >= self.max_pending:
                # Each compile may take the whole time limit: a longer queue would hold
                # its requests (and their admission slots) for minutes.
                raise RequestError(
                    f"{param}: {len(self._pending)} other schemas are being compiled; retry later",
                    status=429,
                    param=param,
                    code="rate_limit_exceeded",
                    headers={"Retry-After": str(max(1, round(self._pool.timeout_s)))},
                )
            task = self._pending[key] = asyncio.ensure_future(self._judge(key, text))
            verdict = await asyncio.shield(task)
        if verdict is not None:
            raise _refuse(verdict, param)

    def _static_verdict(self, text: str) -> str | None:
        """The static bounds' refusal of `text`, or None (microseconds, on the loop)."""
        try:
            size = len(text.encode("utf-8", "surrogatepass"))
            check_schema(json.loads(text), size, self.limits)
        except RequestError as exc:
            return exc.message.removeprefix("response_format: ")
        return None

    async def _judge(self, key: bytes, text: str) -> str | None:
        """The compile's verdict, shared by every request that sends this schema and
        cached (refusals too) however many of them are still waiting."""
        try:
            self.compiles += 1
            verdict: str | None = await self._pool.compile(text)
            self._remember(key, verdict)  # a pool failure (an exception) is not remembered
            return verdict
        finally:
            del self._pending[key]

    def _remember(self, key: bytes, verdict: str | None) -> None:
        self._verdicts[key] = verdict
        while len(self._verdicts) > VERDICT_CACHE_ENTRIES:
            self._verdicts.popitem(last=False)

    def close(self) -> None:
        self._pool.close()
