"""Where structured output's compiles run: the service refuses a bad schema before any
engine kind sees it, and the PyTorch engine (dev model, CPU, real xgrammar) compiles on
its decoder's thread: a slow compile blocks neither the event loop nor other requests, an
abort during it ends the request, a bad schema ends only its own stream."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from mistral_serving.engines.base import (
    EngineLimits,
    EngineRequestError,
    GuidedDecoding,
    SamplingOptions,
)
from mistral_serving.engines.factory import start_guided_torch_engine
from mistral_serving.errors import RequestError
from mistral_serving.generation.service import GenerationRequest, GenerationService
from mistral_serving.ops.metrics import Metrics
from mistral_serving.settings import Settings
from mistral_serving.text.tokenizer import Tokenizer
from tests.doubles.scripted_engine import ScriptedEngine

PROMPT = [1, 100, 101, 102]
SCHEMA = json.dumps({"type": "object", "properties": {"a": {"type": "boolean"}}})


@pytest.fixture(scope="module")
def engine(dev_model: Path, tok: Tokenizer):
    eng = start_guided_torch_engine(dev_model, Settings(artifact=str(dev_model), device="cpu"), tok)
    yield eng
    eng.shutdown()


async def collect(engine, rid: str, opts: SamplingOptions) -> tuple[list[int], list]:
    tokens, reasons = [], []
    async for delta in engine.generate(rid, PROMPT, opts):
        tokens += delta.token_ids
        reasons.append(delta.finish_reason)
    return tokens, reasons


def guided(n: int = 8, schema: str = SCHEMA) -> SamplingOptions:
    return SamplingOptions(
        max_new_tokens=n, temperature=0, guided=GuidedDecoding("json_schema", schema)
    )


class HeldCompiles:
    """Makes the decoder's compiles wait until released (a slow schema, on demand)."""

    def __init__(self, decoder) -> None:
        self.decoder, self.real = decoder, decoder.compile
        self.release, self.started = threading.Event(), threading.Event()
        self.events: list[str] = []

    def __enter__(self) -> HeldCompiles:
        def held(g):
            self.started.set()
            if not self.release.wait(30):
                self.events.append("compile gave up waiting")
            self.events.append("compile released")
            return self.real(g)

        self.decoder.compile = held
        return self

    def __exit__(self, *exc: object) -> None:
        self.release.set()
        self.decoder.compile = self.real


def test_a_slow_compile_holds_neither_the_loop_nor_other_requests(engine) -> None:
    with HeldCompiles(engine.guided) as held:

        async def main() -> tuple[list[int], list[int]]:
            structured = asyncio.ensure_future(collect(engine, "slow", guided()))
            await asyncio.sleep(0)  # it submits (and, before, compiled right here)
            plain, _ = await collect(engine, "plain", SamplingOptions(max_new_tokens=4))
            held.events.append("plain done")
            held.release.set()
            tokens, _ = await structured
            return plain, tokens

        plain, tokens = asyncio.run(main())
    assert held.events == ["plain done", "compile released"]
    assert len(plain) == 4 and tokens


def test_an_abort_during_the_compile_ends_the_request_unrun(engine) -> None:
    with HeldCompiles(engine.guided) as held:

        async def main() -> None:
            task = asyncio.ensure_future(collect(engine, "gone", guided(64)))
            await asyncio.to_thread(held.started.wait, 30)
            task.cancel()  # the client went away: generate's cleanup aborts it
            with pytest.raises(asyncio.CancelledError):
                await task

        asyncio.run(main())
        assert engine._compiling == {"gone": True}
        held.release.set()
        deadline = time.monotonic() + 60
        while engine._compiling and time.monotonic() < deadline:
            time.sleep(0.05)
    assert engine._compiling == {} and not engine._waiting and engine.num_running() == 0


def test_a_schema_the_engine_cannot_compile_fails_only_its_own_stream(engine) -> None:
    async def main() -> tuple[BaseException | None, list[int]]:
        bad = asyncio.ensure_future(collect(engine, "bad", guided(schema='{"type": "nonsense"}')))
        ok, _ = await collect(engine, "ok", SamplingOptions(max_new_tokens=3))
        try:
            await bad
        except EngineRequestError as exc:
            return exc, ok
        return None, ok

    error, ok = asyncio.run(main())
    assert isinstance(error, EngineRequestError) and "nonsense" in str(error)
    assert ".cc:" not in str(error) and len(ok) == 3 and engine.is_healthy()


# ---- the service's gate, in front of every engine kind ----


def service_on(tok: Tokenizer, engine) -> GenerationService:
    return GenerationService(Settings(), tok, engine, metrics=Metrics(CollectorRegistry()))


@pytest.mark.parametrize(
    ("schema", "named"),
    [
        ({"type": "string", "pattern": "((a{0,30}){0,30}){0,30}"}, "grammar_max_pattern_repeat"),
        ({"type": "string", "not": {"const": "a"}}, "'not'"),
        ({"type": "nonsense"}, 'Unsupported type "nonsense"'),  # xgrammar's verdict, in a child
    ],
)
def test_the_service_refuses_a_bad_schema_before_an_engine_without_grammar_support(
    tok: Tokenizer, schema: dict, named: str
) -> None:
    # A scripted engine (like TensorRT-LLM's kinds: no in-process decoder) sees nothing.
    engine = ScriptedEngine(limits=EngineLimits(32, 64, 4))
    service = service_on(tok, engine)
    sampling = SamplingOptions(
        max_new_tokens=4, guided=GuidedDecoding("json_schema", json.dumps(schema))
    )

    async def main() -> None:
        try:
            await service.prepare(GenerationRequest(sampling=sampling, prompt="Hi"))
        finally:
            service.shutdown()
            await asyncio.sleep(0.5)  # the killed compiler process is reaped on this loop

    with pytest.raises(RequestError) as info:
        asyncio.run(main())
    assert info.value.status == 400 and info.value.param == "response_format"
    assert named in info.value.message and engine.calls == []
