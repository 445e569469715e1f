"""The Truss adapter: parse the request, call the generation service, shape the answer.

Everything else lives in `packages/mistral_serving` (settings, validation, chat format,
streaming, engines, artifacts). No `from __future__ import annotations` here: Truss reads
the `request: Request` annotation at run time to decide what to pass.
"""


import logging
import uuid
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from mistral_serving.service import GenerationService, RequestError
from mistral_serving.settings import Settings

log = logging.getLogger(__name__)

HF_TOKEN_SECRET = "hf_access_token"


def _secret(secrets: Any, name: str) -> str | None:
    try:
        return secrets[name] if secrets is not None else None
    except Exception:  # truss raises SecretNotFound when the secret is unset or empty
        return None


def _request_id(request: Request) -> str:
    return request.headers.get("x-request-id") or uuid.uuid4().hex


def _error(exc: RequestError, request_id: str) -> JSONResponse:
    return JSONResponse(status_code=exc.status, content={"error": exc.message},
                        headers={"X-Request-Id": request_id})


class Model:
    def __init__(self, config: dict, secrets: Any = None, **_: Any) -> None:
        self._settings = Settings.load(config.get("model_metadata"))
        self._secrets = secrets
        self._service: GenerationService | None = None

    def load(self) -> None:
        self._service = GenerationService.start(self._settings,
                                                _secret(self._secrets, HF_TOKEN_SECRET))

    def is_healthy(self) -> bool:
        return self._service is not None and self._service.is_healthy()

    async def predict(self, model_input: Any, request: Request) -> Any:
        assert self._service is not None  # Truss calls predict only after load()
        request_id = _request_id(request)
        try:
            req, gen = self._service.parse_predict(model_input)
        except RequestError as exc:
            return _error(exc, request_id)
        headers = {"X-Request-Id": request_id}
        if req.streaming:
            # A StreamingResponse (not a bare generator) so that a client disconnect
            # cancels the stream, which aborts the engine request.
            return StreamingResponse(self._service.stream(gen, request_id),
                                     media_type="text/plain; charset=utf-8", headers=headers)
        try:
            result = await self._service.complete(gen, request_id, request.is_disconnected)
        except RequestError as exc:
            return _error(exc, request_id)
        return JSONResponse({"output": result.output, "finish_reason": result.finish_reason,
                             "usage": result.usage}, headers=headers)
