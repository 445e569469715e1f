"""Typed errors that carry what the server said.

The predict route answers errors as ``{"error": "message"}``; the OpenAI routes as
``{"error": {"message", "type", "param", "code"}}``. Both shapes (and bodies that are not
JSON at all) become a :class:`ClientError` with the HTTP status and the server's message.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from email.utils import parsedate_to_datetime
from typing import Any


class ClientError(Exception):
    """A request that did not succeed.

    ``status`` is the HTTP status, or ``None`` when no HTTP answer came back (connection
    refused, timeout, a stream that broke off). ``message`` is the server's own message
    when it sent one.
    """

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        type: str | None = None,
        param: str | None = None,
        code: str | int | None = None,
        retry_after: float | None = None,
        body: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.type = type
        self.param = param
        self.code = code
        self.retry_after = retry_after
        self.body = body

    def __str__(self) -> str:
        prefix = f"HTTP {self.status}: " if self.status is not None else ""
        return prefix + self.message

    def __repr__(self) -> str:
        return f"{type(self).__name__}(status={self.status!r}, message={self.message!r})"


class BadRequestError(ClientError):
    """4xx other than 429: the request itself is wrong; retrying will not help."""


class RateLimitedError(ClientError):
    """429: over a quota (the API key's request limit). ``retry_after`` holds its
    Retry-After, if any."""


class ServiceUnavailableError(ClientError):
    """503: the model is still loading, the server is draining, or it is saturated (no slot
    and no queue place; with Retry-After). ``retry_after`` holds its Retry-After, if any."""


class ServerError(ClientError):
    """5xx other than 503."""


class ClientConnectionError(ClientError):
    """No connection could be made (refused, reset before an answer, DNS)."""


class ClientTimeoutError(ClientError):
    """The server did not answer (or stopped sending) within the timeout."""


class StreamError(ClientError):
    """A stream broke off or carried an error event."""


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a Retry-After header (delta-seconds or an HTTP date)."""
    if value is None:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = parsedate_to_datetime(value).timestamp()
        except (TypeError, ValueError, IndexError):
            return None
        seconds = when - (time.time() if now is None else now)
    return max(0.0, seconds)


def _error_fields(payload: Any) -> dict[str, Any] | None:
    """The message/type/param/code of either error shape, or None if it is neither."""
    if not isinstance(payload, Mapping):
        return None
    err = payload.get("error")
    if isinstance(err, str):
        return {"message": err}
    if isinstance(err, Mapping):
        message = err.get("message")
        return {
            "message": message if isinstance(message, str) else json.dumps(err),
            "type": err.get("type"),
            "param": err.get("param"),
            "code": err.get("code"),
        }
    detail = payload.get("detail")  # FastAPI's own shape, e.g. on 422 or 404
    if detail is not None:
        return {"message": detail if isinstance(detail, str) else json.dumps(detail)}
    message = payload.get("message")
    if isinstance(message, str):
        return {"message": message}
    return None


_BY_STATUS: dict[int, type[ClientError]] = {429: RateLimitedError, 503: ServiceUnavailableError}


def error_class(status: int) -> type[ClientError]:
    if status in _BY_STATUS:
        return _BY_STATUS[status]
    if 400 <= status < 500:
        return BadRequestError
    if status >= 500:
        return ServerError
    return ClientError


def error_from_response(
    status: int, body: bytes | str, headers: Mapping[str, str] | None = None
) -> ClientError:
    """Build the typed error for an HTTP answer that was not a success."""
    text = body.decode("utf-8", errors="replace") if isinstance(body, bytes) else body
    fields: dict[str, Any] | None = None
    try:
        fields = _error_fields(json.loads(text))
    except (ValueError, TypeError):
        fields = None
    if fields is None:
        fields = {"message": text.strip() or f"HTTP {status} with an empty body"}
    retry_after = None
    if headers is not None:
        # httpx and requests headers are case-insensitive; a plain dict may not be.
        value = headers.get("retry-after") or headers.get("Retry-After")
        retry_after = parse_retry_after(value)
    cls = error_class(status)
    return cls(
        fields["message"],
        status=status,
        type=fields.get("type"),
        param=fields.get("param"),
        code=fields.get("code"),
        retry_after=retry_after,
        body=text,
    )


def error_from_event(payload: Mapping[str, Any]) -> StreamError | None:
    """An error event inside an SSE stream (``data: {"error": {...}}``), or None."""
    if "error" not in payload:
        return None
    fields = _error_fields(payload) or {"message": json.dumps(payload)}
    code = fields.get("code")
    status = code if isinstance(code, int) and 400 <= code < 600 else None
    return StreamError(
        fields["message"],
        status=status,
        type=fields.get("type"),
        param=fields.get("param"),
        code=code,
        body=json.dumps(payload),
    )


def unreachable_hint(exc: ClientError) -> str:
    """What the command lines add to an error when no server is there: where else it may
    be (`make serve` takes PORT)."""
    if not isinstance(exc, ClientConnectionError):
        return ""
    return " (is the server up? --url names another address: after PORT=8081 make serve, --url http://127.0.0.1:8081)"
