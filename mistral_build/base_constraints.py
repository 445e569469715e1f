"""Hold the image's installs to what the TensorRT-LLM release image already has.

Run inside the image build by the rendered Dockerfile (copied into the build context as
`base_constraints.py`; standard library only, because it runs on the base image's Python
before anything is installed), and imported by `mistral_build.image` and the tests, so
the rule the build applies is the rule the tests check:

- `freeze FREEZE MAY_MOVE`: the base image's `pip list --format=freeze` output becomes
  pip/uv constraints (`name==version`), except the packages named in MAY_MOVE (the Truss
  server's exact pins that TensorRT-LLM does not require). A server requirement that
  would move a package TensorRT-LLM was built against then fails the resolution, loudly,
  instead of replacing it.
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


def constraints_from_freeze(
    freeze: Iterable[str], may_move: Iterable[str] = (), unheld: list[str] | None = None
) -> list[str]:
    """`name==version` constraints for every frozen package not in `may_move`.

    Lines that are not `name==version` (comments, `-e` editable installs, `name @ url`
    from a plain `pip freeze`) are refused: `pip list --format=freeze` never writes them,
    and a constraint we cannot read is one we would silently drop. A version that is not
    PEP 440 (a constraint file cannot hold it) is left out and its line added to `unheld`.
    """
    skip = {canonical(n) for n in may_move}
    out: list[str] = []
    for raw in freeze:
        line = raw.strip()
        if not line:
            continue
        match = _FREEZE_LINE.match(line)
        if match is None:
            raise ValueError(f"not a `name==version` freeze line: {line!r}")
        if canonical(match.group(1)) in skip:
            continue
        if not is_version(match.group(2)):
            if unheld is not None:
                unheld.append(line)
            continue
        out.append(f"{match.group(1)}=={match.group(2)}")
    return out


def new_problems(baseline: Iterable[str], after: Iterable[str]) -> list[str]:
    """`pip check` lines present after the install and not before it."""
    before = {ln.strip() for ln in baseline if ln.strip()}
    return [ln.strip() for ln in after if ln.strip() and ln.strip() not in before]


def _not_a_problem(line: str) -> bool:
    return line.startswith("No broken requirements")


def main(argv: list[str]) -> int:
    if len(argv) == 3 and argv[0] == "freeze":
        with open(argv[1], encoding="utf-8") as f, open(argv[2], encoding="utf-8") as m:
            names = [ln.split("#", 1)[0].strip() for ln in m]
            unheld: list[str] = []
            print("\n".join(constraints_from_freeze(f, [n for n in names if n], unheld)))
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
    print("usage: base_constraints.py freeze FREEZE MAY_MOVE | check BASELINE", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
