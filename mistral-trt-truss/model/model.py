"""The Truss adapter: parse the request, call the generation service, shape the answer.

Everything else lives in `packages/mistral_serving` (settings, validation, chat format,
streaming, engines, artifacts, admission, metrics, OpenAI protocol). No
`from __future__ import annotations` here: Truss reads the `request: Request`
annotation at run time to decide what to pass.
"""

import logging
import weakref
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from mistral_serving import openai_api
from mistral_serving.admission import (
    RETRY_AFTER_SECONDS,
    Admission,
    ClientGone,
    Draining,
    Overloaded,
    Ticket,
)
from mistral_serving.metrics import default_metrics
from mistral_serving.service import GenerationService, RequestError
from mistral_serving.settings import Settings
from mistral_serving.shutdown import Drainer
from mistral_serving.telemetry import RequestRecord

log = logging.getLogger(__name__)

HF_TOKEN_SECRET = "hf_access_token"


def _secret(secrets: Any, name: str) -> str | None:
    try:
        return secrets[name] if secrets is not None else None
    except Exception:  # truss raises SecretNotFound when the secret is unset or empty
        return None


def _predict_error(
    status: int, message: str, request_id: str, headers: dict[str, str] | None = None
) -> JSONResponse:
    return JSONResponse(
        status_code=status,
        content={"error": message},
        headers={"X-Request-Id": request_id, **(headers or {})},
    )


def _new_record(request: Request, route: str) -> RequestRecord:
    """The request's record; its id is the client's X-Request-Id, or one we make."""
    record = RequestRecord(request.headers.get("x-request-id") or "", route)
    record.request_id = record.request_id or record.engine_id
    return record


class Model:
    def __init__(self, config: dict, secrets: Any = None, **_: Any) -> None:
        self._settings = Settings.load(config.get("model_metadata"))
        self._secrets = secrets
        self._service: GenerationService | None = None
        metrics = default_metrics()
        self._admission = Admission(
            self._settings.max_inflight, self._settings.max_waiting, metrics
        )
        self._drainer = Drainer(
            self._settings.drain_grace_seconds, self._stop_admitting, self._abort_all
        )

    def load(self) -> None:
        self._service = GenerationService.start(
            self._settings, _secret(self._secrets, HF_TOKEN_SECRET)
        )

    async def is_healthy(self) -> bool:
        self._drainer.install()  # here: the first call on the server's main-thread loop
        if self._service is not None and not self._service.is_healthy():
            self._drainer.engine_died()
            return False
        return self._service is not None and not self._drainer.draining

    def _stop_admitting(self) -> None:
        self._admission.draining = True

    def _abort_all(self) -> int:
        return self._service.abort_all() if self._service else 0

    # ---- routes ----

    async def predict(self, model_input: Any, request: Request) -> Any:
        self._drainer.install()
        record = _new_record(request, "predict")
        service = self._service
        assert service is not None  # Truss calls predict only after load()
        try:
            req, gen = service.parse_predict(model_input)
        except RequestError as exc:
            return _predict_error(exc.status, exc.message, record.request_id)
        ticket = await self._admit(record, request, "predict")
        if isinstance(ticket, Response):
            return ticket
        headers = {"X-Request-Id": record.request_id}
        if req.streaming:
            return self._streaming_response(
                service.stream(gen, record, req.prompt),
                ticket,
                record,
                "text/plain; charset=utf-8",
                headers,
            )
        try:
            await service.complete(gen, record, request.is_disconnected, req.prompt)
        except RequestError as exc:
            return _predict_error(exc.status, exc.message, record.request_id)
        finally:
            ticket.release()
        return JSONResponse(
            {"output": record.output, "finish_reason": record.finish_reason, "usage": record.usage},
            headers=headers,
        )

    async def chat_completions(self, model_input: Any, request: Request) -> Any:
        return await self._openai(openai_api.Route.CHAT, model_input, request)

    async def completions(self, model_input: Any, request: Request) -> Any:
        return await self._openai(openai_api.Route.COMPLETIONS, model_input, request)

    async def _openai(self, route: "openai_api.Route", body: Any, request: Request) -> Any:
        self._drainer.install()
        service = self._service
        assert service is not None
        record = _new_record(request, route.value)
        try:
            call = openai_api.parse(route, body, service)
        except RequestError as exc:
            return openai_api.error_response(exc.status, exc.message, exc.param, record.request_id)
        ticket = await self._admit(record, request, route.value)
        if isinstance(ticket, Response):
            return ticket
        headers = {"X-Request-Id": record.request_id}
        if call.stream:
            return self._streaming_response(
                openai_api.sse_events(
                    call, service.stream(call.gen, record), record, self._settings.served_model_name
                ),
                ticket,
                record,
                "text/event-stream",
                headers,
            )
        try:
            await service.complete(call.gen, record, request.is_disconnected)
        except RequestError as exc:
            return openai_api.error_response(exc.status, exc.message, exc.param, record.request_id)
        finally:
            ticket.release()
        return JSONResponse(
            openai_api.response_body(call, record, self._settings.served_model_name),
            headers=headers,
        )

    # ---- helpers ----

    async def _admit(
        self, record: RequestRecord, request: Request, route: str
    ) -> "Ticket | Response":
        """A slot in the engine, or the refusal to send instead (429 / 503 / 499)."""
        openai = route != "predict"
        try:
            ticket = await self._admission.acquire(request.is_disconnected)
        except Overloaded:
            message = (
                f"server is at capacity ({self._admission.max_inflight} running, "
                f"{self._admission.max_waiting} waiting); retry later"
            )
            headers = {"Retry-After": str(RETRY_AFTER_SECONDS)}
            if openai:
                return openai_api.error_response(
                    429, message, None, record.request_id, headers, code="rate_limit_exceeded"
                )
            return _predict_error(429, message, record.request_id, headers)
        except Draining:
            message = "server is shutting down; retry on another replica"
            if openai:
                return openai_api.error_response(503, message, None, record.request_id)
            return _predict_error(503, message, record.request_id)
        except ClientGone:
            return Response(status_code=499)
        self._service.telemetry.admitted(record)
        return ticket

    def _streaming_response(
        self,
        chunks,
        ticket: Ticket,
        record: RequestRecord,
        media_type: str,
        headers: dict[str, str],
    ) -> StreamingResponse:
        started = []

        async def body():
            started.append(True)
            try:
                async for chunk in chunks:
                    yield chunk
            finally:
                ticket.release()

        def gone() -> None:
            # If the body never started (client gone before the first byte), nothing
            # reached the engine: free the slot and still count and log the request.
            ticket.release()
            if not started:
                record.finish_reason = "abort"
                self._service.telemetry.finished(record)

        # A StreamingResponse (not a bare generator) so that a client disconnect cancels
        # the stream, which aborts the engine request.
        response = StreamingResponse(body(), media_type=media_type, headers=headers)
        weakref.finalize(response, gone)
        return response
