"""GenerationService on a scripted engine and the dev model's real tokenizer: predict
parsing and defaults, prompt limits, streaming (text, stop strings, finish reasons,
aborts, errors), telemetry once per request, `complete` and `abort_all`."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from mistral_serving.chat import ChatMessage, encode_chat
from mistral_serving.engines.base import (
    EngineError,
    EngineLimits,
    EngineRequestError,
    SamplingOptions,
    TokenDelta,
)
from mistral_serving.metrics import Metrics
from mistral_serving.service import GenerationRequest, GenerationService, RequestError
from mistral_serving.settings import Settings
from mistral_serving.telemetry import RequestRecord
from mistral_serving.tokenizer import Tokenizer, load_tokenizer
from tests.doubles.scripted_engine import ScriptedEngine

TEXT = "Hello world, the quick brown fox jumps over the lazy dog."
STOP_TEXT = "Answer: yes. STOP here and more"
LIMITS = EngineLimits(max_input_len=32, max_seq_len=64, max_batch_size=4)
ROUTE = "predict"


@pytest.fixture(scope="module")
def tok(dev_model: Path) -> Tokenizer:
    return load_tokenizer(dev_model)


def make_service(
    tok: Tokenizer, engine: ScriptedEngine, **settings: object
) -> tuple[GenerationService, CollectorRegistry]:
    registry = CollectorRegistry()
    return GenerationService(Settings(**settings), tok, engine, metrics=Metrics(registry)), registry


def finished(registry: CollectorRegistry, reason: str) -> float:
    return (
        registry.get_sample_value(
            "mtt:request_finished_total", {"route": ROUTE, "finished_reason": reason}
        )
        or 0.0
    )


def finished_total(registry: CollectorRegistry) -> float:
    return sum(finished(registry, r) for r in ("stop", "length", "abort", "error"))


def gen_for(
    ids: list[int], stop: tuple[str, ...] = (), interval: int = 1, max_new_tokens: int = 32
) -> GenerationRequest:
    return GenerationRequest(ids, SamplingOptions(max_new_tokens=max_new_tokens), stop, interval)


async def collect(
    service: GenerationService, gen: GenerationRequest, record: RequestRecord
) -> list[str]:
    return [chunk async for chunk in service.stream(gen, record)]


# ---- parse_predict ----


def test_parse_predict_defaults(tok: Tokenizer) -> None:
    service, _ = make_service(tok, ScriptedEngine(limits=LIMITS))
    req, gen = service.parse_predict({"prompt": "Hello world"})
    ids = [tok.bos_id, *tok.encode("Hello world")]
    assert gen.prompt_ids == ids
    s = gen.sampling
    # The article's defaults: greedy, temperature 0.9, top_p 0 (off -> 1.0), interval 3,
    # max_new_tokens 2048 clamped to what the engine leaves after the prompt.
    assert (s.top_k, s.temperature, s.top_p) == (1, 0.9, 1.0)
    assert s.max_new_tokens == LIMITS.max_seq_len - len(ids)
    assert gen.interval == 3
    assert gen.stop == ()
    assert req.streaming is False


@pytest.mark.parametrize(("top_p", "expected"), [(0.0, 1.0), (1.0, 1.0), (0.5, 0.5)])
def test_parse_predict_top_p_zero_or_one_is_off(
    tok: Tokenizer, top_p: float, expected: float
) -> None:
    service, _ = make_service(tok, ScriptedEngine(limits=LIMITS))
    _, gen = service.parse_predict({"prompt": "hi", "top_p": top_p})
    assert gen.sampling.top_p == expected


def test_parse_predict_passes_options_through(tok: Tokenizer) -> None:
    service, _ = make_service(tok, ScriptedEngine(limits=LIMITS))
    _, gen = service.parse_predict(
        {
            "prompt": "hi",
            "max_new_tokens": 5,
            "temperature": 0.2,
            "top_k": 40,
            "seed": 7,
            "repetition_penalty": 1.1,
            "presence_penalty": 0.5,
            "frequency_penalty": -0.5,
            "stop": "END",
            "streaming_interval": 2,
        }
    )
    assert gen.sampling == SamplingOptions(
        max_new_tokens=5,
        temperature=0.2,
        top_k=40,
        top_p=1.0,
        seed=7,
        repetition_penalty=1.1,
        presence_penalty=0.5,
        frequency_penalty=-0.5,
    )
    assert gen.stop == ("END",)
    assert gen.interval == 2


def test_parse_predict_messages_use_the_chat_encoding(tok: Tokenizer) -> None:
    service, _ = make_service(tok, ScriptedEngine(limits=LIMITS))
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    _, gen = service.parse_predict({"messages": messages})
    assert gen.prompt_ids == encode_chat([ChatMessage(**m) for m in messages], tok)


def test_parse_predict_bad_conversation_is_a_400_on_messages(tok: Tokenizer) -> None:
    service, _ = make_service(tok, ScriptedEngine(limits=LIMITS))
    with pytest.raises(RequestError) as err:
        service.parse_predict(
            {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}
        )
    assert (err.value.status, err.value.param) == (400, "messages")


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"prompt": "x", "max_tokens": 3}, "max_tokens: unknown field"),
        ({"prompt": "x", "messages": [{"role": "user", "content": "y"}]}, "exactly one"),
        ({}, "exactly one"),
        ({"prompt": "x", "temperature": 3}, "temperature"),
        ("not an object", "body"),
    ],
)
def test_parse_predict_invalid_bodies_are_400s(tok: Tokenizer, body: object, needle: str) -> None:
    service, _ = make_service(tok, ScriptedEngine(limits=LIMITS))
    with pytest.raises(RequestError) as err:
        service.parse_predict(body)
    assert err.value.status == 400
    assert needle in err.value.message


def test_max_new_tokens_clamped_to_sequence_room(tok: Tokenizer) -> None:
    service, _ = make_service(tok, ScriptedEngine(limits=LIMITS))
    _, gen = service.parse_predict({"prompt": "hi", "max_new_tokens": 1000})
    assert gen.sampling.max_new_tokens == LIMITS.max_seq_len - len(gen.prompt_ids)
    _, gen = service.parse_predict({"prompt": "hi", "max_new_tokens": 4})
    assert gen.sampling.max_new_tokens == 4


def test_prompt_longer_than_max_input_len_is_refused(tok: Tokenizer) -> None:
    service, _ = make_service(tok, ScriptedEngine(limits=LIMITS))
    long_prompt = " ".join(["word"] * 40)
    assert len(tok.encode(long_prompt, bos=True)) > LIMITS.max_input_len
    with pytest.raises(RequestError) as err:
        service.parse_predict({"prompt": long_prompt})
    assert err.value.status == 400
    assert err.value.param == "prompt"
    assert "input tokens" in err.value.message
    assert str(LIMITS.max_input_len) in err.value.message


def test_check_prompt_boundaries(tok: Tokenizer) -> None:
    limits = EngineLimits(max_input_len=10, max_seq_len=10, max_batch_size=1)
    service, _ = make_service(tok, ScriptedEngine(limits=limits))
    assert service.check_prompt([5] * 9, 100) == 1  # exactly one token of room
    with pytest.raises(RequestError, match="no room"):
        service.check_prompt([5] * 10, 100)  # within max_input_len but no room left
    with pytest.raises(RequestError, match="input tokens"):
        service.check_prompt([5] * 11, 100)


# ---- stream ----


@pytest.mark.parametrize("reason", ["length", "stop"])
def test_stream_yields_the_text_and_propagates_the_engine_finish(
    tok: Tokenizer, reason: str
) -> None:
    ids = tok.encode(TEXT)
    engine = ScriptedEngine.from_ids(ids, finish_reason=reason, limits=LIMITS)
    service, registry = make_service(tok, engine)
    record = RequestRecord("r1", ROUTE)
    prompt = tok.encode("prompt", bos=True)
    chunks = asyncio.run(collect(service, gen_for(prompt), record))
    assert "".join(chunks) == TEXT
    assert len(chunks) > 1  # interval 1: streamed, not one blob
    assert record.finish_reason == reason
    assert record.output == TEXT
    assert (record.prompt_tokens, record.completion_tokens) == (len(prompt), len(ids))
    assert record.first_token_at is not None
    assert engine.calls[0].request_id == record.engine_id
    assert engine.calls[0].prompt_ids == prompt
    assert engine.aborted == []  # the engine finished on its own: nothing to abort
    assert engine.closed == [record.engine_id]
    assert finished(registry, reason) == 1
    assert finished_total(registry) == 1
    assert registry.get_sample_value("mtt:generation_tokens_total") == len(ids)
    assert service.abort_all() == 0  # nothing left live


def test_stream_interval_groups_tokens(tok: Tokenizer) -> None:
    ids = tok.encode(TEXT)
    engine = ScriptedEngine.from_ids(ids, limits=LIMITS)
    service, _ = make_service(tok, engine)
    chunks = asyncio.run(collect(service, gen_for([1], interval=4), RequestRecord("r", ROUTE)))
    assert "".join(chunks) == TEXT
    assert len(chunks) == -(-len(ids) // 4)


def test_stop_string_ends_with_stop_and_aborts_the_engine(tok: Tokenizer) -> None:
    ids = tok.encode(STOP_TEXT)
    # No finish reason in the script: only the stop string can end this stream.
    engine = ScriptedEngine.from_ids(ids, finish_reason=None, limits=LIMITS)
    service, registry = make_service(tok, engine)
    record = RequestRecord("r", ROUTE)
    chunks = asyncio.run(collect(service, gen_for([1], stop=("STOP",)), record))
    assert "".join(chunks) == "Answer: yes. "
    assert record.output == "Answer: yes. "
    assert record.finish_reason == "stop"
    assert engine.aborted == [record.engine_id]
    assert engine.closed == [record.engine_id]
    assert finished(registry, "stop") == 1
    assert finished_total(registry) == 1


def test_stop_string_split_across_tokens_is_never_half_sent(tok: Tokenizer) -> None:
    ids = tok.encode(STOP_TEXT)  # "STOP" is two tokens: "ST" + "OP"
    engine = ScriptedEngine.from_ids(ids, limits=LIMITS)
    service, _ = make_service(tok, engine)
    record = RequestRecord("r", ROUTE)
    chunks = asyncio.run(collect(service, gen_for([1], stop=("STOP",)), record))
    assert not any("ST" in c for c in chunks)
    assert record.finish_reason == "stop"


def test_engine_abort_finish_propagates(tok: Tokenizer) -> None:
    ids = tok.encode(TEXT)
    engine = ScriptedEngine([TokenDelta(ids[:3]), TokenDelta(ids[3:5], "abort")], limits=LIMITS)
    service, registry = make_service(tok, engine)
    record = RequestRecord("r", ROUTE)
    chunks = asyncio.run(collect(service, gen_for([1]), record))
    assert "".join(chunks) == tok.decode(ids[:5])
    assert record.finish_reason == "abort"
    assert finished(registry, "abort") == 1


def test_consumer_closing_early_aborts_and_records_abort(tok: Tokenizer) -> None:
    ids = tok.encode(TEXT)
    engine = ScriptedEngine.from_ids(ids, finish_reason=None, limits=LIMITS)
    service, registry = make_service(tok, engine)
    record = RequestRecord("r", ROUTE)

    async def main() -> str:
        agen = service.stream(gen_for([1]), record)
        first = await agen.__anext__()
        await agen.aclose()
        return first

    first = asyncio.run(main())
    assert first == tok.decode(ids[:1])
    assert engine.aborted == [record.engine_id]
    assert engine.closed == [record.engine_id]
    assert record.finish_reason == "abort"
    assert finished(registry, "abort") == 1
    assert finished_total(registry) == 1
    assert service.abort_all() == 0


def test_cancelled_consumer_aborts_once_and_records_once(tok: Tokenizer) -> None:
    engine = ScriptedEngine.from_ids(tok.encode(TEXT), finish_reason=None, limits=LIMITS)
    service, registry = make_service(tok, engine)
    record = RequestRecord("r", ROUTE)

    async def main() -> None:
        task = asyncio.ensure_future(collect(service, gen_for([1]), record))
        while not engine.calls or engine.closed or record.first_token_at is None:
            await asyncio.sleep(0.001)
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert engine.aborted == [record.engine_id]
    assert record.finish_reason == "abort"
    assert finished_total(registry) == 1


@pytest.mark.parametrize("at_start", [True, False])
def test_engine_request_error_becomes_a_request_error(tok: Tokenizer, at_start: bool) -> None:
    ids = tok.encode(TEXT)
    script = [] if at_start else [TokenDelta(ids[:2])]
    engine = ScriptedEngine(
        [*script, EngineRequestError("token id 99999 is out of range")], limits=LIMITS
    )
    service, registry = make_service(tok, engine)
    record = RequestRecord("r", ROUTE)
    with pytest.raises(RequestError) as err:
        asyncio.run(collect(service, gen_for([1]), record))
    assert err.value.status == 400
    assert "out of range" in err.value.message
    assert record.finish_reason == "error"
    assert finished(registry, "error") == 1
    assert finished_total(registry) == 1
    assert service.abort_all() == 0


def test_engine_failure_propagates_and_is_recorded_as_error(tok: Tokenizer) -> None:
    engine = ScriptedEngine(
        [TokenDelta(tok.encode("Hi")), EngineError("GPU fell off")], limits=LIMITS
    )
    service, registry = make_service(tok, engine)
    record = RequestRecord("r", ROUTE)
    with pytest.raises(EngineError, match="GPU fell off"):
        asyncio.run(collect(service, gen_for([1]), record))
    assert record.finish_reason == "error"
    assert finished(registry, "error") == 1
    assert finished_total(registry) == 1


def test_abort_all_aborts_live_streams(tok: Tokenizer) -> None:
    engine = ScriptedEngine.from_ids(tok.encode(TEXT), finish_reason=None, limits=LIMITS)
    service, registry = make_service(tok, engine)
    records = [RequestRecord(f"r{i}", ROUTE) for i in range(2)]

    async def main() -> list[list[str]]:
        tasks = [asyncio.ensure_future(collect(service, gen_for([1]), r)) for r in records]
        while len(engine.calls) < 2 or any(r.first_token_at is None for r in records):
            await asyncio.sleep(0.001)
        assert service.abort_all() == 2
        return await asyncio.gather(*tasks)

    outputs = asyncio.run(main())
    assert all("".join(o) == TEXT for o in outputs)  # the whole script, then the abort
    assert sorted(engine.aborted) == sorted(r.engine_id for r in records)
    assert all(r.finish_reason == "abort" for r in records)
    assert finished(registry, "abort") == 2
    assert service.abort_all() == 0


# ---- complete ----


def test_complete_returns_the_whole_answer(tok: Tokenizer) -> None:
    ids = tok.encode(TEXT)
    engine = ScriptedEngine.from_ids(ids, finish_reason="stop", limits=LIMITS)
    service, registry = make_service(tok, engine)
    record = RequestRecord("r", ROUTE)

    async def connected() -> bool:
        return False

    out = asyncio.run(service.complete(gen_for([1]), record, connected))
    assert out is record
    assert (record.output, record.finish_reason) == (TEXT, "stop")
    assert record.completion_tokens == len(ids)
    assert finished_total(registry) == 1


def test_complete_aborts_when_the_client_leaves(tok: Tokenizer) -> None:
    engine = ScriptedEngine.from_ids(tok.encode(TEXT), finish_reason=None, limits=LIMITS)
    service, registry = make_service(tok, engine)
    record = RequestRecord("r", ROUTE)
    polls = 0

    async def gone() -> bool:
        nonlocal polls
        polls += 1
        return True

    asyncio.run(asyncio.wait_for(service.complete(gen_for([1]), record, gone), 5))
    assert polls >= 1
    assert engine.aborted == [record.engine_id]
    assert engine.closed == [record.engine_id]
    assert record.finish_reason == "abort"
    assert finished(registry, "abort") == 1
    assert service.abort_all() == 0


def test_complete_reraises_request_errors(tok: Tokenizer) -> None:
    engine = ScriptedEngine([EngineRequestError("bad prompt")], limits=LIMITS)
    service, _ = make_service(tok, engine)
    record = RequestRecord("r", ROUTE)
    with pytest.raises(RequestError, match="bad prompt"):
        asyncio.run(service.complete(gen_for([1]), record))
    assert record.finish_reason == "error"


def test_log_prompts_setting_reaches_telemetry(tok: Tokenizer) -> None:
    service, _ = make_service(tok, ScriptedEngine(limits=LIMITS), log_prompts=True)
    assert service.telemetry.log_prompts is True
    service, _ = make_service(tok, ScriptedEngine(limits=LIMITS))
    assert service.telemetry.log_prompts is False


def test_scripted_engine_satisfies_the_engine_protocol() -> None:
    from mistral_serving.engines.base import Engine

    assert isinstance(ScriptedEngine(), Engine)


def test_stream_logs_prompt_text_when_asked(
    tok: Tokenizer, caplog: pytest.LogCaptureFixture
) -> None:
    engine = ScriptedEngine.from_ids(tok.encode("Fine."), limits=LIMITS)
    service, _ = make_service(tok, engine, log_prompts=True)
    record = RequestRecord("r", ROUTE)

    async def main() -> None:
        async for _ in service.stream(gen_for([1]), record, prompt_text="How are you?"):
            pass

    with caplog.at_level("INFO", logger="mistral_serving.requests"):
        asyncio.run(main())
    (line,) = [r for r in caplog.records if r.name == "mistral_serving.requests"]
    assert (line.prompt, line.output, line.finish_reason) == ("How are you?", "Fine.", "length")


def test_stop_string_in_the_engines_last_delta_is_a_stop(tok: Tokenizer) -> None:
    ids = tok.encode(STOP_TEXT)
    # One delta with every token and the engine's own finish: the stop string wins.
    engine = ScriptedEngine.from_ids(ids, per_step=len(ids), limits=LIMITS)
    service, registry = make_service(tok, engine)
    record = RequestRecord("r", ROUTE)
    chunks = asyncio.run(collect(service, gen_for([1], stop=("STOP",)), record))
    assert "".join(chunks) == "Answer: yes. "
    assert record.finish_reason == "stop"
    assert finished(registry, "stop") == 1


def test_stop_string_completed_by_the_final_flush_is_a_stop(tok: Tokenizer) -> None:
    """A stop string ending in a byte-fallback character ("🫠" is four <0xNN> tokens) is
    only seen when the detokenizer flushes at the end of the stream. The output is cut
    at the stop string, so the finish reason must be "stop", not the engine's "length"."""
    ids = tok.encode("Hi 🫠")
    assert tok.table.is_byte_token[ids[-1]]
    engine = ScriptedEngine.from_ids(ids, finish_reason="length", limits=LIMITS)
    service, registry = make_service(tok, engine)
    record = RequestRecord("r", ROUTE)
    chunks = asyncio.run(collect(service, gen_for([1], stop=("🫠",)), record))
    assert "".join(chunks).rstrip() == "Hi"
    assert "🫠" not in record.output
    assert record.finish_reason == "stop"
    assert finished(registry, "stop") == 1
