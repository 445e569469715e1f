"""The README's "Works with" table: tool -> (pinned requirement, command). Tests run each
command as written there, with the port and paths made local, so the table stays true."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

TESTS = Path(__file__).resolve().parent
README = TESTS.parent / "README.md"
README_URL = "http://127.0.0.1:8080"  # what the commands name: `make serve`'s port


@dataclass(frozen=True)
class Row:
    package: str
    version: str
    command: str

    def local(self, url: str) -> str:
        """The command aimed at a test server instead of `make serve`."""
        return self.command.replace(README_URL, url)


def rows() -> dict[str, Row]:
    text = README.read_text(encoding="utf-8")
    section = text.split("### Works with", 1)[1].split("\n#", 1)[0]
    out = {}
    for line in section.splitlines():
        m = re.fullmatch(r"\| ([^|`]+) \| `([\w.-]+)==([\w.]+)` \| `([^`]+)` \|", line)
        if m:
            out[m.group(1)] = Row(m.group(2), m.group(3), m.group(4))
    return out


def runners(tests: Path = TESTS) -> dict[str, set[Path]]:
    """Which test files run which row: every `rows()["<tool>"]` in tests/ (this module and
    the unit tests, which only read the table, aside)."""
    found: dict[str, set[Path]] = {}
    for path in sorted(tests.rglob("test_*.py")):
        if path.parent.name == "unit":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Subscript)
                and isinstance(node.value, ast.Call)
                and isinstance(node.value.func, ast.Name)
                and node.value.func.id == "rows"
                and isinstance(node.slice, ast.Constant)
                and isinstance(node.slice.value, str)
            ):
                found.setdefault(node.slice.value, set()).add(path)
    return found
