"""The one exception for a request that cannot be served as asked.

Every refusal (bad body, bad field, prompt too long, overloaded, draining, client gone)
is a `RequestError` with its HTTP status; each wire format (`protocols/`) renders it in
its own error shape, so a route answers every failure in one shape.
"""

from __future__ import annotations

# Why a request ended, as counted in `request_finished_total{finished_reason=...}`.
# stop/length/abort/error come from generation; the rest end it before the engine.
REFUSAL_REASONS = {
    400: "invalid",
    404: "invalid",
    408: "invalid",
    413: "invalid",
    415: "invalid",
    422: "invalid",
    429: "rejected",
    499: "client_gone",
    503: "rejected",
    504: "timeout",  # its deadline passed before the engine saw it (deadline.py)
}


class RequestError(ValueError):
    """A 4xx/5xx answer with this message; `param` names the offending field."""

    def __init__(
        self,
        message: str,
        status: int = 400,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param
        self.code = code
        self.headers = headers or {}

    @property
    def finish_reason(self) -> str:
        """The reason this refusal is counted under."""
        return REFUSAL_REASONS.get(self.status, "error")
