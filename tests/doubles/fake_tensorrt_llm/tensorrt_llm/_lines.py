"""Version gates of the double (not a real module): what each release line has.

1.2.x is the last line with the TensorRT-engine backend (`_tensorrt_engine`, trtllm-build,
BuildConfig; removed from main in June-July 2026: PRs 15763, 15767, 15907, 15918, 16369);
the 1.3 (rc) lines are PyTorch-backend only, and TRTLLMSampler is gone from 1.3.0rc26."""

from __future__ import annotations


def _key(version: str) -> tuple[tuple[int, int, int], int]:
    """((major, minor, patch), rc): a final release sorts after all its rcs."""
    public = version.strip().lstrip("v").split("+")[0]
    base, _, rc = public.partition("rc")
    numbers = [int("".join(c for c in p if c.isdigit()) or 0) for p in base.split(".")[:3]]
    numbers += [0] * (3 - len(numbers))
    rc_number = int("".join(c for c in rc.split(".")[0] if c.isdigit()) or 0) if rc else 10**9
    return (numbers[0], numbers[1], numbers[2]), rc_number


def at_least(version: str, release: tuple[int, int, int], rc: int = 0) -> bool:
    """`version` is `release`rc`rc` or later ("1.3.0rc26" at_least (1, 3, 0), 26)."""
    return _key(version) >= (release, rc)


def has_engine_backend(version: str) -> bool:
    return not at_least(version, (1, 3, 0), 0)
