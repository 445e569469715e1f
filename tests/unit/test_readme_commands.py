"""The README's commands that cannot run here (a GPU, a cluster, a long build) at least
exist as written: every `make` target, every `build.py` subcommand and option, every
`python -m client` option, and every file `kubectl` is pointed at. The `$ ` examples are
run for real against the server by tests/e2e/test_readme.py."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

from tests.readme_blocks import code_blocks

ROOT = Path(__file__).resolve().parents[2]
MAKEFILE = (ROOT / "Makefile").read_text()


def command_lines() -> list[str]:
    """Shell lines of the README's plain code blocks (not `$ ` examples, not output)."""
    lines = []
    for language, block in code_blocks():
        if language:
            continue  # python, yaml, ...
        for line in block:
            line = line.split("  #")[0].strip()
            if line.startswith(("make ", "python ", "kubectl ", "cp ", "kubernetes-validate")):
                lines.append(line)
    return lines


@cache
def help_text(*argv: str) -> str:
    run = subprocess.run(
        [sys.executable, *argv, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, (argv, run.stderr)
    return run.stdout


def options(args: list[str]) -> list[str]:
    return [a.split("=")[0] for a in args if a.startswith("--") and a != "--help"]


LINES = command_lines()


def test_the_readme_has_commands() -> None:
    assert any(line.startswith("make ") for line in LINES)
    assert any(line.startswith("python build.py") for line in LINES)


@pytest.mark.parametrize("line", [ln for ln in LINES if ln.startswith("make ")])
def test_make_targets_exist(line: str) -> None:
    target = shlex.split(line)[1]
    assert re.search(rf"^{re.escape(target)}:", MAKEFILE, re.M), target


@pytest.mark.parametrize("line", [ln for ln in LINES if ln.startswith("python build.py")])
def test_build_py_subcommands_and_options_exist(line: str) -> None:
    args = shlex.split(line.replace("<sha>", "SHA"))[2:]
    sub = [a for a in args[:1] if not a.startswith("-")]
    text = help_text("build.py", *sub)
    for option in options(args):
        assert option in text, (line, option)


@pytest.mark.parametrize("line", [ln for ln in LINES if ln.startswith("python -m client")])
def test_client_options_exist(line: str) -> None:
    args = shlex.split(line)[3:]
    sub = ["bench"] if args[:1] == ["bench"] else []
    text = help_text("-m", "client", *sub)
    for option in options(args):
        assert option in text, (line, option)


@pytest.mark.parametrize("line", [ln for ln in LINES if ln.startswith(("kubectl apply", "cp "))])
def test_files_the_commands_read_exist(line: str) -> None:
    for arg in shlex.split(line)[1:]:
        if "/" in arg and not arg.startswith("-"):
            assert (ROOT / arg).exists() or arg.endswith("my.yaml"), arg
