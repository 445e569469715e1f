"""Optional bearer-token auth for the generation routes (an ASGI middleware).

Off unless keys are given: in the file `api_keys_file` names (e.g. a mounted Kubernetes
Secret), and/or in the Truss secret `api_keys` (found as Truss finds a secret:
`/secrets/api_keys`, else `TRUSS_SECRET_api_keys`; an empty one is unset, as for Truss).
One key per line, blank lines and `#` comments ignored, several keys allowed (for
rotation); the keys of both sources are accepted, as `Authorization: Bearer <key>` or
`x-api-key: <key>`. Default-deny: every request but a GET or HEAD needs a key, whatever
its path (a route Truss adds later, or a path spelled so that only its router matches it,
is guarded too), and so do reads of stored Responses API answers; GETs and HEADs reach no
model (the body guard refuses them on the generation routes), so probes, `/metrics` and
`/v1/models` stay open for the kubelet and Prometheus. Keys are compared with `hmac.compare_digest` and never
logged: a refusal says only that the key was missing or wrong.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

MAX_KEYS = 1024
MAX_KEY_BYTES = 4096
SECRET_NAME = "api_keys"  # the Truss secret (config.yaml `secrets:`) that may hold keys
# truss/templates/shared/secrets_resolver.py::SecretsResolver: where a secret is found.
SECRETS_MOUNT_DIR = Path("/secrets")
SECRET_ENV_PREFIX = "TRUSS_SECRET_"


class ApiKeyError(ValueError):
    """The key file is unusable; the message is one line and holds no key."""


def load_keys(path: str) -> tuple[bytes, ...]:
    """The keys in `path` (one a line); refuses an empty or oversized file."""
    try:
        text = Path(path).expanduser().read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ApiKeyError(
            f"api_keys_file {path!r}: cannot read it ({type(exc).__name__})"
        ) from None
    return parse_keys(text, f"api_keys_file {path!r}")


def secret_text(
    name: str = SECRET_NAME,
    mount_dir: Path | None = None,
    env: Mapping[str, str] | None = None,
) -> str | None:
    """The Truss secret's value as `SecretsResolver._resolve_secret` finds it (the mounted
    file wins over the variable); None when unset or empty."""
    env = os.environ if env is None else env
    value = env.get(SECRET_ENV_PREFIX + name)
    path = (SECRETS_MOUNT_DIR if mount_dir is None else mount_dir) / name
    try:
        if path.is_file():
            value = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ApiKeyError(f"secret {name!r}: cannot read it ({type(exc).__name__})") from None
    return value or None


def configured_keys(
    api_keys_file: str,
    mount_dir: Path | None = None,
    env: Mapping[str, str] | None = None,
) -> tuple[bytes, ...]:
    """Every accepted key: the file's and the Truss secret's; () means auth is off."""
    keys = load_keys(api_keys_file) if api_keys_file else ()
    text = secret_text(SECRET_NAME, mount_dir, env)
    if text is not None:
        keys += parse_keys(text, f"secret {SECRET_NAME!r}")
    if len(keys) > MAX_KEYS:
        raise ApiKeyError(f"more than {MAX_KEYS} API keys")
    return tuple(dict.fromkeys(keys))


def parse_keys(text: str, source: str) -> tuple[bytes, ...]:
    """One key a line; `source` names where they came from in the one-line refusal."""
    path = source  # named in the messages below
    keys = []
    for line in text.splitlines():
        key = line.strip()
        if not key or key.startswith("#"):
            continue
        if len(key.encode()) > MAX_KEY_BYTES or not key.isprintable() or " " in key:
            raise ApiKeyError(f"{path}: a key is too long or not printable")
        keys.append(key.encode())
    if not keys:
        raise ApiKeyError(f"{path}: holds no key")
    if len(keys) > MAX_KEYS:
        raise ApiKeyError(f"{path}: more than {MAX_KEYS} keys")
    return tuple(keys)


def presented_key(scope: Scope) -> bytes | None:
    """The token of an `Authorization: Bearer <token>` header, else of an `x-api-key`
    header (Anthropic's clients send that), else None."""
    api_key: bytes | None = None
    for name, value in scope.get("headers", ()):
        if name.lower() == b"authorization":
            scheme, _, token = bytes(value).strip().partition(b" ")
            if scheme.lower() == b"bearer" and token.strip():
                return token.strip()
            return None
        if name.lower() == b"x-api-key" and bytes(value).strip():
            api_key = bytes(value).strip()
    return api_key


def key_matches(token: bytes, keys: Sequence[bytes]) -> bool:
    """Constant-time against every key (no early exit that would time which one)."""
    found = False
    for key in keys:
        found |= hmac.compare_digest(token, key)
    return found


# What passes without a key: methods that reach no model on any route (the body guard
# refuses them on the generation routes).
OPEN_METHODS = frozenset({"GET", "HEAD"})


class ApiKeyGuard:
    """Answers 401 (route's error shape, `WWW-Authenticate: Bearer`) to any request but a
    GET or HEAD without a valid key; those pass through untouched."""

    def __init__(
        self,
        app: ASGIApp,
        keys: Sequence[bytes],
        route_of: Callable[[str], str | None],
        error_json: Callable[[str | None, int, str, str | None], bytes],
        guard_other: Callable[[str, str], str | None] = lambda method, path: None,
    ) -> None:
        self.app = app
        self.keys = tuple(keys)
        self.route_of = route_of
        self.error_json = error_json
        self.guard_other = guard_other  # (method, path) -> label: other requests guarded

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        method, path = scope.get("method", ""), scope.get("path", "")
        guarded = self.guard_other(method, path)
        if method in OPEN_METHODS and guarded is None:
            await self.app(scope, receive, send)
            return
        route = self.route_of(path) or guarded  # the refusal's shape
        token = presented_key(scope)
        if token is not None and key_matches(token, self.keys):
            await self.app(scope, receive, send)
            return
        message = "missing API key" if token is None else "invalid API key"
        body = self.error_json(
            route,
            401,
            message + ": send `Authorization: Bearer <key>` or `x-api-key: <key>`",
            "invalid_api_key",
        )
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"www-authenticate", b"Bearer"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
