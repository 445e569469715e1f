"""GenerationService on a scripted engine and the dev model's real tokenizer: `prepare`
(tokenizing, chat encoding, prompt limits, max_new_tokens clamping), streaming (text,
stop strings, finish reasons, logprobs, aborts, errors), telemetry once per request,
`complete` and `abort_all`."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest
from prometheus_client import CollectorRegistry

from mistral_serving.engines.base import (
    EngineError,
    EngineLimits,
    EngineRequestError,
    SamplingOptions,
    TokenDelta,
    TokenLogprob,
)
from mistral_serving.errors import RequestError
from mistral_serving.generation.outcome import Outcome
from mistral_serving.generation.service import (
    INLINE_TOKENIZE_CHARS,
    Chunk,
    GenerationRequest,
    GenerationService,
    PreparedRequest,
)
from mistral_serving.ops.metrics import Metrics
from mistral_serving.ops.record import RequestRecord
from mistral_serving.settings import Settings
from mistral_serving.text.chat import ChatMessage, encode_chat
from mistral_serving.text.tokenizer import Tokenizer
from tests.decoding import decode
from tests.doubles.scripted_engine import ScriptedEngine

TEXT = "Hello world, the quick brown fox jumps over the lazy dog."
STOP_TEXT = "Answer: yes. STOP here and more"
LIMITS = EngineLimits(max_input_len=32, max_seq_len=64, max_batch_size=4)
ROUTE = "predict"
REASONS = ("stop", "length", "abort", "error", "invalid")


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
    return sum(finished(registry, r) for r in REASONS)


def prepared(
    ids: list[int],
    stop: tuple[str, ...] = (),
    interval: int = 1,
    max_new_tokens: int = 32,
    logprobs: int | None = None,
) -> PreparedRequest:
    sampling = SamplingOptions(max_new_tokens=max_new_tokens, logprobs=logprobs)
    return PreparedRequest(ids, sampling, stop, interval)


def prepare(service: GenerationService, **fields: object) -> PreparedRequest:
    fields.setdefault("sampling", SamplingOptions(max_new_tokens=2048))
    return asyncio.run(service.prepare(GenerationRequest(**fields)))


async def collect(
    service: GenerationService,
    req: PreparedRequest,
    record: RequestRecord,
    prompt_text: str | None = None,
) -> list[Chunk]:
    """The chunks of the request's generation; the record is then closed with its
    outcome, as the frontend closes it (once, however the generation ended)."""
    generation = service.generate(req, record)
    try:
        return [chunk async for chunk in generation]
    finally:
        await generation.aclose()
        service.telemetry.finished(record, generation.outcome or generation.cut(), prompt_text)


async def complete(
    service: GenerationService,
    req: PreparedRequest,
    record: RequestRecord,
    is_disconnected: Callable[[], Awaitable[bool]] | None = None,
) -> Outcome:
    """The whole answer, the record closed as the frontend closes it."""
    generation = service.generate(req, record)
    try:
        return await generation.complete(is_disconnected)
    finally:
        service.telemetry.finished(record, generation.outcome or generation.cut())


def texts(chunks: list[Chunk]) -> list[str]:
    return [c.text for c in chunks]


# ---- prepare ----


def test_prepare_tokenizes_the_prompt_with_bos(tok: Tokenizer) -> None:
    service, _ = make_service(tok, ScriptedEngine(limits=LIMITS))
    sampling = SamplingOptions(max_new_tokens=5, temperature=0.2, top_k=40, seed=7)
    req = asyncio.run(
        service.prepare(
            GenerationRequest(sampling=sampling, prompt="Hello world", stop=("X",), interval=3)
        )
    )
    assert req.prompt_ids == [tok.bos_id, *tok.encode("Hello world")]
    assert req.sampling == sampling  # within the room: passed through unchanged
    assert (req.stop, req.interval) == (("X",), 3)


def test_prepare_adds_the_models_other_end_of_turn_tokens(tok: Tokenizer) -> None:
    service, _ = make_service(tok, ScriptedEngine(limits=LIMITS))
    service.tokenizer.stop_token_ids = (tok.eos_id, 7)  # as generation_config lists them
    try:
        plain = SamplingOptions(max_new_tokens=5)
        req = asyncio.run(service.prepare(GenerationRequest(sampling=plain, prompt="Hi")))
        assert req.sampling.stop_token_ids == (7,)
        ignoring = SamplingOptions(max_new_tokens=5, ignore_eos=True)
        req = asyncio.run(service.prepare(GenerationRequest(sampling=ignoring, prompt="Hi")))
        assert req.sampling.stop_token_ids == ()
    finally:
        service.tokenizer.stop_token_ids = (tok.eos_id,)


def test_prepare_clamps_max_new_tokens_to_the_sequence_room(tok: Tokenizer) -> None:
    service, _ = make_service(tok, ScriptedEngine(limits=LIMITS))
    req = prepare(service, prompt="hi", sampling=SamplingOptions(max_new_tokens=1000, seed=3))
    assert req.sampling.max_new_tokens == LIMITS.max_seq_len - len(req.prompt_ids)
    assert req.sampling.seed == 3  # only max_new_tokens changes
    req = prepare(service, prompt="hi", sampling=SamplingOptions(max_new_tokens=4))
    assert req.sampling.max_new_tokens == 4


def test_prepare_messages_use_the_chat_encoding(tok: Tokenizer) -> None:
    service, _ = make_service(tok, ScriptedEngine(limits=LIMITS))
    messages = (
        ChatMessage(role="system", content="Be brief."),
        ChatMessage(role="user", content="Hi"),
    )
    req = prepare(service, messages=messages, param="messages")
    assert req.prompt_ids == encode_chat(list(messages), tok)
    assert req.prompt_ids[0] == tok.bos_id


def test_bad_conversation_is_a_400_on_messages(tok: Tokenizer) -> None:
    service, _ = make_service(tok, ScriptedEngine(limits=LIMITS))
    messages = (
        ChatMessage(role="user", content="a"),
        ChatMessage(role="assistant", content="b"),
    )
    with pytest.raises(RequestError) as err:
        prepare(service, messages=messages, param="messages")
    assert (err.value.status, err.value.param) == (400, "messages")
    assert "assistant" in err.value.message


@pytest.mark.parametrize("param", ["prompt", "messages"])
def test_prompt_longer_than_max_input_len_is_refused_naming_the_field(
    tok: Tokenizer, param: str
) -> None:
    service, _ = make_service(tok, ScriptedEngine(limits=LIMITS))
    long_prompt = " ".join(["word"] * 40)
    assert len(tok.encode(long_prompt, bos=True)) > LIMITS.max_input_len
    fields: dict[str, object] = (
        {"prompt": long_prompt}
        if param == "prompt"
        else {"messages": (ChatMessage(role="user", content=long_prompt),)}
    )
    with pytest.raises(RequestError) as err:
        prepare(service, param=param, **fields)
    assert (err.value.status, err.value.param) == (400, param)
    assert "input tokens" in err.value.message
    assert str(LIMITS.max_input_len) in err.value.message
    assert err.value.message.startswith(param)


def test_a_prompt_no_token_could_fit_is_refused_before_tokenizing(
    tok: Tokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    service, _ = make_service(tok, ScriptedEngine(limits=LIMITS))

    def no_tokenizing(*args: object, **kwargs: object) -> list[int]:
        raise AssertionError("tokenized a prompt the character bound refuses")

    monkeypatch.setattr(service, "_encode", no_tokenizing)
    huge = "x" * (LIMITS.max_input_len * service._max_token_chars + 1)
    with pytest.raises(RequestError) as err:
        prepare(service, prompt=huge)
    assert err.value.param == "prompt"
    assert "characters" in err.value.message


def test_long_prompts_are_tokenized_off_the_event_loop(tok: Tokenizer) -> None:
    limits = EngineLimits(max_input_len=4000, max_seq_len=4100, max_batch_size=1)
    service, _ = make_service(tok, ScriptedEngine(limits=limits))
    threads: list[bool] = []
    encode = service._encode

    def spy(req: GenerationRequest) -> list[int]:
        import threading

        threads.append(threading.current_thread() is threading.main_thread())
        return encode(req)

    service._encode = spy  # type: ignore[method-assign]
    short = prepare(service, prompt="a b")
    long = prepare(service, prompt="a " * INLINE_TOKENIZE_CHARS)
    assert threads == [True, False]  # short: inline; long: in a worker thread
    assert short.prompt_ids == tok.encode("a b", bos=True)
    assert long.prompt_ids == tok.encode("a " * INLINE_TOKENIZE_CHARS, bos=True)


def test_prompt_limit_boundaries(tok: Tokenizer) -> None:
    limits = EngineLimits(max_input_len=10, max_seq_len=10, max_batch_size=1)
    service, _ = make_service(tok, ScriptedEngine(limits=limits))
    req = prepare(service, prompt_ids=(5,) * 9)
    assert req.sampling.max_new_tokens == 1  # exactly one token of room
    with pytest.raises(RequestError, match="no room"):
        prepare(service, prompt_ids=(5,) * 10)  # within max_input_len, but no room
    with pytest.raises(RequestError, match="input tokens"):
        prepare(service, prompt_ids=(5,) * 11)


def test_token_id_prompts_are_used_as_given_within_the_vocab(tok: Tokenizer) -> None:
    service, _ = make_service(tok, ScriptedEngine(limits=LIMITS))
    assert prepare(service, prompt_ids=(0, tok.vocab_size - 1)).prompt_ids == [0, 31999]
    for bad in (-1, tok.vocab_size, 10**30):
        with pytest.raises(RequestError) as err:
            prepare(service, prompt_ids=(1, bad))
        assert err.value.param == "prompt"
        assert str(tok.vocab_size) in err.value.message


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
    chunks = asyncio.run(collect(service, prepared(prompt), record))
    assert "".join(texts(chunks)) == TEXT
    assert len(chunks) > 1  # interval 1: streamed, not one blob
    assert all(c.logprobs is None for c in chunks)  # not asked for
    assert record.finish_reason == reason
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
    chunks = asyncio.run(collect(service, prepared([1], interval=4), RequestRecord("r", ROUTE)))
    assert "".join(texts(chunks)) == TEXT
    assert len(chunks) == -(-len(ids) // 4)


def test_stream_carries_logprobs_with_their_text(tok: Tokenizer) -> None:
    ids = tok.encode(TEXT)
    lps = [TokenLogprob(t, -0.5 - i, ((t, -0.5 - i), (7, -3.0))) for i, t in enumerate(ids)]
    script = [TokenDelta([t], None, [lp]) for t, lp in zip(ids, lps)]
    script[-1] = TokenDelta([ids[-1]], "length", [lps[-1]])
    service, _ = make_service(tok, ScriptedEngine(script, limits=LIMITS))
    record = RequestRecord("r", ROUTE)
    chunks = asyncio.run(collect(service, prepared([1], interval=3, logprobs=1), record))
    assert "".join(texts(chunks)) == TEXT
    # Every token's logprob arrives once, in order, with the chunk that holds its text.
    assert [lp for c in chunks for lp in (c.logprobs or [])] == lps
    assert all(c.logprobs for c in chunks)


def test_stop_string_ends_with_stop_and_aborts_the_engine(tok: Tokenizer) -> None:
    ids = tok.encode(STOP_TEXT)
    # No finish reason in the script: only the stop string can end this stream.
    engine = ScriptedEngine.from_ids(ids, finish_reason=None, limits=LIMITS)
    service, registry = make_service(tok, engine)
    record = RequestRecord("r", ROUTE)
    chunks = asyncio.run(collect(service, prepared([1], stop=("STOP",)), record))
    assert "".join(texts(chunks)) == "Answer: yes. "
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
    chunks = asyncio.run(collect(service, prepared([1], stop=("STOP",)), record))
    assert not any("ST" in c for c in texts(chunks))
    assert record.finish_reason == "stop"


def test_stop_string_in_the_engines_last_delta_is_a_stop(tok: Tokenizer) -> None:
    ids = tok.encode(STOP_TEXT)
    # One delta with every token and the engine's own finish: the stop string wins.
    engine = ScriptedEngine.from_ids(ids, per_step=len(ids), limits=LIMITS)
    service, registry = make_service(tok, engine)
    record = RequestRecord("r", ROUTE)
    chunks = asyncio.run(collect(service, prepared([1], stop=("STOP",)), record))
    assert "".join(texts(chunks)) == "Answer: yes. "
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
    chunks = asyncio.run(collect(service, prepared([1], stop=("🫠",)), record))
    assert "".join(texts(chunks)).rstrip() == "Hi"
    assert "🫠" not in "".join(texts(chunks))
    assert record.finish_reason == "stop"
    assert finished(registry, "stop") == 1


def test_engine_abort_finish_propagates(tok: Tokenizer) -> None:
    ids = tok.encode(TEXT)
    engine = ScriptedEngine([TokenDelta(ids[:3]), TokenDelta(ids[3:5], "abort")], limits=LIMITS)
    service, registry = make_service(tok, engine)
    record = RequestRecord("r", ROUTE)
    chunks = asyncio.run(collect(service, prepared([1]), record))
    assert "".join(texts(chunks)) == decode(tok, ids[:5])
    assert record.finish_reason == "abort"
    assert finished(registry, "abort") == 1


def test_consumer_closing_early_aborts_and_records_abort(tok: Tokenizer) -> None:
    ids = tok.encode(TEXT)
    engine = ScriptedEngine.from_ids(ids, finish_reason=None, limits=LIMITS)
    service, registry = make_service(tok, engine)
    record = RequestRecord("r", ROUTE)

    async def main() -> Chunk:
        generation = service.generate(prepared([1]), record)
        first = await generation.__aiter__().__anext__()
        await generation.aclose()
        assert generation.outcome is not None
        service.telemetry.finished(record, generation.outcome)
        return first

    first = asyncio.run(main())
    assert first.text == decode(tok, ids[:1])
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
        task = asyncio.ensure_future(collect(service, prepared([1]), record))
        while not engine.calls or record.first_token_at is None:
            await asyncio.sleep(0.001)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert engine.aborted == [record.engine_id]
    assert record.finish_reason == "abort"
    assert finished(registry, "abort") == 1
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
        asyncio.run(collect(service, prepared([1]), record))
    assert err.value.status == 400
    assert "out of range" in err.value.message
    assert record.finish_reason == "invalid"  # the client's fault: counted as invalid
    assert finished(registry, "invalid") == 1
    assert finished_total(registry) == 1
    assert service.abort_all() == 0


def test_engine_failure_propagates_and_is_recorded_as_error(tok: Tokenizer) -> None:
    engine = ScriptedEngine(
        [TokenDelta(tok.encode("Hi")), EngineError("GPU fell off")], limits=LIMITS
    )
    service, registry = make_service(tok, engine)
    record = RequestRecord("r", ROUTE)
    with pytest.raises(EngineError, match="GPU fell off"):
        asyncio.run(collect(service, prepared([1]), record))
    assert record.finish_reason == "error"
    assert finished(registry, "error") == 1
    assert finished_total(registry) == 1


def test_an_unexpected_failure_is_an_engine_error(
    tok: Tokenizer, caplog: pytest.LogCaptureFixture
) -> None:
    engine = ScriptedEngine([TokenDelta(tok.encode("Hi")), KeyError("bookkeeping")], limits=LIMITS)
    service, registry = make_service(tok, engine)
    record = RequestRecord("r", ROUTE)
    with pytest.raises(EngineError, match="generation failed"):
        asyncio.run(collect(service, prepared([1]), record))
    assert record.finish_reason == "error"
    assert finished_total(registry) == 1
    assert engine.aborted == [record.engine_id]


def test_abort_all_aborts_live_streams(tok: Tokenizer) -> None:
    engine = ScriptedEngine.from_ids(tok.encode(TEXT), finish_reason=None, limits=LIMITS)
    service, registry = make_service(tok, engine)
    records = [RequestRecord(f"r{i}", ROUTE) for i in range(2)]

    async def main() -> list[list[Chunk]]:
        tasks = [asyncio.ensure_future(collect(service, prepared([1]), r)) for r in records]
        while len(engine.calls) < 2 or any(r.first_token_at is None for r in records):
            await asyncio.sleep(0.001)
        assert service.abort_all() == 2
        return await asyncio.gather(*tasks)

    outputs = asyncio.run(main())
    assert all("".join(texts(o)) == TEXT for o in outputs)  # the whole script, then abort
    assert sorted(engine.aborted[:2]) == sorted(r.engine_id for r in records)
    assert all(r.finish_reason == "abort" for r in records)
    assert finished(registry, "abort") == 2
    assert finished_total(registry) == 2
    assert service.abort_all() == 0


# ---- complete ----


def test_complete_fills_the_record(tok: Tokenizer) -> None:
    ids = tok.encode(TEXT)
    engine = ScriptedEngine.from_ids(ids, finish_reason="stop", limits=LIMITS)
    service, registry = make_service(tok, engine)
    record = RequestRecord("r", ROUTE)

    async def connected() -> bool:
        return False

    out = asyncio.run(complete(service, prepared([1]), record, connected))
    assert out.logprobs is None  # not asked for
    assert (out.text, out.reason, record.finish_reason) == (TEXT, "stop", "stop")
    assert out.completion_tokens == record.completion_tokens == len(ids)
    assert finished_total(registry) == 1


def test_complete_returns_every_logprob(tok: Tokenizer) -> None:
    ids = tok.encode(TEXT)
    lps = [TokenLogprob(t, -1.0 * i) for i, t in enumerate(ids)]
    script = [TokenDelta(ids[:5], None, lps[:5]), TokenDelta(ids[5:], "length", lps[5:])]
    service, _ = make_service(tok, ScriptedEngine(script, limits=LIMITS))
    record = RequestRecord("r", ROUTE)
    out = asyncio.run(complete(service, prepared([1], logprobs=0), record))
    assert out.logprobs == tuple(lps)
    assert out.text == TEXT


def test_complete_aborts_when_the_client_leaves(tok: Tokenizer) -> None:
    engine = ScriptedEngine.from_ids(tok.encode(TEXT), finish_reason=None, limits=LIMITS)
    service, registry = make_service(tok, engine)
    record = RequestRecord("r", ROUTE)
    polls = 0

    async def gone() -> bool:
        nonlocal polls
        polls += 1
        return True

    asyncio.run(asyncio.wait_for(complete(service, prepared([1]), record, gone), 60))
    assert polls >= 1
    assert engine.aborted == [record.engine_id]
    assert engine.closed == [record.engine_id]
    assert record.finish_reason == "abort"
    assert finished(registry, "abort") == 1
    assert finished_total(registry) == 1
    assert service.abort_all() == 0


def test_complete_reraises_request_errors(tok: Tokenizer) -> None:
    engine = ScriptedEngine([EngineRequestError("bad prompt")], limits=LIMITS)
    service, registry = make_service(tok, engine)
    record = RequestRecord("r", ROUTE)
    with pytest.raises(RequestError, match="bad prompt"):
        asyncio.run(complete(service, prepared([1]), record))
    assert record.finish_reason == "invalid"
    assert finished_total(registry) == 1


def test_complete_reraises_engine_errors(tok: Tokenizer) -> None:
    engine = ScriptedEngine([EngineError("boom")], limits=LIMITS)
    service, registry = make_service(tok, engine)
    record = RequestRecord("r", ROUTE)
    with pytest.raises(EngineError, match="boom"):
        asyncio.run(complete(service, prepared([1]), record))
    assert (record.finish_reason, finished(registry, "error")) == ("error", 1)


# ---- telemetry and the double ----


def test_log_prompts_setting_reaches_telemetry(tok: Tokenizer) -> None:
    service, _ = make_service(tok, ScriptedEngine(limits=LIMITS), log_prompts=True)
    assert service.telemetry.log_prompts is True
    service, _ = make_service(tok, ScriptedEngine(limits=LIMITS))
    assert service.telemetry.log_prompts is False


def test_stream_logs_prompt_text_when_asked(
    tok: Tokenizer, caplog: pytest.LogCaptureFixture
) -> None:
    engine = ScriptedEngine.from_ids(tok.encode("Fine."), limits=LIMITS)
    service, _ = make_service(tok, engine, log_prompts=True)
    record = RequestRecord("r", ROUTE)

    with caplog.at_level("INFO", logger="mistral_serving.requests"):
        asyncio.run(collect(service, prepared([1]), record, prompt_text="How are you?"))
    (line,) = [r for r in caplog.records if r.name == "mistral_serving.requests"]
    assert (line.prompt, line.output, line.finish_reason) == ("How are you?", "Fine.", "length")


def test_prompt_text_shows_messages_by_role() -> None:
    gen = GenerationRequest(
        sampling=SamplingOptions(max_new_tokens=1),
        messages=(
            ChatMessage(role="system", content="S"),
            ChatMessage(role="user", content="U"),
        ),
    )
    assert gen.prompt_text == "system: S\nuser: U"
    assert GenerationRequest(SamplingOptions(1), prompt="p").prompt_text == "p"


def test_scripted_engine_satisfies_the_engine_protocol() -> None:
    from mistral_serving.engines.base import Engine

    assert isinstance(ScriptedEngine(), Engine)


def test_a_service_without_given_metrics_uses_the_settings_prefix(tok: Tokenizer) -> None:
    service = GenerationService(Settings(metrics_names="vllm"), tok, ScriptedEngine(limits=LIMITS))
    assert service.telemetry.metrics.e2e._name == "vllm:e2e_request_latency_seconds"
