"""Verdicts: what one check found (PASS, WARN or FAIL with a detail line) and one kind's
report."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class CheckResult:
    name: str
    passed: bool
    detail: str
    seconds: float = 0.0
    # Passed, with a difference a correct stack can show (a near tie) or a part it could
    # not test here: the detail says which. Never fails the run.
    warned: bool = False

    @property
    def verdict(self) -> str:
        return "FAIL" if not self.passed else "WARN" if self.warned else "PASS"


@dataclass
class KindReport:
    kind: str
    artifact: str | None = None
    build: dict[str, Any] = field(default_factory=dict)
    server: dict[str, Any] = field(default_factory=dict)
    checks: list[CheckResult] = field(default_factory=list)
    bench: dict[str, Any] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return bool(self.checks) and all(c.passed for c in self.checks)

    @property
    def warnings(self) -> int:
        return sum(c.passed and c.warned for c in self.checks)


class CheckFailed(Exception):
    """A check's expectation did not hold; the message is the report's detail line."""


class CheckWarned(Exception):
    """The check passed with a reservation (near tie, untestable part); the message says it."""


def run_check(name: str, fn: Callable[[], str]) -> CheckResult:
    """Run one check: it returns its detail line when it passes, raises CheckWarned to pass
    with a warning and anything else to fail."""
    started = time.monotonic()
    warned = False
    try:
        detail, passed = fn(), True
    except CheckWarned as exc:
        detail, passed, warned = str(exc), True, True
    except Exception as exc:  # any failure is this check's result, never a traceback
        kind = "" if isinstance(exc, CheckFailed) else f"{type(exc).__name__}: "
        detail, passed = f"{kind}{exc}", False
    result = CheckResult(name, passed, detail, round(time.monotonic() - started, 2), warned)
    print(f"  [{result.verdict}] {name}: {detail}", flush=True)
    return result
