"""The README's fenced code blocks, for the tests that keep its examples true."""

from __future__ import annotations

from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def code_blocks(text: str | None = None) -> list[tuple[str, list[str]]]:
    """(language, lines) of every fenced block, in order."""
    text = README.read_text() if text is None else text
    blocks: list[tuple[str, list[str]]] = []
    current: list[str] | None = None
    language = ""
    for line in text.splitlines():
        if line.startswith("```"):
            if current is None:
                language, current = line[3:].strip(), []
            else:
                blocks.append((language, current))
                current = None
        elif current is not None:
            current.append(line)
    return blocks
