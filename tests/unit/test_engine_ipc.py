"""The engine-process messages (`engines/process/ipc.py`): every message survives the
codec unchanged, anything else (garbage, a truncated or mutated frame, a pickle, the other
direction's message) is one `IpcError` and never runs code or raises anything else, and
each side acts on an unreadable message without harming the server: the proxy fails its
requests and reports unhealthy, the engine process shuts down."""

from __future__ import annotations

import asyncio
import logging
import pickle
import socket
import threading
import time
from collections.abc import Iterator
from multiprocessing.connection import Connection

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mistral_gpu_fallback.process import ipc, worker
from mistral_gpu_fallback.process.client import ProcessEngine
from mistral_serving.engines.base import (
    EngineError,
    EngineLimits,
    EngineRequestError,
    GuidedDecoding,
    SamplingOptions,
    TokenDelta,
    TokenLogprob,
)
from tests.doubles.process_proxy import FakeProc, process_proxy

DEADLINE_S = 60.0
LIMITS = EngineLimits(max_input_len=32, max_seq_len=64, max_batch_size=4)
READY = ipc.Ready(LIMITS, "replay", {}, 2, 100)

# ---- strategies for every message ----

ints = st.integers(min_value=-(2**63), max_value=2**63 - 1)
naturals = st.integers(min_value=0, max_value=2**63 - 1)
floats = st.floats(allow_nan=False)
texts = st.text(max_size=40)
token_ids = st.lists(naturals, max_size=8)
reasons = st.sampled_from([None, "stop", "length", "abort", "error"])

logprobs = st.builds(
    ipc.Logprob,
    naturals,
    st.none() | floats,
    st.lists(st.tuples(naturals, floats), max_size=3).map(tuple),
)
events = st.builds(
    ipc.Event,
    naturals,
    token_ids,
    reasons,
    st.none() | st.lists(logprobs, max_size=3),
    st.none() | st.builds(ipc.Error, st.sampled_from(["request", "engine"]), texts),
    st.none() | st.lists(logprobs, max_size=3),
)
sampling = st.builds(
    SamplingOptions,
    max_new_tokens=naturals,
    temperature=floats,
    top_k=naturals,
    top_p=floats,
    seed=st.none() | naturals,
    stop_token_ids=st.lists(naturals, max_size=4).map(tuple),
    ignore_eos=st.booleans(),
    logprobs=st.none() | naturals,
    prompt_logprobs=st.none() | naturals,
    guided=st.none()
    | st.builds(GuidedDecoding, st.sampled_from(["json_object", "json_schema"]), st.none() | texts),
)
to_engine = st.one_of(
    st.builds(ipc.Start, texts, texts, naturals, naturals, st.booleans()),
    st.builds(
        ipc.Start,
        texts,
        texts,
        naturals,
        naturals,
        st.booleans(),
        st.none(),
        st.none() | texts,
        floats,
    ),
    st.just(ipc.Join()),
    st.builds(ipc.Add, naturals, texts, token_ids, sampling),
    st.builds(ipc.Abort, texts),
    st.just(ipc.Shutdown()),
)
details = st.dictionaries(texts, st.none() | st.booleans() | ints | floats | texts, max_size=4)
from_engine = st.one_of(
    st.builds(
        ipc.Ready,
        st.builds(EngineLimits, naturals, naturals, naturals),
        texts,
        details,
        naturals,
        naturals,
    ),
    st.builds(ipc.Failed, texts, texts),
    st.builds(ipc.Step, st.lists(events, max_size=4), floats, naturals),
    st.builds(ipc.Gauges, floats, naturals),
    st.builds(ipc.Beat, floats),
    st.builds(ipc.Fatal, texts),
)


@given(to_engine)
def test_every_message_to_the_engine_survives_the_codec(message: ipc.ToEngine) -> None:
    assert ipc.decode_to_engine(ipc.encode(message)) == message


@given(from_engine)
def test_every_message_from_the_engine_survives_the_codec(message: ipc.FromEngine) -> None:
    assert ipc.decode_from_engine(ipc.encode(message)) == message


def _decodes_or_refuses(data: bytes) -> None:
    """The decoders' contract: one of the direction's messages, or IpcError, one line."""
    for decode in (ipc.decode_to_engine, ipc.decode_from_engine):
        try:
            decode(data)
        except ipc.IpcError as exc:
            assert "\n" not in str(exc) and str(exc).startswith("unreadable engine-process")


@settings(max_examples=500, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=256))
def test_garbage_is_an_ipc_error_and_nothing_else(data: bytes) -> None:
    _decodes_or_refuses(data)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(to_engine, from_engine), st.data())
def test_a_truncated_or_mutated_frame_is_an_ipc_error_or_a_message(
    message: ipc.ToEngine | ipc.FromEngine, data: st.DataObject
) -> None:
    frame = bytearray(ipc.encode(message))
    _decodes_or_refuses(bytes(frame[: data.draw(st.integers(0, len(frame) - 1))]))
    at = data.draw(st.integers(0, len(frame) - 1))
    frame[at] = data.draw(st.integers(0, 255))
    _decodes_or_refuses(bytes(frame))


def test_a_string_that_is_not_utf8_is_an_ipc_error() -> None:
    """msgspec raises UnicodeDecodeError (not a DecodeError) for one: found by fuzzing."""
    frame = ipc.encode(ipc.Abort("r"))
    assert frame.endswith(b"\xa1r")
    with pytest.raises(ipc.IpcError, match="unreadable"):
        ipc.decode_to_engine(frame[:-1] + b"\x80")


def test_each_decoder_takes_only_its_own_directions_messages() -> None:
    with pytest.raises(ipc.IpcError, match="unreadable"):
        ipc.decode_to_engine(ipc.encode(ipc.Beat(1.0)))
    with pytest.raises(ipc.IpcError, match="unreadable"):
        ipc.decode_from_engine(ipc.encode(ipc.Abort("r1")))


def test_a_field_of_the_wrong_type_is_refused_with_where_it_is() -> None:
    bad = msgspec.msgpack.encode(["add", 1, "r1", [1, "two"], {"max_new_tokens": 4}])
    with pytest.raises(ipc.IpcError, match=r"prompt_ids|\$\[3\]\[1\]"):
        ipc.decode_to_engine(bad)
    bad = msgspec.msgpack.encode(["add", 1, "r1", [1], {"max_new_tokens": 4, "guided": 7}])
    with pytest.raises(ipc.IpcError, match="guided"):
        ipc.decode_to_engine(bad)


class _Boom:
    ran = False

    def __reduce__(self) -> tuple[object, tuple[()]]:
        return (_Boom.explode, ())

    @staticmethod
    def explode() -> None:
        _Boom.ran = True


def test_a_pickle_is_refused_and_never_runs() -> None:
    for payload in (pickle.dumps(("shutdown",)), pickle.dumps(_Boom())):
        _decodes_or_refuses(payload)
        with pytest.raises(ipc.IpcError):
            ipc.decode_to_engine(payload)
    assert not _Boom.ran


def test_errors_cross_as_a_kind_and_a_text() -> None:
    cases = [
        (EngineRequestError("prompt too long"), EngineRequestError, "prompt too long"),
        (EngineError("step failed"), EngineError, "step failed"),
        (KeyError("x"), EngineError, "PyTorch engine failed: KeyError('x')"),
    ]
    for exc, kind, text in cases:
        event = ipc.decode_from_engine(ipc.encode(ipc.Step([ipc.error_event(3, exc)], 0.0, 0)))
        assert isinstance(event, ipc.Step) and ipc.is_last(event.events[0])
        item = ipc.event_item(event.events[0])
        assert type(item) is kind and str(item) == text


def test_deltas_cross_unchanged() -> None:
    delta = TokenDelta(
        [5, 6],
        "length",
        [TokenLogprob(5, -0.5, ((5, -0.5), (9, -1.0))), TokenLogprob(6, -0.25)],
        [TokenLogprob(1, None), TokenLogprob(2, -3.0, ((2, -3.0),))],
    )
    step = ipc.decode_from_engine(ipc.encode(ipc.Step([ipc.delta_event(7, delta)], 0.5, 1)))
    assert isinstance(step, ipc.Step) and step.events[0].key == 7
    assert ipc.event_item(step.events[0]) == delta
    plain = ipc.event_item(ipc.delta_event(7, TokenDelta([1])))
    assert plain == TokenDelta([1]) and not ipc.is_last(ipc.delta_event(7, TokenDelta([1])))


def test_a_start_up_failure_reads_as_before() -> None:
    assert ipc.Failed("OSError", "no such file").describe() == "OSError: no such file"
    assert ipc.Failed("MemoryError", "").describe() == "MemoryError"


# ---- each side, fed an unreadable message ----


@pytest.fixture
def proxy() -> Iterator[tuple[ProcessEngine, Connection, FakeProc]]:
    with process_proxy(LIMITS) as parts:
        yield parts


def wait_until(check: object, what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_garbage_from_the_engine_process_fails_its_requests_not_the_server(
    proxy: tuple[ProcessEngine, Connection, FakeProc], caplog: pytest.LogCaptureFixture
) -> None:
    engine, child, proc = proxy
    outcome: dict[str, BaseException | list[int]] = {}

    async def consume() -> None:
        got: list[int] = []
        try:
            async for delta in engine.generate("r1", [1, 2], SamplingOptions(max_new_tokens=4)):
                got += delta.token_ids
        except BaseException as exc:  # noqa: BLE001 - what the stream ended with
            outcome["error"] = exc
        outcome["tokens"] = got

    thread = threading.Thread(target=lambda: asyncio.run(consume()), daemon=True)
    with caplog.at_level(logging.ERROR, logger="mistral_gpu_fallback.process.client"):
        thread.start()
        add = ipc.decode_to_engine(child.recv_bytes())
        assert isinstance(add, ipc.Add)
        child.send_bytes(ipc.encode(ipc.Step([ipc.Event(add.key, [7])], 0.1, 1)))
        child.send_bytes(b"\x93\xa4step\xff\x00")  # not a message of ours
        thread.join(DEADLINE_S)
    assert outcome["tokens"] == [7]  # what came before the garbage was delivered
    error = outcome["error"]
    assert isinstance(error, EngineError) and "unreadable message" in str(error)
    assert proc.returncode == -9  # the child was killed, not trusted further
    assert not engine.is_healthy()
    assert any("unreadable engine-process message" in r.getMessage() for r in caplog.records)


class _Engine:
    """What the worker's request loop calls on its engine."""

    def __init__(self) -> None:
        self.aborted: list[str] = []

    def submit(self, *args: object) -> None:
        raise AssertionError("nothing is submitted in this test")

    def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)


def test_garbage_from_the_server_shuts_the_engine_process_down(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ours, theirs = socket.socketpair()
    server, child = Connection(ours.detach()), Connection(theirs.detach())
    engine = _Engine()
    server.send_bytes(ipc.encode(ipc.Abort("r1")))
    server.send_bytes(pickle.dumps(("abort", "r2")))
    server.send_bytes(ipc.encode(ipc.Abort("r3")))  # never read: it stopped before
    with caplog.at_level(logging.ERROR, logger="mistral_gpu_fallback.process.worker"):
        outbox = worker.Outbox(child)
        owner = worker._Peer(child, 0, outbox)
        worker._Requests(engine, READY, worker.Fanout([outbox]), owner).serve(None, 0.0)  # type: ignore[arg-type]
    assert engine.aborted == ["r1"]
    assert any("shutting the engine down" in r.getMessage() for r in caplog.records)
    server.close()
    child.close()
