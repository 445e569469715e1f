"""The structured-output schema suite: real-world JSON schemas from public sources
(bench/schemas/, each file's repository, path and commit in bench/schemas/SOURCES.md), with
the verdict the server gives each one, recorded in bench/schemas/suite.json:

- `accepted`: it passes the gate's static bounds at the default settings
  (`structured/grammar.py` check_schema) and compiles with xgrammar as the server compiles
  it (the engines' `GuidedDecoder`, the dev model's 32,000-token vocabulary);
- `refused` at `static` (a bound or a keyword the server refuses, with the message a client
  gets) or at `compile` (xgrammar refuses it: the gate's compile answers a 400 the same);
- and, for an accepted one, `as_tool`: the verdict on it as one function's parameters with
  tool_choice=required ("accepted", or why not: a tool's parameters must be an object).

    python bench/schema_suite.py            # check every verdict against suite.json
    python bench/schema_suite.py --write    # record them (after adding a schema)

The benchmark (`bench/gpu/structured.py`, `gpu_bench.py service --suite`) sends each
accepted schema as `response_format` and as a forced tool's parameters.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SUITE = ROOT / "bench" / "schemas"
MANIFEST = SUITE / "suite.json"
sys.path[:0] = [str(ROOT), str(ROOT / "mistral-trt-truss" / "packages")]

FEATURES = ("nested objects", "unbounded arrays", "maxLength", "enum", "anyOf", "$ref", "pattern")


def _nodes(schema: Any) -> Iterator[tuple[dict, int]]:
    """Every subschema (a dict) with its depth in objects; data keywords are not walked."""
    todo: list[tuple[Any, int]] = [(schema, 0)]
    while todo:
        node, depth = todo.pop()
        if isinstance(node, list):
            todo.extend((item, depth) for item in node)
        elif isinstance(node, dict):
            yield node, depth
            for key, value in node.items():
                if key not in ("enum", "const", "default", "examples"):
                    todo.append((value, depth + (key == "properties")))


def features(schema: Any) -> list[str]:
    """Which of FEATURES the schema uses."""
    found = set()
    for node, depth in _nodes(schema):
        if depth >= 1 and (node.get("type") == "object" or "properties" in node):
            found.add("nested objects")
        if (node.get("type") == "array" or "items" in node) and "maxItems" not in node:
            found.add("unbounded arrays")
        found.update(k for k in ("maxLength", "enum", "$ref", "pattern") if k in node)
        if "anyOf" in node or "oneOf" in node:
            found.add("anyOf")
    return [f for f in FEATURES if f in found]


def verdict(text: str, decoder: Any) -> dict:
    """The server's verdict on one schema: the gate's static check, then the compile."""
    from mistral_serving.errors import RequestError
    from mistral_serving.settings import Settings
    from mistral_serving.structured.constraint import GuidedDecoding
    from mistral_serving.structured.grammar import SchemaLimits, check_schema

    limits = SchemaLimits.from_settings(Settings())
    try:
        check_schema(json.loads(text), len(text.encode()), limits)
    except RequestError as exc:
        return {"verdict": "refused", "stage": "static", "reason": exc.message}
    started = time.perf_counter()
    try:
        decoder.compile(GuidedDecoding("json_schema", text))
    except Exception as exc:  # noqa: BLE001 - EngineRequestError: the schema's refusal
        return {"verdict": "refused", "stage": "compile", "reason": str(exc)}
    return {"verdict": "accepted", "compile_s": round(time.perf_counter() - started, 3)}


def tool_verdict(text: str, decoder: Any) -> str:
    """The server's verdict on the schema as one function's parameters with
    tool_choice=required: "accepted" or the refusal's message."""
    from mistral_serving.errors import RequestError
    from mistral_serving.settings import Settings
    from mistral_serving.structured.grammar import SchemaLimits, check_schema, tool_call_grammar
    from mistral_serving.tools.tool_calls import parse_tool_request

    function = {"name": "record", "parameters": json.loads(text)}
    try:
        request = parse_tool_request(
            {"tools": [{"type": "function", "function": function}], "tool_choice": "required"}
        )
        grammar = tool_call_grammar(request)
        assert grammar.json_schema is not None
        limits = SchemaLimits.from_settings(Settings())
        check_schema(json.loads(grammar.json_schema), len(grammar.json_schema.encode()), limits)
        decoder.compile(grammar)
    except RequestError as exc:
        return exc.message
    except Exception as exc:  # noqa: BLE001 - EngineRequestError: the compile's refusal
        return str(exc)
    return "accepted"


def entries() -> list[dict]:
    """suite.json's schemas: file, source, verdict (and features)."""
    return list(json.loads(MANIFEST.read_text())["schemas"])


def accepted() -> list[tuple[dict, str]]:
    """(entry, schema text) of every accepted schema, in the manifest's order (its
    `as_tool`: the verdict on it as a forced tool's parameters)."""
    return [(e, (SUITE / e["file"]).read_text()) for e in entries() if e["verdict"] == "accepted"]


def check(write: bool, tokenizer_dir: Path) -> int:
    from mistral_serving.engines.pytorch.guided import GuidedDecoder
    from mistral_serving.text.tokenizer import load_tokenizer

    decoder = GuidedDecoder(load_tokenizer(tokenizer_dir), cache_limit_bytes=0)
    manifest = json.loads(MANIFEST.read_text())
    wrong = 0
    for entry in manifest["schemas"]:
        text = (SUITE / entry["file"]).read_text()
        got = verdict(text, decoder) | {"features": features(json.loads(text))}
        if got["verdict"] == "accepted":
            got["as_tool"] = tool_verdict(text, decoder)
        compile_s = got.pop("compile_s", None)
        same = all(entry.get(k) == v for k, v in got.items())
        wrong += not same
        shown = got.get("reason", f"compiles in {compile_s} s")[:90]
        print(f"{'ok ' if same else 'NEW'} {entry['file']:48} {got['verdict']:8} {shown}")
        if write:
            entry.update(got)
            if got["verdict"] == "accepted":
                entry.pop("stage", None)
                entry.pop("reason", None)
    counts = [e["verdict"] for e in manifest["schemas"]]
    print(f"{counts.count('accepted')} accepted, {counts.count('refused')} refused")
    if write:
        MANIFEST.write_text(json.dumps(manifest, indent=1) + "\n")
        write_sources(manifest["schemas"])
        return 0
    return 1 if wrong else 0


def write_sources(schemas: list[dict]) -> None:
    """SOURCES.md's table (its text above the table is kept)."""
    path = SUITE / "SOURCES.md"
    head = path.read_text().split("| file |")[0]
    rows = ["| file | repository | path | commit | verdict | as a tool's parameters | features |",
            "|---|---|---|---|---|---|---|"]  # fmt: skip
    for e in schemas:
        said = e.get("reason", "").removeprefix("response_format: ")
        v = "accepted" if e["verdict"] == "accepted" else f"refused ({e['stage']}): {said}"
        tool = e.get("as_tool", "-").removeprefix("response_format: ")
        rows.append(f"| `{e['file']}` | {e['repo']} | `{e['path']}` | `{e['commit']}` | {v} "
                    f"| {tool} | {', '.join(e['features']) or '-'} |")  # fmt: skip
    path.write_text(head + "\n".join(rows) + "\n")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--write", action="store_true", help="record the verdicts in suite.json")
    p.add_argument("--tokenizer", type=Path, default=ROOT / ".cache" / "dev-model")
    args = p.parse_args()
    logging.getLogger().setLevel(
        logging.ERROR
    )  # the refused schemas' warnings: the verdicts say it
    return check(args.write, args.tokenizer)


if __name__ == "__main__":
    raise SystemExit(main())
