"""Optional bearer-token auth for the generation routes (an ASGI middleware).

Off unless keys are given: in the file `api_keys_file` names (e.g. a mounted Kubernetes
Secret), and/or in the Truss secret `api_keys` (found as Truss finds a secret:
`/secrets/api_keys`, else `TRUSS_SECRET_api_keys`; an empty one is unset, as for Truss).
One key per line, blank lines and `#` comments ignored, several keys allowed (for
rotation); the keys of both sources are accepted, as `Authorization: Bearer <key>` or
`x-api-key: <key>`, and re-read when a file changes (a mounted Secret is updated in
place: a rotated or revoked key takes effect within a second, with a log line).
Default-deny: every request but a GET or HEAD needs a key, whatever its path (a route
Truss adds later, or a path spelled so that only its router matches it, is guarded too),
and so do reads of stored Responses API answers; GETs and HEADs reach no model (the body
guard refuses them on the generation routes), so probes, `/metrics` and `/v1/models` stay
open for the kubelet and Prometheus. Keys are compared with `hmac.compare_digest` and never
logged: a refusal says only that the key was missing or wrong.
"""

from __future__ import annotations

import hmac
import logging
import os
import re
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

MAX_KEYS = 1024
# How often the key files are looked at for a change (a mounted Secret is updated in
# place, by the kubelet swapping a symlink): one stat a file, at most this often.
RELOAD_CHECK_S = 1.0
MAX_KEY_BYTES = 4096
SECRET_NAME = "api_keys"  # the Truss secret (config.yaml `secrets:`) that may hold keys
# truss/templates/shared/secrets_resolver.py::SecretsResolver: where a secret is found.
SECRETS_MOUNT_DIR = Path("/secrets")
SECRET_ENV_PREFIX = "TRUSS_SECRET_"


# Query parameters whose values are never written to the access log (a key sent as
# `?api_key=` would be, verbatim): any name holding one of these words.
_SECRET_NAMES = re.compile(r"key|token|secret|passw|auth|sig|credential|session", re.IGNORECASE)


def redacted_query(path: str) -> str:
    """`path` (with its query string, as uvicorn's access line has it) with the values of
    secret-looking query parameters replaced."""
    base, mark, query = path.partition("?")
    if not mark:
        return path
    parts = []
    for item in query.split("&"):
        name, eq, _ = item.partition("=")
        if eq and _SECRET_NAMES.search(urllib.parse.unquote_plus(name)):
            item = f"{name}=[redacted]"
        parts.append(item)
    return f"{base}?{'&'.join(parts)}"


class RedactedAccessLine(logging.Filter):
    """On uvicorn's access logger: the logged path's secret-looking query values redacted
    (the record's args are uvicorn's (client, method, path, version, status))."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) == 5 and "?" in str(args[2]):
            record.args = (args[0], args[1], redacted_query(str(args[2])), args[3], args[4])
        return True


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


class KeySource:
    """The accepted keys, re-read when a file they came from changes (a rotated or revoked
    key takes effect within RELOAD_CHECK_S, with a log line); a file that becomes
    unusable keeps the keys in force (logged), until it is fixed. Keys given in the
    environment are read once (a process's environment does not change)."""

    def __init__(
        self,
        api_keys_file: str,
        mount_dir: Path | None = None,
        env: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._file = api_keys_file
        self._mount_dir = mount_dir
        self._env = env
        self._clock = clock
        self._stamps = self._stat()
        self.keys = configured_keys(api_keys_file, mount_dir, env)
        self._checked = clock()

    def _paths(self) -> list[Path]:
        paths = [Path(self._file).expanduser()] if self._file else []
        return [
            *paths,
            (SECRETS_MOUNT_DIR if self._mount_dir is None else self._mount_dir) / SECRET_NAME,
        ]

    def _stat(self) -> list[tuple[int, int, int] | None]:
        stamps: list[tuple[int, int, int] | None] = []
        for path in self._paths():
            try:
                st = path.stat()  # follows the Secret's symlinks: a swap changes it
            except OSError:
                stamps.append(None)
            else:
                stamps.append((st.st_ino, st.st_mtime_ns, st.st_size))
        return stamps

    def current(self) -> tuple[bytes, ...]:
        now = self._clock()
        if now - self._checked >= RELOAD_CHECK_S:
            self._checked = now
            stamps = self._stat()
            if stamps != self._stamps:
                self._stamps = stamps
                self._reload()
        return self.keys

    def _reload(self) -> None:
        try:
            keys = configured_keys(self._file, self._mount_dir, self._env)
        except ApiKeyError as exc:
            log.error("API keys changed but cannot be read (the keys in force stay): %s", exc)
            return
        if not keys:
            log.error("API keys changed to none (the keys in force stay; auth stays on)")
            return
        if keys != self.keys:
            self.keys = keys
            log.info("API keys reloaded: %d in force", len(keys))


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


async def send_json(send: Send, status: int, body: bytes, *headers: tuple[bytes, bytes]) -> None:
    """A middleware's whole JSON answer (a refusal): status, content type and length, then
    `headers`, and the body in one message."""
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body, "more_body": False})


# What passes without a key: methods that reach no model on any route (the body guard
# refuses them on the generation routes).
OPEN_METHODS = frozenset({"GET", "HEAD"})


class ApiKeyGuard:
    """Answers 401 (route's error shape, `WWW-Authenticate: Bearer`) to any request but a
    GET or HEAD without a valid key; those pass through untouched."""

    def __init__(
        self,
        app: ASGIApp,
        keys: KeySource | Sequence[bytes],
        route_of: Callable[[str], str | None],
        error_json: Callable[[str | None, int, str, str | None], bytes],
        guard_other: Callable[[str, str], str | None] = lambda method, path: None,
    ) -> None:
        self.app = app
        self.source: KeySource | None = None
        if isinstance(keys, KeySource):
            self.source, self.keys = keys, keys.keys
        else:
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
        keys = self.source.current() if self.source is not None else self.keys
        if token is not None and key_matches(token, keys):
            await self.app(scope, receive, send)
            return
        message = "missing API key" if token is None else "invalid API key"
        body = self.error_json(
            route,
            401,
            message + ": send `Authorization: Bearer <key>` or `x-api-key: <key>`",
            "invalid_api_key",
        )
        await send_json(send, 401, body, (b"www-authenticate", b"Bearer"))
