"""The README's examples are true: every `$ ` command in it runs against the real Truss
server serving what `make serve` serves (SmolLM2, same name), and prints what the README
says it prints (`…` stands for ids, times and paths). The Python example runs too."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.readme_blocks import code_blocks

pytestmark = pytest.mark.e2e

README = Path(__file__).resolve().parents[2] / "README.md"
SERVED_NAME = "smollm2-135m-instruct"  # what `make serve` names it (Makefile)


def examples(text: str) -> list[tuple[str, str]]:
    """(command, expected output) for each `$ ` line of the README's code blocks."""
    found = []
    for _, lines in code_blocks(text):
        for i, line in enumerate(lines):
            if line.startswith("$ "):
                out = []
                for nxt in lines[i + 1 :]:
                    if nxt.startswith("$ ") or not nxt.strip():
                        break
                    out.append(nxt)
                found.append((line[2:], "\n".join(out)))
    return found


def python_example(text: str) -> tuple[str, str]:
    code = next("\n".join(lines) for language, lines in code_blocks(text) if language == "python")
    expected = code.rstrip().splitlines()[-1].removeprefix("# ")
    return code, expected


def matches(expected: str, actual: str) -> bool:
    pattern = ".*?".join(re.escape(part) for part in expected.split("…"))
    return re.fullmatch(pattern, actual.strip(), re.S) is not None


def test_the_readme_has_examples_and_the_matcher_can_fail() -> None:
    assert len(examples(README.read_text())) >= 6
    assert matches('{"id":"…","n":1}', '{"id":"abc","n":1}')
    assert not matches('{"id":"…","n":1}', '{"id":"abc","n":2}')


@pytest.mark.parametrize(
    ("command", "expected"), examples(README.read_text()), ids=lambda v: v[:60]
)
def test_each_readme_command_prints_what_the_readme_says(
    smollm2_url: str, command: str, expected: str
) -> None:
    port = smollm2_url.rsplit(":", 1)[1]
    run = subprocess.run(
        command.replace("localhost:8080", f"127.0.0.1:{port}"),
        shell=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    assert matches(expected, run.stdout), f"README says:\n{expected}\ngot:\n{run.stdout}"


def test_the_readme_python_example_prints_what_it_says(smollm2_url: str) -> None:
    code, expected = python_example(README.read_text())
    code = code.replace("http://127.0.0.1:8080", smollm2_url)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == expected
