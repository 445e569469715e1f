"""The generation service: request in, text out, on whatever engine was started.

`model/model.py` (the Truss adapter) and the OpenAI routes call this; it owns no HTTP.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from pydantic import ValidationError

from mistral_serving.artifacts import artifact_kind, check_manifest, resolve_artifact
from mistral_serving.chat import ChatFormatError, ChatMessage, encode_chat
from mistral_serving.engines.base import Engine, EngineRequestError, SamplingOptions
from mistral_serving.engines.select import start_engine
from mistral_serving.manifest import BuildManifest, describe
from mistral_serving.metrics import Metrics, default_metrics
from mistral_serving.schema import PredictRequest, describe_validation_error
from mistral_serving.settings import Settings
from mistral_serving.streaming import TextStream
from mistral_serving.telemetry import RequestRecord, Telemetry
from mistral_serving.tokenizer import Tokenizer, load_tokenizer

log = logging.getLogger(__name__)


class RequestError(ValueError):
    """The client's request cannot be served as asked: a 4xx with this message."""

    def __init__(self, message: str, status: int = 400, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param


@dataclass(frozen=True)
class GenerationRequest:
    """A validated request in engine terms, whichever route it came from."""

    prompt_ids: list[int]
    sampling: SamplingOptions
    stop: tuple[str, ...] = ()
    interval: int = 1  # tokens per streamed chunk


class GenerationService:
    def __init__(
        self,
        settings: Settings,
        tokenizer: Tokenizer,
        engine: Engine,
        manifest: BuildManifest | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self.settings = settings
        self.tokenizer = tokenizer
        self.engine = engine
        self.manifest = manifest
        self.telemetry = Telemetry(metrics or default_metrics(), settings.log_prompts)
        self._live: set[str] = set()  # request ids in the engine now

    @classmethod
    def start(
        cls, settings: Settings, hf_token: str | None, metrics: Metrics | None = None
    ) -> GenerationService:
        """Resolve the artifact, check it, start its engine; log what and how long."""
        started = time.monotonic()
        artifact_dir = resolve_artifact(settings, hf_token)
        fetched = time.monotonic()
        kind = artifact_kind(artifact_dir)
        manifest = check_manifest(artifact_dir, settings.verify_hashes)
        described = describe(manifest) if manifest is not None else "no build manifest"
        log.info("artifact %s: %s", artifact_dir, described)
        tokenizer = load_tokenizer(artifact_dir)
        engine = start_engine(artifact_dir, kind, settings, tokenizer)
        done = time.monotonic()
        log.info(
            "loaded %s (%s) with the %s engine in %.1fs (fetch %.1fs, start %.1fs); limits %s",
            settings.artifact,
            kind,
            engine.info.name,
            done - started,
            fetched - started,
            done - fetched,
            engine.limits,
        )
        service = cls(settings, tokenizer, engine, manifest, metrics)
        service.telemetry.metrics.artifact.labels(
            engine.info.name, settings.artifact, described
        ).set(1)
        return service

    def is_healthy(self) -> bool:
        return self.engine.is_healthy()

    def abort_all(self) -> int:
        """Abort every request in the engine (end of a drain); returns how many."""
        live = list(self._live)
        for request_id in live:
            self.engine.abort(request_id)
        return len(live)

    # ---- requests ----

    def prompt_ids(self, prompt: str | None, messages: list[ChatMessage] | None) -> list[int]:
        if messages is not None:
            try:
                return encode_chat(messages, self.tokenizer)
            except ChatFormatError as exc:
                raise RequestError(str(exc), param="messages") from None
        return self.tokenizer.encode(prompt or "", bos=True)

    def check_prompt(self, ids: list[int], max_new_tokens: int, param: str = "prompt") -> int:
        """Refuse a prompt the engine cannot take; return max_new_tokens clamped to what
        the engine allows after this prompt."""
        limits = self.engine.limits
        if len(ids) > limits.max_input_len:
            raise RequestError(
                f"prompt is {len(ids)} tokens; this engine accepts at most "
                f"{limits.max_input_len} input tokens",
                param=param,
            )
        room = limits.max_seq_len - len(ids)
        if room < 1:
            raise RequestError(
                f"prompt is {len(ids)} tokens, which leaves no room to generate within the "
                f"engine's {limits.max_seq_len}-token sequence limit",
                param=param,
            )
        return min(max_new_tokens, room)

    def parse_predict(self, body: object) -> tuple[PredictRequest, GenerationRequest]:
        try:
            req = PredictRequest.model_validate(body)
        except ValidationError as exc:
            raise RequestError(describe_validation_error(exc)) from None
        ids = self.prompt_ids(req.prompt, req.messages)
        sampling = SamplingOptions(
            max_new_tokens=self.check_prompt(
                ids, req.max_new_tokens, "messages" if req.messages else "prompt"
            ),
            temperature=req.temperature,
            top_k=req.top_k,
            top_p=req.top_p if 0.0 < req.top_p < 1.0 else 1.0,
            seed=req.seed,
            repetition_penalty=req.repetition_penalty,
            presence_penalty=req.presence_penalty,
            frequency_penalty=req.frequency_penalty,
        )
        return req, GenerationRequest(ids, sampling, tuple(req.stop or ()), req.streaming_interval)

    async def stream(
        self, gen: GenerationRequest, record: RequestRecord, prompt_text: str | None = None
    ) -> AsyncIterator[str]:
        """Text chunks as they are ready; `record` is filled in as it goes and reported
        (log line + metrics) when the stream ends. Leaving early (client gone, stop
        string) aborts the engine request."""
        record.prompt_tokens = len(gen.prompt_ids)
        text = TextStream(self.tokenizer.table, gen.stop, gen.interval)
        tokens = self.engine.generate(record.engine_id, gen.prompt_ids, gen.sampling)
        self._live.add(record.engine_id)
        engine_done = False
        engine_reason: str | None = None
        record.finish_reason = "abort"  # unless we get to the end below
        try:
            async for delta in tokens:
                chunk = text.add(delta.token_ids)
                record.completion_tokens = text.num_tokens
                if chunk:
                    record.first_token_at = record.first_token_at or time.monotonic()
                    yield chunk
                if text.stopped:
                    break
                if delta.finish_reason is not None:
                    engine_done, engine_reason = True, delta.finish_reason
                    break
            tail = text.finish()  # may complete a stop string (a byte-fallback character)
            reason = "stop" if text.stopped else (engine_reason or "abort")
            record.output = text.text
            if tail:
                record.first_token_at = record.first_token_at or time.monotonic()
                yield tail
            record.finish_reason = reason
        except EngineRequestError as exc:
            record.finish_reason = "error"
            raise RequestError(str(exc)) from None
        except Exception:
            record.finish_reason = "error"
            raise
        finally:
            if not engine_done:
                self.engine.abort(record.engine_id)  # sync first: nothing may await past a cancel
            await tokens.aclose()
            self._live.discard(record.engine_id)
            self.telemetry.finished(record, prompt_text)

    async def complete(
        self,
        gen: GenerationRequest,
        record: RequestRecord,
        is_disconnected: Callable[[], Awaitable[bool]] | None = None,
        prompt_text: str | None = None,
    ) -> RequestRecord:
        """The whole answer; stops (and aborts the engine request) if the client leaves."""

        async def drain() -> None:
            async for _ in self.stream(gen, record, prompt_text):
                pass

        task = asyncio.ensure_future(drain())
        try:
            while not task.done():
                await asyncio.wait({task}, timeout=0.5)
                if not task.done() and is_disconnected is not None and await is_disconnected():
                    break
        finally:
            if not task.done():  # client gone, or we were cancelled: stop generating
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if not task.cancelled():
            task.result()  # re-raise what generation raised
        return record
