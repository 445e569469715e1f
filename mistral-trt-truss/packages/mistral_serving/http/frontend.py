"""Between the Truss adapter and the wire formats: one place for what every route does.

For each request: a bounded request id, the cheap refusals first (draining: 503; no slot
and no queue place: 503 with Retry-After, this replica being saturated, decided before
the body is even decoded, so a refusal costs the same for any prompt), then the body (strict JSON, `protocols/body.py`) and the wire
format's parse, a slot (admission), tokenization (in the service, off the event loop),
and the answer: JSON, or a stream whose slot is released when it ends however it ends.
Every request is counted once in `request_finished_total` with its reason. The drain
(SIGTERM) is wired here too, and the engine is shut down when the server stops.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi import HTTPException, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Send

from mistral_serving.engines.base import EngineError
from mistral_serving.errors import RequestError
from mistral_serving.generation import deadline
from mistral_serving.generation.admission import (
    RETRY_AFTER_SECONDS,
    Admission,
    ClientGone,
    Draining,
    Overloaded,
    Ticket,
)
from mistral_serving.generation.outcome import Outcome
from mistral_serving.generation.service import Generation, GenerationService
from mistral_serving.http.scope_keys import CUT_EXTENSION, HANDLED, LEFT_EXTENSION
from mistral_serving.http.server_state import DEAD, DRAINING, READY, STARTING
from mistral_serving.ops.collector import freeze_loaded_objects, time_collections
from mistral_serving.ops.gateway_headers import gateway_context
from mistral_serving.ops.metrics import Metrics, default_metrics
from mistral_serving.ops.record import REQUEST_ID_HEADER, RequestRecord, request_id_from
from mistral_serving.ops.shutdown import Drainer
from mistral_serving.ops.tracing import TRACEPARENT, TRACESTATE
from mistral_serving.protocols import Call, ParseContext, TruncatedStream, WireFormat
from mistral_serving.protocols.anthropic.format import MessagesFormat
from mistral_serving.protocols.anthropic.types import anthropic_error_body
from mistral_serving.protocols.body import decode_json_object
from mistral_serving.protocols.openai.chat import ChatCompletionsFormat
from mistral_serving.protocols.openai.completions import CompletionsFormat
from mistral_serving.protocols.openai.types import openai_error_body
from mistral_serving.protocols.predict import PredictFormat
from mistral_serving.protocols.responses.format import ResponsesFormat
from mistral_serving.protocols.responses.store import ResponseStore
from mistral_serving.settings import Settings

log = logging.getLogger(__name__)

# Bodies larger than this are decoded in a worker thread.
INLINE_DECODE_BYTES = 64 * 1024


# Where the launcher (`server.main`) leaves the Frontend it made in the config dict that
# Truss hands, unchanged, to the model's constructor: the launcher is the frontend's one
# owner, and the model and the server's own routes serve the same object.
FRONTEND_CONFIG_KEY = "mistral_serving.http.frontend"


def frontend_for(config: dict[str, Any]) -> Frontend:
    """The frontend the launcher made for this Truss config; without a launcher (Truss's
    own `main.py`), a new one from the config's settings."""
    made = config.get(FRONTEND_CONFIG_KEY)
    if isinstance(made, Frontend):
        return made
    return Frontend(Settings.load(config.get("model_metadata")))


class _SlowReader(Exception):
    """The client fell `stream_buffer_bytes` behind."""


class _WriteClock:
    """A time limit on each write without a timer (and, in Python 3.11's
    `asyncio.wait_for`, a task) per write: one timer per stream, re-armed when it fires,
    that cancels the writing task once a write has waited `limit_s` (then the write
    raises TimeoutError)."""

    def __init__(self, limit_s: float) -> None:
        self._limit_s = limit_s
        self._loop = asyncio.get_running_loop()
        self._task = asyncio.current_task()
        self._since: float | None = None  # when the write in progress began
        self._timer: asyncio.TimerHandle | None = None
        self._expired = False

    async def timed(self, write: Awaitable[None]) -> None:
        self._since = self._loop.time()
        if self._timer is None:
            self._timer = self._loop.call_at(self._since + self._limit_s, self._check)
        try:
            await write
        except asyncio.CancelledError:
            if not self._expired or self._task is None:
                raise
            # Ours becomes the TimeoutError; a cancel from elsewhere at the same time (a
            # shutdown) stays a cancel, as asyncio.timeout does it.
            if self._task.uncancel() > 0:
                raise
            raise TimeoutError from None
        finally:
            self._since = None

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _check(self) -> None:
        now = self._loop.time()
        since = self._since
        if since is not None and now - since >= self._limit_s and self._task is not None:
            self._timer = None
            self._expired = True
            self._task.cancel()  # it is waiting in the write (`_since` is set only there)
            return
        self._timer = self._loop.call_at(
            (now if since is None else since) + self._limit_s, self._check
        )


class _Stream(StreamingResponse):
    """A streaming answer that, when cut short, ends without HTTP's closing chunk: the
    client sees an incomplete body (e.g. requests' ChunkedEncodingError), not a
    complete answer.

    The body is pulled as the engine makes it, not as the client reads: what the client
    has not taken yet waits here, up to `buffer_bytes` (the socket's buffers come on top). A client that falls further behind, or does
    not take a write within `write_timeout_s`, is a slow reader: `on_slow_reader` runs,
    the connection is dropped and the body (hence the engine request) is closed."""

    def __init__(
        self,
        content: AsyncIterator[str],
        *,
        write_timeout_s: float,
        buffer_bytes: int,
        on_slow_reader: Callable[[], None] | None,
        **kwargs: Any,
    ) -> None:
        super().__init__(content, **kwargs)
        self.write_timeout_s = write_timeout_s
        self.buffer_bytes = buffer_bytes
        self.on_slow_reader = on_slow_reader
        self._cut: Callable[[bool], None] | None = None
        self._left = False  # the client's connection closed (LEFT_EXTENSION)
        self._ready = asyncio.Event()  # the writer's wake-up: a chunk, the body's end, _left

    async def __call__(self, scope: Any, receive: Any, send: Send) -> None:
        # The server's ways to end a response unfinished on purpose and to say that the
        # client left (http_limits); absent in-process (TestClient), where returning early
        # has the same effect and Starlette's own task waits on `receive` for a disconnect.
        extensions = scope.get("extensions") or {}
        self._cut = extensions.get(CUT_EXTENSION)
        watch = extensions.get(LEFT_EXTENSION)
        if watch is None:
            await super().__call__(scope, receive, send)
            return
        # The protocol says when the client leaves: no listener task and no task group per
        # stream (docs/performance.md, round 11).
        unwatch = watch(self._client_left)
        try:
            await self.stream_response(send)
        finally:
            unwatch()
        if self.background is not None:
            await self.background()

    def _client_left(self) -> None:
        self._left = True
        self._ready.set()  # the writer wakes, stops, and the body (engine request) is closed

    async def stream_response(self, send: Send) -> None:
        await send(
            {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
        )
        pending: collections.deque[bytes] = collections.deque()
        held = 0  # bytes in `pending`
        ready = self._ready

        async def pull() -> None:
            nonlocal held
            try:
                async for chunk in self.body_iterator:
                    data = chunk.encode() if isinstance(chunk, str) else bytes(chunk)
                    pending.append(data)
                    held += len(data)
                    ready.set()
                    if held > self.buffer_bytes:
                        self._slow()  # before the body closes: its end says why
                        raise _SlowReader
            finally:
                ready.set()
                await self.body_iterator.aclose()  # type: ignore[attr-defined]

        puller = asyncio.ensure_future(pull())
        puller.add_done_callback(self._pulled)
        clock = _WriteClock(self.write_timeout_s)
        try:
            while True:
                if not pending and not puller.done() and not self._left:
                    await ready.wait()
                    ready.clear()
                if self._left:
                    return  # nothing more can reach it; the puller is cancelled below
                if pending:
                    # Everything made so far in one write (same bytes, same order; nothing
                    # waits for a later event): writes per event were the stream's top cost.
                    data = pending.popleft() if len(pending) == 1 else b"".join(pending)
                    pending.clear()
                    held = 0
                    message = {"type": "http.response.body", "body": data, "more_body": True}
                    await clock.timed(send(message))
                elif puller.done():
                    break
            puller.result()
        except TruncatedStream:
            self._end(abort=False)  # the server closes the connection with the body unfinished
            return
        except (TimeoutError, _SlowReader):
            self._slow()
            return
        finally:
            clock.stop()
            puller.cancel()  # no-op when done; else the body is closed (engine abort) by it
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    def _pulled(self, task: asyncio.Future[None]) -> None:
        # Fell too far behind while a write was waiting: drop the connection now (the
        # waiting write then returns), not when the write timeout runs out.
        if not task.cancelled() and isinstance(task.exception(), _SlowReader):
            self._slow()

    def _slow(self) -> None:
        if self.on_slow_reader is not None:
            on_slow, self.on_slow_reader = self.on_slow_reader, None  # once
            on_slow()
            self._end(abort=True)

    def _end(self, abort: bool) -> None:
        if self._cut is not None:
            self._cut(abort)


class Frontend:
    def __init__(self, settings: Settings, metrics: Metrics | None = None) -> None:
        self.settings = settings
        self.metrics = metrics or default_metrics(settings.metrics_prefix)
        self.admission = Admission(settings.max_inflight, settings.max_waiting, self.metrics)
        self.drainer = Drainer(
            settings.drain_grace_seconds,
            self._stop_admitting,
            self._abort_all,
            settings.drain_listen_seconds,
        )
        self.service: GenerationService | None = None
        self.formats: dict[str, WireFormat] = {}
        self.load_error: str | None = None  # why load() failed: the process's last log line

    # ---- lifecycle ----

    def load(self, hf_token: str | None) -> None:
        time_collections(self.metrics.gc_pause)
        try:
            service = GenerationService.start(self.settings, hf_token, self.metrics)
        except Exception as exc:
            self.load_error = one_line(exc)
            raise
        self.attach(service)
        freeze_loaded_objects()  # later full collections skip the imports and the model

    def attach(self, service: GenerationService) -> None:
        """Serve with this (started) service."""
        table = service.tokenizer.table

        def token_bytes(token_id: int) -> bytes:
            return table.token_bytes[token_id] or b""

        name = self.settings.served_model_name
        self.formats = {
            "predict": PredictFormat(),
            "chat_completions": ChatCompletionsFormat(
                name, token_bytes, service.tokenizer.tool_format
            ),
            "completions": CompletionsFormat(name, token_bytes),
            "responses": ResponsesFormat(
                name, service.tokenizer.tool_format, self._response_store(), self._miss_hint()
            ),
            "messages": MessagesFormat(name, service.tokenizer.tool_format),
        }
        self.service = service
        engine = service.engine
        self.metrics.bind_engine(engine)

    def _response_store(self) -> ResponseStore:
        s = self.settings
        return ResponseStore(
            s.responses_store_max_entries,
            s.responses_store_max_bytes,
            s.responses_store_max_age_seconds,
        )

    def _miss_hint(self) -> str:
        """Why an id stored a moment ago may be missed (named in the 404)."""
        n = self.settings.frontend_processes
        return f"; this server has {n} front-end processes, each storing its own" if n > 1 else ""

    @property
    def ready(self) -> bool:
        service = self.service
        return (
            service is not None
            and not self.drainer.draining
            and service.is_healthy()
            and service.stalled() is None  # the watchdog: a hung engine is not ready
        )

    def state(self) -> str:
        """The lifecycle state every 503 and /health say (http/server_state.py)."""
        service = self.service
        if service is None:
            return DEAD if self.load_error else STARTING
        if not service.is_healthy() or service.stalled() is not None:
            return DEAD
        return DRAINING if self.drainer.draining else READY

    async def is_healthy(self) -> bool:
        self.drainer.install()  # here: the first call on the server's main-thread loop
        if self.service is None:
            return False
        if not self.service.is_healthy():
            self.drainer.engine_died()
            return False
        if self.service.stalled() is not None:
            return False  # hung, not dead: ready again if it moves (or the watchdog exits)
        return not self.drainer.draining

    def shutdown(self) -> None:
        """The server is exiting: stop the engine (and its executor processes)."""
        if self.service is not None:
            log.info("shutting the engine down")
            self.service.shutdown()

    def _stop_admitting(self) -> None:
        self.admission.draining = True

    def _abort_all(self) -> int:
        return self.service.abort_all() if self.service else 0

    # ---- requests ----

    async def handle(self, route: str, request: Request) -> Response:
        self.drainer.install()
        handled = request.scope.get(HANDLED)
        if handled is not None:
            handled.append(True)  # counted from here on (the body guard needs to know)
        service = self.service
        fmt = self.formats.get(route)
        if service is None or fmt is None:
            # Truss calls the model only once load() has finished (else it answers 503
            # itself, as ModelNotReady); this is that answer, should one slip through.
            raise HTTPException(503, "the model is loading")
        record = RequestRecord(
            request_id_from(request.headers.get(REQUEST_ID_HEADER)),
            route,
            traceparent=request.headers.get(TRACEPARENT),
            tracestate=request.headers.get(TRACESTATE),
        )
        headers = {REQUEST_ID_HEADER: record.request_id}
        ticket: Ticket | None = None
        try:
            self._refuse_early()
            self._read_gateway(request, record)
            record.deadline = deadline.deadline_for(
                request.headers, self.settings.request_timeout_seconds, record.arrived_at
            )
            body = await _read_json(request)
            call = fmt.parse(
                body,
                ParseContext(self.settings.default_max_tokens),
            )
            record.parsed_at = time.monotonic()
            admitted = self._admit(request, record.priority)
            ticket = await deadline.within(record.deadline, admitted, "while queued")
            service.telemetry.admitted(record)
            prepared = await service.prepare(call.gen, record.deadline, request.is_disconnected)
            deadline.check(record.deadline, "before generation began")
        except RequestError as err:
            if ticket is not None:
                ticket.release()
            return self._refuse(fmt, err, record, headers)
        # Only logged with log_prompts: joining a large chat's messages is not free.
        prompt_text = call.gen.prompt_text if self.settings.log_prompts else None
        generation = service.generate(prepared, record)
        if call.stream:
            events = fmt.stream_events(call, generation, record.engine_id)
            return self._streaming_response(
                generation, events, ticket, record, fmt.stream_media_type, headers, prompt_text
            )
        return await self._whole_response(
            request, fmt, call, generation, ticket, record, headers, prompt_text
        )

    async def _whole_response(
        self,
        request: Request,
        fmt: WireFormat,
        call: Call,
        generation: Generation,
        ticket: Ticket,
        record: RequestRecord,
        headers: dict[str, str],
        prompt_text: str | None,
    ) -> Response:
        """A non-streamed answer: generated to its end, then the slot freed and the
        request finished; an answer cut short is the route's error beside it."""
        try:
            outcome = await generation.complete(request.is_disconnected)
        except (RequestError, EngineError) as exc:
            failed = exc if isinstance(exc, RequestError) else _generation_failed(exc)
            self._finish(record, generation.outcome or generation.cut(), prompt_text)
            return _error_response(fmt, failed, headers)
        finally:
            ticket.release()
        self._finish(record, outcome, prompt_text)
        answer = fmt.response_body(call, outcome, record.engine_id)
        if outcome.reason == "abort":
            return _cut_response(fmt, answer, headers)
        if outcome.reason == deadline.FINISH_REASON:
            return _cut_response(fmt, answer, headers, deadline.cut_short())
        return JSONResponse(answer, headers=headers)

    async def count_tokens(self, request: Request) -> Response:
        """`POST /v1/messages/count_tokens`: the prompt's tokens as `/v1/messages` would
        encode them; nothing is generated, so no slot is taken."""
        fmt, service = self.formats.get("messages"), self.service
        headers = {REQUEST_ID_HEADER: request_id_from(request.headers.get(REQUEST_ID_HEADER))}
        route = "messages_count_tokens"
        if service is None or not isinstance(fmt, MessagesFormat):
            return JSONResponse(status_code=503, content=anthropic_error_body(_loading()))
        try:
            if self.drainer.draining:
                raise _draining()
            gen = fmt.parse_count(await _read_json(request))
            count = len(await service.prompt_ids(gen))
        except RequestError as err:
            self.metrics.finished.labels(route, err.finish_reason).inc()
            return _error_response(fmt, err, headers)
        self.metrics.finished.labels(route, "stop").inc()
        return JSONResponse(fmt.count_body(count), headers=headers)

    def stored_response(self, method: str, response_id: str) -> Response:
        """`GET` or `DELETE /v1/responses/{id}`: a stored Responses API answer."""
        fmt = self.formats.get("responses")
        if not isinstance(fmt, ResponsesFormat):
            return JSONResponse(status_code=503, content=openai_error_body(_loading()))
        try:
            body = fmt.delete(response_id) if method == "DELETE" else fmt.stored(response_id)
        except RequestError as err:
            return _error_response(fmt, err, {})
        return JSONResponse(body)

    def _finish(self, record: RequestRecord, outcome: Outcome, prompt: str | None = None) -> None:
        """The one place a request's record is closed (counted, logged, traced)."""
        service = self.service
        assert service is not None  # a request is handled only once loaded
        service.telemetry.finished(record, outcome, prompt)

    def _refuse(
        self, fmt: WireFormat, err: RequestError, record: RequestRecord, headers: dict[str, str]
    ) -> Response:
        self._finish(record, Outcome(err.finish_reason))
        if err.status == 499:
            return Response(status_code=499, headers=headers)
        return _error_response(fmt, err, headers)

    def early_refusal(self) -> RequestError | None:
        """503 while draining or when no slot and no queue place is free: decided before
        the body is read or decoded (the body guard asks too), so a refusal costs the
        same for any body."""
        refused = self.admission.refusal()
        if isinstance(refused, Draining):
            return _draining()
        if isinstance(refused, Overloaded):
            return self._overloaded()
        return None

    def _refuse_early(self) -> None:
        if (err := self.early_refusal()) is not None:
            raise err

    def _read_gateway(self, request: Request, record: RequestRecord) -> None:
        """The gateway's headers, onto the record (logged, traced); the objective's priority
        orders the queue (a name the settings do not know is 0, as with the router)."""
        context = gateway_context(request.headers)
        record.objective = context.objective
        record.fairness_id = context.fairness_id
        record.session_id = context.session_id
        if context.objective is not None:
            record.priority = self.settings.objective_priorities.get(context.objective, 0)

    async def _admit(self, request: Request, priority: int = 0) -> Ticket:
        try:
            return await self.admission.acquire(request.is_disconnected, priority=priority)
        except Overloaded:
            raise self._overloaded() from None
        except Draining:
            raise _draining() from None
        except ClientGone:
            raise RequestError("client disconnected while waiting", status=499) from None

    def _overloaded(self) -> RequestError:
        # Saturation is this replica's state, not the client's fault: 503, which gateways
        # retry on another pod (429 says a tenant is over its quota: http/key_limit.py).
        return RequestError(
            f"this replica is at capacity ({self.admission.max_inflight} running, "
            f"{self.admission.max_waiting} waiting); retry, on another replica if you can",
            status=503,
            code="server_overloaded",
            headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
        )

    def _streaming_response(
        self,
        generation: Generation,
        events: AsyncIterator[str],
        ticket: Ticket,
        record: RequestRecord,
        media_type: str,
        headers: dict[str, str],
        prompt_text: str | None,
    ) -> StreamingResponse:
        started = []
        slow: list[bool] = []
        tokens = self.metrics.generation_tokens

        async def body() -> AsyncIterator[str]:
            started.append(True)
            record.stream_started_at = time.monotonic()
            try:
                async for event in events:
                    # Counted as they are sent, so rate() follows long streams.
                    tokens.inc(generation.completion_tokens - record.tokens_counted)
                    record.tokens_counted = generation.completion_tokens
                    yield event
            except (EngineError, RequestError):
                # Past the status line a failure can only cut the body (the predict
                # format has no in-band error; OpenAI's handles RequestError itself).
                log.warning("request %s: generation failed mid-stream", record.request_id)
                raise TruncatedStream("error") from None
            finally:
                ticket.release()
                await generation.aclose()  # a stream cut here stops generating now
                self._finish(record, _stream_outcome(generation, bool(slow)), prompt_text)

        def slow_reader() -> None:
            slow.append(True)
            log.warning("request %s: client stopped reading; stream aborted", record.request_id)

        def gone() -> None:
            # If the body never started (client gone before the first byte), nothing
            # reached the engine: free the slot and still count and log the request.
            ticket.release()
            if not started:
                self._finish(record, generation.cut().because("client_gone"), prompt_text)

        response = _Stream(
            body(),
            write_timeout_s=self.settings.stream_write_timeout_seconds,
            buffer_bytes=self.settings.stream_buffer_bytes,
            on_slow_reader=slow_reader,
            media_type=media_type,
            headers=headers,
        )
        weakref.finalize(response, gone)
        return response


def _stream_outcome(generation: Generation, slow: bool) -> Outcome:
    """How a stream's request ended, once its body is done (`slow`: its client stopped
    reading)."""
    outcome = generation.outcome
    if outcome is None:
        # Left before generation started (e.g. while the chat role chunk was
        # written): nothing reached the engine.
        return generation.cut().because("slow_reader" if slow else "client_gone")
    if slow and outcome.reason == "abort":
        return outcome.because("slow_reader")
    return outcome


def _generation_failed(exc: EngineError) -> RequestError:
    return RequestError(f"generation failed: {exc}", status=500)


def _loading() -> RequestError:
    return RequestError("the model is loading", status=503)


def _draining() -> RequestError:
    return RequestError("server is shutting down; retry on another replica", status=503)


def _cut_response(
    fmt: WireFormat,
    answer: dict[str, Any],
    headers: dict[str, str],
    err: RequestError | None = None,
) -> Response:
    """A non-streamed answer cut short is not a success: the drain's grace period ran out
    (503) or the request's deadline passed (504, `err`); the route's error, and the
    partial answer beside it (finish_reason "abort" / "timeout")."""
    if err is None:
        err = RequestError(
            "the answer was cut short (the server is shutting down); the partial answer is "
            "included; retry on another replica",
            status=503,
        )
    return JSONResponse(
        status_code=err.status, content=answer | fmt.error_body(err), headers=headers
    )


def _error_response(fmt: WireFormat, err: RequestError, headers: dict[str, str]) -> JSONResponse:
    return JSONResponse(
        status_code=err.status, content=fmt.error_body(err), headers=headers | err.headers
    )


async def _read_json(request: Request) -> dict[str, Any]:
    raw = await request.body()
    if len(raw) > INLINE_DECODE_BYTES:
        return await asyncio.to_thread(decode_json_object, raw)
    return decode_json_object(raw)


def one_line(exc: BaseException, limit: int = 16_000) -> str:
    """The whole cause (with the exceptions it was raised from) as one log line."""
    parts: list[str] = []
    seen: BaseException | None = exc
    while seen is not None and len(parts) < 8:
        parts.append(f"{type(seen).__name__}: {seen}")
        seen = seen.__cause__ or (None if seen.__suppress_context__ else seen.__context__)
    text = " | caused by: ".join(parts)
    return " ".join(text.split())[:limit]
