"""HTTP clients (sync and async) for the predict route and the OpenAI routes."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import tenacity
from httpx_sse import EventSource, SSEError

from client.errors import (
    ClientConnectionError,
    ClientError,
    ClientTimeoutError,
    RateLimitedError,
    ServiceUnavailableError,
    StreamError,
    error_from_response,
)
from client.protocol import READY_PATH, RequestSpec, build_request, parse_completion, stream_parser
from client.streams import OpenAIStreamParser, StreamState
from client.types import Api, Completion, Message, SamplingParams, Usage

DEFAULT_URL = "http://127.0.0.1:8080"


def _transport_error(exc: httpx.HTTPError, url: str) -> ClientError:
    if isinstance(exc, httpx.ConnectTimeout):
        return ClientConnectionError(f"connect timeout to {url}: {exc}")
    if isinstance(exc, httpx.TimeoutException):
        return ClientTimeoutError(f"timed out waiting for {url}: {exc!r}")
    if isinstance(exc, httpx.ConnectError | httpx.RemoteProtocolError):
        return ClientConnectionError(f"cannot reach {url}: {exc}")
    return ClientError(f"transport error on {url}: {exc!r}")


# Failures where generation certainly did not start: no connection, 503 (loading,
# draining or saturated) and 429 (a key over its limit). A timeout while reading, a 4xx or
# another 5xx is final.
RETRYABLE = (ClientConnectionError, ServiceUnavailableError, RateLimitedError)
MAX_RETRY_AFTER = 60.0


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded retries with exponential backoff, run by tenacity.

    The wait before retry ``n`` (from 1) is ``backoff * 2**(n-1)`` capped at
    ``max_backoff``, plus up to ``jitter`` of it at random; a server's Retry-After wins
    when it is longer (capped at 60 s).
    """

    retries: int = 3
    backoff: float = 0.5
    max_backoff: float = 8.0
    jitter: float = 0.1

    def wait(self, state: tenacity.RetryCallState) -> float:
        base = tenacity.wait_exponential(multiplier=self.backoff, max=self.max_backoff)(state)
        base += base * self.jitter * random.random()
        error = state.outcome.exception() if state.outcome is not None else None
        retry_after = getattr(error, "retry_after", None)
        if retry_after is not None:
            base = max(base, min(retry_after, MAX_RETRY_AFTER))
        return base

    def _options(self) -> dict[str, Any]:
        return {
            "stop": tenacity.stop_after_attempt(self.retries + 1),
            "retry": tenacity.retry_if_exception_type(RETRYABLE),
            "wait": self.wait,
            "reraise": True,  # the caller sees the last ClientError, not tenacity's RetryError
        }

    def retrying(self) -> tenacity.Retrying:
        return tenacity.Retrying(**self._options())

    def async_retrying(self) -> tenacity.AsyncRetrying:
        return tenacity.AsyncRetrying(**self._options())


class _Base:
    def __init__(
        self,
        base_url: str = DEFAULT_URL,
        timeout: float = 600.0,
        retries: int = 3,
        *,
        api: Api = "predict",
        model: str | None = None,
        backoff: float = 0.5,
        max_backoff: float = 8.0,
        headers: dict[str, str] | None = None,
        decode_errors: str = "strict",
        ready_path: str = READY_PATH,
    ) -> None:
        if api not in ("predict", "openai"):
            raise ValueError(f"api must be 'predict' or 'openai', not {api!r}")
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.api: Api = api
        self.model = model
        self.policy = RetryPolicy(retries=retries, backoff=backoff, max_backoff=max_backoff)
        self.headers = headers or {}
        self.decode_errors = decode_errors
        self.ready_path = ready_path

    def _spec(
        self,
        prompt: str | list[int] | None,
        messages: list[Message] | None,
        stream: bool,
        sampling: SamplingParams | None,
        extra: dict[str, Any] | None,
        kw: dict[str, Any],
    ) -> RequestSpec:
        if kw:
            unknown = set(kw) - set(SamplingParams.names())
            if unknown:
                raise TypeError(f"unknown sampling field(s): {sorted(unknown)}")
            base = (sampling or SamplingParams()).set_fields()
            sampling = SamplingParams(**(base | kw))
        return build_request(
            self.api,
            prompt=prompt,
            messages=messages,
            sampling=sampling,
            stream=stream,
            model=self.model,
            extra=extra,
        )

    def _url(self, path: str) -> str:
        return self.base_url + path

    @staticmethod
    def _model_from_list(resp: httpx.Response) -> str | None:
        try:
            data = resp.json().get("data") or []
            return str(data[0]["id"]) if data else None
        except (ValueError, KeyError, TypeError, AttributeError, IndexError):
            return None


class _StreamedText:
    """What a stream has said so far; the sync and async streams differ only in how they
    read the response."""

    def __init__(self, response: httpx.Response, spec: RequestSpec, decode_errors: str) -> None:
        self._response = response
        self._parser = stream_parser(spec, decode_errors)
        self._sse = isinstance(self._parser, OpenAIStreamParser)
        self._pieces: list[str] = []

    @property
    def state(self) -> StreamState:
        return self._parser.state

    @property
    def usage(self) -> Usage | None:
        return self._parser.state.usage

    @property
    def finish_reason(self) -> str | None:
        return self._parser.state.finish_reason

    @property
    def text(self) -> str:
        return "".join(self._pieces)

    def _parse(self, item: str | bytes) -> list[str]:
        """The text pieces in one SSE event's data (OpenAI) or one body chunk (predict)."""
        parser = self._parser
        if isinstance(parser, OpenAIStreamParser) and isinstance(item, str):
            return parser.event(item)  # SSE data
        if not isinstance(parser, OpenAIStreamParser) and isinstance(item, bytes):
            return parser.feed(item)  # body bytes
        raise TypeError(f"{type(parser).__name__} cannot parse {type(item).__name__}")


@contextlib.contextmanager
def _stream_errors() -> Iterator[None]:
    """Transport failures while streaming, as the client's own StreamError."""
    try:
        yield
    except SSEError as exc:  # an httpx.TransportError: catch it first
        raise StreamError(f"not an event stream: {exc}") from exc
    except httpx.HTTPError as exc:
        raise StreamError(f"stream broke off: {exc!r}") from exc


class StreamingText(_StreamedText):
    """Text pieces as they arrive; after iteration ``text``, ``usage``, ``finish_reason``.

    Use it as an iterator (the connection closes when it is exhausted) or in a ``with``
    block to close it early.
    """

    def __iter__(self) -> Iterator[str]:
        try:
            with _stream_errors():
                if self._sse:
                    items: Iterator[str | bytes] = (
                        e.data for e in EventSource(self._response).iter_sse()
                    )
                else:
                    items = self._response.iter_bytes()
                for item in items:
                    for piece in self._parse(item):
                        self._pieces.append(piece)
                        yield piece
                for piece in self._parser.close():
                    self._pieces.append(piece)
                    yield piece
        finally:
            self._response.close()

    def close(self) -> None:
        self._response.close()

    def __enter__(self) -> StreamingText:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Client(_Base):
    """Synchronous client.

    ``timeout`` is httpx's per-operation timeout in seconds: connecting, and the longest
    wait for the next bytes of an answer (so a long stream that keeps sending never times
    out). ``retries`` bounds the retries on connection errors, 503 and 429.
    """

    def __init__(
        self,
        base_url: str = DEFAULT_URL,
        timeout: float = 600.0,
        retries: int = 3,
        *,
        transport: httpx.BaseTransport | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(base_url, timeout, retries, **kwargs)
        self._http = httpx.Client(timeout=timeout, headers=self.headers, transport=transport)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- plumbing ---------------------------------------------------------------------
    def _send(self, method: str, path: str, body: dict[str, Any] | None = None) -> httpx.Response:
        """Send with retries; return the (streaming) response of a 2xx answer."""
        for attempt in self.policy.retrying():
            with attempt:
                return self._send_once(method, self._url(path), body)
        raise AssertionError("unreachable: tenacity re-raises the last error")

    def _send_once(self, method: str, url: str, body: dict[str, Any] | None) -> httpx.Response:
        try:
            response = self._http.send(
                self._http.build_request(method, url, json=body), stream=True
            )
        except httpx.HTTPError as exc:
            raise _transport_error(exc, url) from exc
        if response.status_code < 400:
            return response
        try:
            raw = response.read()
        finally:
            response.close()
        raise error_from_response(response.status_code, raw, response.headers)

    def resolve_model(self) -> None:
        if self.api == "openai" and self.model is None:
            try:
                resp = self._http.get(self._url("/v1/models"))
                name = self._model_from_list(resp) if resp.status_code == 200 else None
            except httpx.HTTPError:
                name = None
            self.model = name or "model"

    # -- public API ---------------------------------------------------------------------
    def predict(
        self,
        prompt: str | list[int] | None = None,
        *,
        messages: list[Message] | None = None,
        sampling: SamplingParams | None = None,
        extra: dict[str, Any] | None = None,
        **kw: Any,
    ) -> Completion:
        """One non-streaming generation for a prompt (or messages)."""
        self.resolve_model()
        spec = self._spec(prompt, messages, False, sampling, extra, kw)
        response = self._send("POST", spec.path, spec.body)
        try:
            raw = response.read()
        except httpx.HTTPError as exc:
            raise _transport_error(exc, self._url(spec.path)) from exc
        finally:
            response.close()
        try:
            payload = json.loads(raw)
        except ValueError as exc:
            raise ClientError(
                f"answer is not JSON: {raw[:200]!r}", status=response.status_code
            ) from exc
        return parse_completion(spec, payload)

    def chat(self, messages: list[Message], **kw: Any) -> Completion:
        return self.predict(messages=messages, **kw)

    def stream(
        self,
        prompt: str | list[int] | None = None,
        *,
        messages: list[Message] | None = None,
        sampling: SamplingParams | None = None,
        extra: dict[str, Any] | None = None,
        **kw: Any,
    ) -> StreamingText:
        """Start a streaming generation; iterate the result for text as it arrives.

        Errors before the stream starts (4xx, 5xx after retries) raise here.
        """
        self.resolve_model()
        spec = self._spec(prompt, messages, True, sampling, extra, kw)
        return StreamingText(self._send("POST", spec.path, spec.body), spec, self.decode_errors)

    def chat_stream(self, messages: list[Message], **kw: Any) -> StreamingText:
        return self.stream(messages=messages, **kw)

    def wait_until_ready(self, timeout: float = 300.0, interval: float = 0.5) -> float:
        """Poll ``GET /v1/models/model`` until it answers 200; return seconds waited.

        Raises :class:`ClientTimeoutError` (with the last status or error seen) otherwise.
        """
        start = time.monotonic()
        last = "no answer"
        while True:
            try:
                resp = self._http.get(self._url(self.ready_path), timeout=min(5.0, self.timeout))
                if resp.status_code == 200:
                    return time.monotonic() - start
                last = f"HTTP {resp.status_code}"
            except httpx.HTTPError as exc:
                last = repr(exc)
            if time.monotonic() - start + interval > timeout:
                raise ClientTimeoutError(
                    f"{self._url(self.ready_path)} not ready after {timeout:.1f}s (last: {last})"
                )
            time.sleep(interval)


class AsyncStreamingText(_StreamedText):
    """Async twin of :class:`StreamingText`."""

    async def __aiter__(self) -> AsyncIterator[str]:
        try:
            with _stream_errors():
                if self._sse:
                    async for event in EventSource(self._response).aiter_sse():
                        for piece in self._parse(event.data):
                            self._pieces.append(piece)
                            yield piece
                else:
                    async for data in self._response.aiter_bytes():
                        for piece in self._parse(data):
                            self._pieces.append(piece)
                            yield piece
                for piece in self._parser.close():
                    self._pieces.append(piece)
                    yield piece
        finally:
            await self._response.aclose()

    async def aclose(self) -> None:
        await self._response.aclose()


class AsyncClient(_Base):
    """Asyncio client (what the benchmark drives); same options as :class:`Client`."""

    def __init__(
        self,
        base_url: str = DEFAULT_URL,
        timeout: float = 600.0,
        retries: int = 3,
        *,
        max_connections: int = 1024,
        **kwargs: Any,
    ) -> None:
        super().__init__(base_url, timeout, retries, **kwargs)
        limits = httpx.Limits(
            max_connections=max_connections, max_keepalive_connections=max_connections
        )
        self._http = httpx.AsyncClient(timeout=timeout, headers=self.headers, limits=limits)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _send(
        self, method: str, path: str, body: dict[str, Any] | None = None
    ) -> httpx.Response:
        async for attempt in self.policy.async_retrying():
            with attempt:
                return await self._send_once(method, self._url(path), body)
        raise AssertionError("unreachable: tenacity re-raises the last error")

    async def _send_once(
        self, method: str, url: str, body: dict[str, Any] | None
    ) -> httpx.Response:
        request = self._http.build_request(method, url, json=body)
        try:
            response = await self._http.send(request, stream=True)
        except httpx.HTTPError as exc:
            raise _transport_error(exc, url) from exc
        if response.status_code < 400:
            return response
        try:
            raw = await response.aread()
        finally:
            await response.aclose()
        raise error_from_response(response.status_code, raw, response.headers)

    async def resolve_model(self) -> None:
        if self.api == "openai" and self.model is None:
            try:
                resp = await self._http.get(self._url("/v1/models"))
                name = self._model_from_list(resp) if resp.status_code == 200 else None
            except httpx.HTTPError:
                name = None
            self.model = name or "model"

    async def predict(
        self,
        prompt: str | list[int] | None = None,
        *,
        messages: list[Message] | None = None,
        sampling: SamplingParams | None = None,
        extra: dict[str, Any] | None = None,
        **kw: Any,
    ) -> Completion:
        await self.resolve_model()
        spec = self._spec(prompt, messages, False, sampling, extra, kw)
        response = await self._send("POST", spec.path, spec.body)
        try:
            raw = await response.aread()
        except httpx.HTTPError as exc:
            raise _transport_error(exc, self._url(spec.path)) from exc
        finally:
            await response.aclose()
        try:
            payload = json.loads(raw)
        except ValueError as exc:
            raise ClientError(
                f"answer is not JSON: {raw[:200]!r}", status=response.status_code
            ) from exc
        return parse_completion(spec, payload)

    async def chat(self, messages: list[Message], **kw: Any) -> Completion:
        return await self.predict(messages=messages, **kw)

    async def stream(
        self,
        prompt: str | list[int] | None = None,
        *,
        messages: list[Message] | None = None,
        sampling: SamplingParams | None = None,
        extra: dict[str, Any] | None = None,
        **kw: Any,
    ) -> AsyncStreamingText:
        await self.resolve_model()
        spec = self._spec(prompt, messages, True, sampling, extra, kw)
        return AsyncStreamingText(
            await self._send("POST", spec.path, spec.body), spec, self.decode_errors
        )

    async def wait_until_ready(self, timeout: float = 300.0, interval: float = 0.5) -> float:
        start = time.monotonic()
        last = "no answer"
        while True:
            try:
                resp = await self._http.get(
                    self._url(self.ready_path), timeout=min(5.0, self.timeout)
                )
                if resp.status_code == 200:
                    return time.monotonic() - start
                last = f"HTTP {resp.status_code}"
            except httpx.HTTPError as exc:
                last = repr(exc)
            if time.monotonic() - start + interval > timeout:
                raise ClientTimeoutError(
                    f"{self._url(self.ready_path)} not ready after {timeout:.1f}s (last: {last})"
                )
            await asyncio.sleep(interval)
