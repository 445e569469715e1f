"""The llm-d router's configuration schema, read from its own Go types (vendored verbatim in
tests/data/router/<release>/): the router decodes its EndpointPickerConfig and each plugin's
parameters strictly (unknown fields are a start-up failure), so the field names and nesting
of those structs are the schema our rendered config must satisfy.

A deliberately small reader: `type X struct { ... }` blocks (also inside `type ( ... )`
groups), one field a line, `json:"name,..."` tags; an inline (`json:",inline"`) or untagged
field adds nothing. A field's type is followed when it names another struct of the set."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROUTER_DATA = Path(__file__).resolve().parent / "data" / "router"

_STRUCT = re.compile(r"^\s*(?:type\s+)?(\w+)\s+struct\s*\{\s*$")
_FIELD = re.compile(r"^\s*(\w+)\s+([\[\]\*\w.]+)\s+`[^`]*json:\"([^\",]*)[^`]*`")


@dataclass(frozen=True)
class Field:
    name: str  # the JSON key
    go_type: str  # the element type: []X and *X are X
    is_list: bool


def parse_structs(source: str) -> dict[str, dict[str, Field]]:
    """struct name -> {json key: Field} for every struct declared in `source`."""
    structs: dict[str, dict[str, Field]] = {}
    current: str | None = None
    depth = 0
    for line in source.splitlines():
        if current is None:
            match = _STRUCT.match(line)
            if match:
                current, depth = match.group(1), 1
                structs[current] = {}
            continue
        depth += line.count("{") - line.count("}")
        if depth <= 0:
            current = None
            continue
        field = _FIELD.match(line)
        if field and depth == 1 and field.group(3):
            go_type = field.group(2)
            structs[current][field.group(3)] = Field(
                field.group(3), go_type.lstrip("[]*"), go_type.startswith("[]")
            )
    return structs


def load_structs(release: str) -> dict[str, dict[str, Field]]:
    structs: dict[str, dict[str, Field]] = {}
    for path in sorted((ROUTER_DATA / release).glob("*.go")):
        structs |= parse_structs(path.read_text())
    return structs


def unknown_fields(value: Any, struct: str, structs: dict[str, dict[str, Field]]) -> list[str]:
    """Paths in `value` (decoded YAML) that the struct and its nested structs do not have."""
    problems: list[str] = []
    if not isinstance(value, dict):
        return [f"{struct}: expected an object, got {type(value).__name__}"]
    fields = structs[struct]
    for key, item in value.items():
        if key not in fields:
            problems.append(f"{struct}.{key}")
            continue
        field = fields[key]
        if field.go_type not in structs:
            continue  # a scalar, a duration or quantity, raw parameters: not followed
        items = item if field.is_list and isinstance(item, list) else [item]
        for sub in items:
            problems += unknown_fields(sub, field.go_type, structs)
    return problems
