"""The messages between the server and the engine process, and their codec.

Every message is a typed `msgspec.Struct` encoded with MessagePack (as vLLM's engine core
does: no pickle across the pipe, so a message can only ever become one of the types
below). Each is an array whose first element is its tag (`"add"`, `"step"`, ...), and the
decoder of each direction accepts only that direction's messages, every field checked
against its type: anything else raises `IpcError`, one line.

Server -> engine process (`ToEngine`):
    Start       the first message: model dir, settings (as JSON), EOS id, log level/format,
                and where other front-ends may join (`sharing.py`)
    Join        a guest front-end's first message on the shared engine's socket
    Add         key, request id, prompt ids, SamplingOptions
    Abort       request id
    Shutdown
Engine process -> server (`FromEngine`):
    Ready       limits, info name and details, EOS id, vocab size
    Failed      start-up failed (the exception's type and text); the process exits
    Step        one per engine step: every request's event, KV-cache usage, running count
    Gauges      KV-cache usage and running count, when they change between steps
    Beat        every HEARTBEAT_S: the engine's own stalled_for (a stopped or wedged
                process sends none: the server counts the silence)
    Fatal       the step loop died; the process exits

An `Event` is one request's part of a step: new token ids, finish reason, logprobs and
prompt logprobs (`Logprob`s) or an `Error` (kind "request": the client's fault, a 4xx;
kind "engine": anything else). `SamplingOptions` and `EngineLimits` cross as the engine
interface's own dataclasses (`engines/base.py`), decoded and type-checked field by field.
"""

from __future__ import annotations

from typing import Any, Literal, TypeAlias

import msgspec

from mistral_serving.engines.base import (
    EngineError,
    EngineLimits,
    EngineRequestError,
    FinishReason,
    SamplingOptions,
    TokenDelta,
    TokenLogprob,
)

HEARTBEAT_S = 0.5  # how often the engine process sends a Beat, busy or idle
MAX_SHOWN = 200  # characters of a decode error kept in IpcError's message


class IpcError(ValueError):
    """A message that is not one of this direction's types (garbage, a truncated frame,
    a field of the wrong type). The message is one line."""


class _Record(msgspec.Struct, array_like=True):
    """Arrays, not maps: smaller and faster; the field order is the schema."""


class _Message(_Record, tag_field="kind"):
    """A whole message: its tag first, then its fields."""


# ---- server -> engine process ----


class Start(_Message, tag="start"):
    model_dir: str
    settings_json: str  # Settings.model_dump_json(): validated again in the child
    eos_token_id: int
    log_level: int
    log_json: bool
    # The Artifact's parsed config.json (the server read it once); None: the child reads
    # the directory's own (an engine started from a bare directory).
    config: dict[str, Any] | None = None
    # A shared engine (`sharing.py`): the Unix socket guest front-ends join on, and how
    # long a Shutdown from this (the owner) front-end waits for them to leave first.
    guests_address: str | None = None
    guests_wait_s: float = 0.0


class Join(_Message, tag="join"):
    pass


class Add(_Message, tag="add"):
    key: int
    request_id: str
    prompt_ids: list[int]
    sampling: SamplingOptions


class Abort(_Message, tag="abort"):
    request_id: str


class Shutdown(_Message, tag="shutdown"):
    pass


# ---- engine process -> server ----


class Logprob(_Record):
    token_id: int
    logprob: float | None
    top: tuple[tuple[int, float], ...] = ()


class Error(_Record):
    kind: Literal["request", "engine"]
    text: str


class Event(_Record):
    key: int
    token_ids: list[int]
    finish_reason: FinishReason | None = None
    logprobs: list[Logprob] | None = None
    error: Error | None = None
    prompt_logprobs: list[Logprob] | None = None


Detail: TypeAlias = str | int | float | bool | None


class Ready(_Message, tag="ready"):
    limits: EngineLimits
    name: str
    details: dict[str, Detail]
    eos_token_id: int
    vocab_size: int


class Failed(_Message, tag="failed"):
    exc_type: str
    text: str

    def describe(self) -> str:
        """ "Type: message" (only the type when the message is empty)."""
        return f"{self.exc_type}: {self.text}" if self.text else self.exc_type


class Step(_Message, tag="step"):
    events: list[Event]
    kv_cache_usage: float
    num_running: int


class Gauges(_Message, tag="gauges"):
    kv_cache_usage: float
    num_running: int


class Beat(_Message, tag="beat"):
    stalled_for: float


class Fatal(_Message, tag="fatal"):
    text: str


ToEngine: TypeAlias = Start | Join | Add | Abort | Shutdown
FromEngine: TypeAlias = Ready | Failed | Step | Gauges | Beat | Fatal

_encoder = msgspec.msgpack.Encoder()
_to_engine: msgspec.msgpack.Decoder[ToEngine] = msgspec.msgpack.Decoder(ToEngine)
_from_engine: msgspec.msgpack.Decoder[FromEngine] = msgspec.msgpack.Decoder(FromEngine)


def encode(message: ToEngine | FromEngine) -> bytes:
    """Not thread-safe by itself (one shared encoder): callers hold their send lock."""
    return _encoder.encode(message)


# What msgspec raises on bytes that are not a message: DecodeError (ValidationError is one
# too), and UnicodeDecodeError for a string field that is not UTF-8 (found by fuzzing).
_UNREADABLE = (msgspec.DecodeError, UnicodeDecodeError)


def _unreadable(exc: Exception, data: bytes) -> IpcError:
    text = " ".join(str(exc).split())[:MAX_SHOWN]
    return IpcError(f"unreadable engine-process message ({len(data)} bytes): {text}")


def decode_to_engine(data: bytes) -> ToEngine:
    try:
        return _to_engine.decode(data)
    except _UNREADABLE as exc:
        raise _unreadable(exc, data) from None


def decode_from_engine(data: bytes) -> FromEngine:
    try:
        return _from_engine.decode(data)
    except _UNREADABLE as exc:
        raise _unreadable(exc, data) from None


# ---- between the messages and the engine interface's own types ----


def _wire_logprobs(lps: list[TokenLogprob] | None) -> list[Logprob] | None:
    return None if lps is None else [Logprob(p.token_id, p.logprob, p.top) for p in lps]


def _logprobs(lps: list[Logprob] | None) -> list[TokenLogprob] | None:
    return None if lps is None else [TokenLogprob(p.token_id, p.logprob, p.top) for p in lps]


def delta_event(key: int, delta: TokenDelta) -> Event:
    return Event(
        key,
        delta.token_ids,
        delta.finish_reason,
        _wire_logprobs(delta.logprobs),
        None,
        _wire_logprobs(delta.prompt_logprobs),
    )


def error_event(key: int, exc: BaseException) -> Event:
    """What the server raises from that request's stream: EngineRequestError for its
    inputs (a 4xx), EngineError for anything else (as `base.read_stream` words it)."""
    if isinstance(exc, EngineRequestError):
        return Event(key, [], error=Error("request", str(exc)))
    if isinstance(exc, EngineError):
        return Event(key, [], error=Error("engine", str(exc)))
    return Event(key, [], error=Error("engine", f"PyTorch engine failed: {exc!r}"))


def event_item(event: Event) -> TokenDelta | EngineError | EngineRequestError:
    """The event as its stream's queue takes it: a delta, or the error it ends with."""
    if event.error is not None:
        text = event.error.text
        return EngineRequestError(text) if event.error.kind == "request" else EngineError(text)
    if event.logprobs is None and event.prompt_logprobs is None:
        return TokenDelta(event.token_ids, event.finish_reason)
    return TokenDelta(
        event.token_ids,
        event.finish_reason,
        _logprobs(event.logprobs),
        _logprobs(event.prompt_logprobs),
    )


def is_last(event: Event) -> bool:
    """The request's last event: it finished, or it failed."""
    return event.finish_reason is not None or event.error is not None
