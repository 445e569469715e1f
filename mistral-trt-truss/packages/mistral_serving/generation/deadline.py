"""A deadline per request: the one rule for when a request must stop.

A request's deadline is its arrival plus the shortest of: the `request_timeout_seconds`
setting (0: none), the client's `X-Request-Timeout` header (seconds, e.g. `2.5`), and the
`x-envoy-expected-rq-timeout-ms` header an Envoy-based gateway sends with its own route
timeout (milliseconds), so the answer ends before the gateway would give up on it. A header
can only lower the setting's deadline, never lift it; a bad value is a 400.

When the deadline passes:
- waiting for a slot, being tokenized, waiting for its schema's compile, or before the
  engine saw it: 504 (`timeout`), and the engine never gets the request;
- while generating: the engine request is aborted and the answer ends visibly with
  `finish_reason` "timeout": in-band on an OpenAI stream, a cut body (no closing chunk) on
  a predict stream, and a 504 with the partial answer when not streamed.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import TypeVar

from mistral_serving.errors import RequestError

TIMEOUT_HEADER = "X-Request-Timeout"
ENVOY_TIMEOUT_HEADER = "x-envoy-expected-rq-timeout-ms"
MAX_TIMEOUT_S = 86_400.0  # also the setting's upper bound
FINISH_REASON = "timeout"

T = TypeVar("T")


class DeadlineExceeded(Exception):
    """The request's deadline passed."""


def _seconds(raw: str, name: str, scale: float) -> float:
    text = raw.strip()
    try:
        value = float(text) * scale if len(text) <= 32 else math.nan
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0 or value > MAX_TIMEOUT_S:
        shown = text[:32] + ("…" if len(text) > 32 else "")
        raise RequestError(
            f"header {name}: {shown!r} is not a timeout; give "
            f"{'milliseconds' if scale != 1 else 'seconds'} above 0, at most {MAX_TIMEOUT_S:g} s",
            param=name,
        )
    return value


def _values(headers: Mapping[str, str], name: str) -> list[str]:
    """Every value of a header sent more than once (Starlette's `getlist`), else the one."""
    getlist = getattr(headers, "getlist", None)
    if getlist is not None:
        return list(getlist(name))
    raw = headers.get(name)
    return [] if raw is None else [raw]


def deadline_for(headers: Mapping[str, str], default_s: float, arrived_at: float) -> float | None:
    """The monotonic time the request must be done by, or None (no limit). A header sent
    more than once counts with every value: a client's own larger timeout before a
    gateway's smaller one cannot lift it."""
    limits = [default_s] if default_s > 0 else []
    for raw in _values(headers, TIMEOUT_HEADER):
        limits.append(_seconds(raw, TIMEOUT_HEADER, 1.0))
    for raw in _values(headers, ENVOY_TIMEOUT_HEADER):
        limits.append(_seconds(raw, ENVOY_TIMEOUT_HEADER, 0.001))
    return arrived_at + min(limits) if limits else None


def passed(deadline: float | None) -> bool:
    return deadline is not None and time.monotonic() >= deadline


def timed_out(where: str) -> RequestError:
    """The 504 of a request whose deadline passed before its answer began."""
    return RequestError(f"the request's deadline passed {where}; nothing was generated", status=504)


def cut_short() -> RequestError:
    """The 504 of a non-streamed answer its deadline cut (the partial answer goes with it)."""
    return RequestError(
        "the request's deadline passed while generating; the partial answer is included",
        status=504,
    )


def check(deadline: float | None, where: str) -> None:
    if passed(deadline):
        raise timed_out(where)


async def within(deadline: float | None, awaitable: Awaitable[T], where: str) -> T:
    """`awaitable`'s result, or the 504 when the deadline passes first (it is cancelled)."""
    if deadline is None:
        return await awaitable
    try:
        async with asyncio.timeout_at(deadline):  # the loop's clock is time.monotonic
            return await awaitable
    except TimeoutError:
        raise timed_out(where) from None


async def while_present(
    deadline: float | None,
    awaitable: Awaitable[T],
    where: str,
    is_disconnected: Callable[[], Awaitable[bool]] | None,
    poll_s: float = 0.5,
) -> T:
    """`awaitable`'s result; the 504 when the deadline passes first, a 499 when the client
    leaves first (asked every `poll_s`); either way the awaitable is cancelled. For waits
    on work shared with others (a schema's compile), which the request must not outlast
    its deadline or its client for."""
    task = asyncio.ensure_future(awaitable)
    try:
        while True:
            timeout = poll_s
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise timed_out(where)
                timeout = min(timeout, left)
            done, _ = await asyncio.wait({task}, timeout=timeout)
            if done:
                return task.result()
            if is_disconnected is not None and await is_disconnected():
                raise RequestError(f"the client disconnected {where}", status=499)
    finally:
        task.cancel()


async def bounded(stream: AsyncIterator[T], deadline: float) -> AsyncIterator[T]:
    """`stream`'s items until `deadline`, then `DeadlineExceeded` (the wait for the next
    item is cancelled; aborting the engine request is the caller's). The timer covers only
    the waits on `stream`, never the consumer's work between items."""
    try:
        while True:
            # An item already waiting would be taken without a pause in which the timer
            # could fire: past the deadline, nothing more is taken.
            if time.monotonic() >= deadline:
                raise DeadlineExceeded
            try:
                async with asyncio.timeout_at(deadline):
                    item = await anext(stream)
            except StopAsyncIteration:
                return
            except TimeoutError:
                raise DeadlineExceeded from None
            yield item
    finally:
        aclose = getattr(stream, "aclose", None)
        if aclose is not None:  # closing this closes the engine's stream too
            await aclose()
