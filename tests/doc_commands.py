"""Every shell command shown in README.md and docs/*.md, as a reader would type it."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL_BLOCKS = {"", "console", "bash", "sh", "shell"}
# What a command line starts with (anything else in a shell block is output or a comment).
COMMANDS = (
    "python", ".venv/bin/python", "make", "kubectl", "curl", "cp ", "kubernetes-validate",
    "docker", "bash", "echo", "MTT_", "PORT=", "BUDGET=", "guidellm", "gcloud", "truss",
    "source", "uv ", "pip", "helm",
)  # fmt: skip


def shell_commands(path: Path) -> list[str]:
    """The command lines of `path`'s shell blocks: `$ ` stripped, `\\` continuations
    joined, trailing `  # comment` dropped."""
    found: list[str] = []
    block: str | None = None
    pending = ""
    for raw in path.read_text(encoding="utf-8").splitlines():
        if raw.startswith("```"):
            block = raw[3:].strip() if block is None else None
            pending = ""
            continue
        if block is None or block not in SHELL_BLOCKS:
            continue
        line = raw.strip()
        if pending:
            line = pending + " " + line
            pending = ""
        elif line.startswith("$ "):
            line = line[2:]
        elif not line.startswith(COMMANDS):
            continue
        if line.endswith("\\"):
            pending = line[:-1].strip()
            continue
        found.append(line.split("  #")[0].strip())
    return found


def all_commands() -> list[tuple[str, str]]:
    """(document, command) for every document."""
    return [(p.relative_to(ROOT).as_posix(), c) for p in DOCS for c in shell_commands(p)]
