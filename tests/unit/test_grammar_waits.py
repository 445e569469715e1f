"""Waiting for a schema's compile, through Frontend.handle with a compile pool that holds
every compile until the test lets it go: a waiting request leaves with its client (499)
and at its deadline (504), giving its admission slot back at once, while the compile goes
on and its verdict is cached for the next request; past a bounded queue of distinct
schemas a new one is refused at once (429), uncached."""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import Iterator
from typing import Any

import pytest

from mistral_serving.structured.grammar import GrammarGate
from mistral_serving.text.tokenizer import Tokenizer
from tests.unit.test_frontend import Client, Served, body, call, serve

PATIENCE_S = 60  # a bound on a wait that must end, never a measurement


@pytest.fixture(autouse=True)
def restore_sigterm() -> Iterator[None]:
    previous = signal.getsignal(signal.SIGTERM)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class HeldPool:
    """A compile pool whose compiles all wait for `release` (then compile fine)."""

    def __init__(self, workers: int = 1) -> None:
        self.workers = workers
        self.timeout_s = 10.0
        self.compiled: list[str] = []
        self.release = asyncio.Event()

    async def compile(self, schema: str) -> str | None:
        self.compiled.append(schema)
        await self.release.wait()
        return None

    def close(self) -> None:
        pass


def held(tok: Tokenizer, **settings: Any) -> tuple[Served, HeldPool]:
    served = serve(tok, **settings)
    pool = HeldPool()
    service = served.frontend.service
    assert service is not None
    service.grammar = GrammarGate(served.frontend.settings, pool)
    return served, pool


def with_schema(name: str, **headers: str) -> Client:
    schema = {"type": "object", "properties": {name: {"type": "integer"}}}
    payload = body(
        model="m",
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=4,
        response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": schema}},
    )
    return Client(payload, headers=headers, route="chat_completions")


async def until(check: Any) -> None:
    async with asyncio.timeout(PATIENCE_S):
        while not check():
            await asyncio.sleep(0.01)


def test_a_request_waiting_for_a_compile_leaves_with_its_client_and_frees_its_slot(
    tok: Tokenizer,
) -> None:
    served, pool = held(tok, max_inflight=1, max_waiting=0)
    waiting = with_schema("a")
    admission = served.frontend.admission

    async def main() -> None:
        task = asyncio.ensure_future(call(served, waiting))
        await until(lambda: pool.compiled)
        assert admission.inflight == 1
        waiting.leave()
        async with asyncio.timeout(PATIENCE_S):  # the old code waited for the compile
            await task
        assert admission.inflight == 0  # its slot is back before the compile ended
        # The compile goes on for the schema's next request, and its verdict is kept.
        pool.release.set()
        again = with_schema("a")
        await call(served, again)
        assert again.status == 200
        assert pool.compiled == [pool.compiled[0]]  # compiled once

    asyncio.run(main())
    assert waiting.status == 499
    assert served.finished("chat_completions", "client_gone") == 1


def test_a_request_waiting_for_a_compile_ends_at_its_deadline(tok: Tokenizer) -> None:
    served, pool = held(tok, max_inflight=1)
    late = with_schema("b", **{"X-Request-Timeout": "0.3"})

    async def main() -> None:
        async with asyncio.timeout(PATIENCE_S):
            await call(served, late)
        assert served.frontend.admission.inflight == 0

    asyncio.run(main())
    assert late.status == 504, late.json()
    assert "while its schema waited for its compile" in late.json()["error"]["message"]
    assert served.finished("chat_completions", "timeout") == 1
    assert not served.engine.calls


def test_past_the_compile_queue_a_new_schema_is_a_429_and_not_cached(tok: Tokenizer) -> None:
    served, pool = held(tok)
    service = served.frontend.service
    assert service is not None
    gate = service.grammar
    assert gate.max_pending == 4  # 4 a worker
    first = [with_schema(f"p{i}") for i in range(gate.max_pending)]
    extra = with_schema("extra")

    async def main() -> None:
        tasks = [asyncio.ensure_future(call(served, c)) for c in first]
        await until(lambda: len(pool.compiled) == len(first))
        async with asyncio.timeout(PATIENCE_S):
            await call(served, extra)  # at once: the queue is full
        assert extra.status == 429
        pool.release.set()
        await asyncio.gather(*tasks)
        retried = with_schema("extra")
        await call(served, retried)
        assert retried.status == 200  # the 429 was not a cached verdict

    asyncio.run(main())
    error = extra.json()["error"]
    assert error["code"] == "rate_limit_exceeded" and "retry later" in error["message"]
    assert extra.response_headers["retry-after"] == "10"
    assert [c.status for c in first] == [200] * len(first)
    assert json.loads(pool.compiled[-1])["properties"] == {"extra": {"type": "integer"}}
