"""Hold the image's installs to what the TensorRT-LLM release image already has.

Run inside the image build by the rendered Dockerfile (copied into the build context as
`base_constraints.py`; standard library only, because it runs on the base image's Python
before anything is installed), and imported by `mistral_build.image` and the tests, so
the rule the build applies is the rule the tests check:

- `freeze FREEZE MAY_MOVE HOLD`: the base image's `pip list --format=freeze` output becomes
  pip/uv constraints. Packages named in HOLD (what TensorRT-LLM's requirements pin or cap,
  and the torch / TensorRT / Triton / CUDA family, `name` or `prefix*` lines) are held at
  `==` their version: a server requirement that would move one then fails the resolution,
  loudly, instead of replacing it. Every other package is held at `>=` its version (never
  downgraded, free to rise where the server needs newer, as Truss's certifi floor does).
  Packages named in MAY_MOVE (the Truss server's exact pins that TensorRT-LLM does not
  require) are not held at all.
- `check BASELINE`: reads `pip check` output on stdin and fails on any problem that the
  base image did not already have (BASELINE: its own `pip check` output before the
  install), so a broken dependency the install introduces stops the build.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable

_FREEZE_LINE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)$")
# A PEP 440 version (the PEP's appendix regex, case-insensitive): what a constraint file
# may hold. A base package whose version is not one cannot be held, and is named instead.
_PEP440 = re.compile(
    r"^\s*v?(?:\d+!)?\d+(?:\.\d+)*"
    r"(?:[-_.]?(?:a|b|c|rc|alpha|beta|pre|preview)[-_.]?\d*)?"
    r"(?:-\d+|[-_.]?(?:post|rev|r)[-_.]?\d*)?"
    r"(?:[-_.]?dev[-_.]?\d*)?"
    r"(?:\+[a-z0-9]+(?:[-_.][a-z0-9]+)*)?\s*$",
    re.IGNORECASE,
)


def canonical(name: str) -> str:
    """PEP 503 normalized name (what pip and uv compare)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def is_version(text: str) -> bool:
    return _PEP440.match(text) is not None


def held_exactly(name: str, hold: Iterable[str]) -> bool:
    """`name` (canonical) is one of `hold`: a name, or a `prefix*` pattern."""
    for entry in hold:
        entry = canonical(entry.strip())
        if entry.endswith("*") and name.startswith(entry[:-1]):
            return True
        if name == entry:
            return True
    return False


def constraints_from_freeze(
    freeze: Iterable[str],
    may_move: Iterable[str] = (),
    unheld: list[str] | None = None,
    hold: Iterable[str] = (),
) -> list[str]:
    """A constraint per frozen package not in `may_move`: `name==version` for the packages
    `hold` names, `name>=version` (its public part: a local label cannot be a lower bound)
    for the rest.

    Lines that are not `name==version` (comments, `-e` editable installs, `name @ url`
    from a plain `pip freeze`) are refused: `pip list --format=freeze` never writes them,
    and a constraint we cannot read is one we would silently drop. A version that is not
    PEP 440 (a constraint file cannot hold it) is left out and its line added to `unheld`.
    """
    skip = {canonical(n) for n in may_move}
    hold = [h for h in hold if h.strip()]
    out: list[str] = []
    for raw in freeze:
        line = raw.strip()
        if not line:
            continue
        match = _FREEZE_LINE.match(line)
        if match is None:
            raise ValueError(f"not a `name==version` freeze line: {line!r}")
        name, version = match.group(1), match.group(2)
        if canonical(name) in skip:
            continue
        if not is_version(version):
            if unheld is not None:
                unheld.append(line)
            continue
        if held_exactly(canonical(name), hold):
            out.append(f"{name}=={version}")
        else:
            out.append(f"{name}>={version.split('+', 1)[0]}")
    return out


def new_problems(baseline: Iterable[str], after: Iterable[str]) -> list[str]:
    """`pip check` lines present after the install and not before it."""
    before = {ln.strip() for ln in baseline if ln.strip()}
    return [ln.strip() for ln in after if ln.strip() and ln.strip() not in before]


def _not_a_problem(line: str) -> bool:
    return line.startswith("No broken requirements")


def _names(path: str) -> list[str]:
    with open(path, encoding="utf-8") as f:
        return [n for n in (ln.split("#", 1)[0].strip() for ln in f) if n]


def main(argv: list[str]) -> int:
    if len(argv) == 4 and argv[0] == "freeze":
        unheld: list[str] = []
        with open(argv[1], encoding="utf-8") as f:
            print("\n".join(constraints_from_freeze(f, _names(argv[2]), unheld, _names(argv[3]))))
        for line in unheld:
            print(f"warning: not held (not a PEP 440 version): {line}", file=sys.stderr)
        return 0
    if len(argv) == 2 and argv[0] == "check":
        with open(argv[1], encoding="utf-8") as f:
            baseline = [ln for ln in f if not _not_a_problem(ln)]
        problems = new_problems(baseline, [ln for ln in sys.stdin if not _not_a_problem(ln)])
        for line in problems:
            print(f"error: the install broke a requirement: {line}", file=sys.stderr)
        return 1 if problems else 0
    print(
        "usage: base_constraints.py freeze FREEZE MAY_MOVE HOLD | check BASELINE", file=sys.stderr
    )
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
