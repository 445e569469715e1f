"""The request headers an inference gateway adds or passes on, read strictly.

- `x-llm-d-inference-objective` (older routers: `x-gateway-inference-objective`): the name
  of an InferenceObjective, whose priority the router's flow control applies; this server
  orders its own queue by the same names (`objective_priorities`).
- `x-llm-d-inference-fairness-id` (`x-gateway-inference-fairness-id`): the flow a request
  shares capacity with (a tenant, say).
- `x-session-id`: the session the router's session-affinity scorer pins to one pod.

The new name wins over the old one, as in the router (its `metadata/consts.go`). Each is
logged and traced with the request; none is a metric label (they are the client's to
choose). A value that is too long or not plain text is a 400 naming the header.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from mistral_serving.errors import RequestError

OBJECTIVE_HEADERS = ("x-llm-d-inference-objective", "x-gateway-inference-objective")
FAIRNESS_HEADERS = ("x-llm-d-inference-fairness-id", "x-gateway-inference-fairness-id")
SESSION_HEADERS = ("x-session-id",)

# An InferenceObjective's name is a Kubernetes object name (DNS-1123 subdomain).
OBJECTIVE_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
# An identifier the client chose: printable ASCII without spaces, bounded.
_IDENTIFIER = re.compile(r"[\x21-\x7e]{1,256}")


@dataclass(frozen=True)
class GatewayContext:
    objective: str | None = None
    fairness_id: str | None = None
    session_id: str | None = None


def _first(headers: Mapping[str, str], names: tuple[str, ...]) -> tuple[str, str] | None:
    for name in names:
        value = headers.get(name)
        if value is not None:
            return name, value
    return None


def _checked(
    headers: Mapping[str, str], names: tuple[str, ...], rule: re.Pattern[str], what: str
) -> str | None:
    found = _first(headers, names)
    if found is None:
        return None
    name, value = found
    if not rule.fullmatch(value):
        raise RequestError(
            f"header {name}: expected {what}, got {len(value)} characters starting {value[:16]!r}",
            param=name,
        )
    return value


def gateway_context(headers: Mapping[str, str]) -> GatewayContext:
    """The gateway's headers of a request (lower-case lookups, as starlette's headers)."""
    name = "an InferenceObjective name (lower-case letters, digits, '-', '.'; at most 253)"
    text = "plain text (printable ASCII, no spaces; at most 256 characters)"
    return GatewayContext(
        objective=_checked(headers, OBJECTIVE_HEADERS, OBJECTIVE_NAME, name),
        fairness_id=_checked(headers, FAIRNESS_HEADERS, _IDENTIFIER, text),
        session_id=_checked(headers, SESSION_HEADERS, _IDENTIFIER, text),
    )
