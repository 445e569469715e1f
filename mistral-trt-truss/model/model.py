"""The Truss adapter: forwards Truss's calls to `mistral_serving.http.frontend.Frontend`.

Every route takes the raw request (Truss then leaves the body alone: our frontend
decodes it strictly). No `from __future__ import annotations` here: Truss reads the
`request: Request` annotation at run time to decide what to pass.
"""

from typing import Any

from fastapi import Request
from fastapi.responses import Response

from mistral_serving.http.frontend import frontend_for

HF_TOKEN_SECRET = "hf_access_token"


def _secret(secrets: Any, name: str) -> str | None:
    try:
        return secrets[name] if secrets is not None else None
    except Exception:  # truss raises SecretNotFound when the secret is unset or empty
        return None


class Model:
    def __init__(self, config: dict, secrets: Any = None, **_: Any) -> None:
        self._frontend = frontend_for(config)  # the launcher's, with its settings
        self._secrets = secrets

    def load(self) -> None:
        self._frontend.load(_secret(self._secrets, HF_TOKEN_SECRET))

    async def is_healthy(self) -> bool:
        return await self._frontend.is_healthy()

    async def predict(self, request: Request) -> Response:
        return await self._frontend.handle("predict", request)

    async def chat_completions(self, request: Request) -> Response:
        return await self._frontend.handle("chat_completions", request)

    async def completions(self, request: Request) -> Response:
        return await self._frontend.handle("completions", request)

    async def responses(self, request: Request) -> Response:
        return await self._frontend.handle("responses", request)

    async def messages(self, request: Request) -> Response:
        return await self._frontend.handle("messages", request)
