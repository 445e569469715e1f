"""Error bodies of both shapes become typed errors with the server's message."""

from __future__ import annotations

import email.utils
import json

import pytest

from client.errors import (
    BadRequestError,
    ClientError,
    RateLimitedError,
    ServerError,
    ServiceUnavailableError,
    error_from_response,
    parse_retry_after,
)


def test_predict_route_shape() -> None:
    err = error_from_response(400, b'{"error": "temperature must be >= 0"}', {})
    assert isinstance(err, BadRequestError)
    assert err.status == 400
    assert err.message == "temperature must be >= 0"
    assert str(err) == "HTTP 400: temperature must be >= 0"


def test_openai_shape() -> None:
    body = {
        "error": {
            "message": "prompt too long",
            "type": "invalid_request_error",
            "param": "prompt",
            "code": "context_length_exceeded",
        }
    }
    err = error_from_response(400, json.dumps(body).encode(), {})
    assert err.message == "prompt too long"
    assert (err.type, err.param, err.code) == (
        "invalid_request_error",
        "prompt",
        "context_length_exceeded",
    )


def test_fastapi_detail_and_non_json_bodies() -> None:
    err = error_from_response(422, b'{"detail": [{"loc": ["body"], "msg": "bad"}]}', {})
    assert "bad" in err.message and isinstance(err, BadRequestError)
    err = error_from_response(502, b"<html>Bad Gateway</html>", {})
    assert isinstance(err, ServerError) and err.message == "<html>Bad Gateway</html>"
    err = error_from_response(500, b"", {})
    assert "empty body" in err.message


def test_status_classes_and_retry_after() -> None:
    err = error_from_response(429, b'{"error": "queue full"}', {"retry-after": "3"})
    assert isinstance(err, RateLimitedError) and err.retry_after == 3.0
    assert isinstance(
        error_from_response(503, b'{"error": "loading"}', {}), ServiceUnavailableError
    )
    assert type(error_from_response(302, b"", {})) is ClientError


def test_parse_retry_after_forms() -> None:
    assert parse_retry_after(None) is None
    assert parse_retry_after("  7 ") == 7.0
    assert parse_retry_after("-3") == 0.0
    assert parse_retry_after("soon") is None
    now = 1_000_000_000.0
    date = email.utils.formatdate(now + 30, usegmt=True)
    assert parse_retry_after(date, now=now) == pytest.approx(30.0, abs=1.0)
