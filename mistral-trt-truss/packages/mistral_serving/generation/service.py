"""The generation service: a validated request in, text chunks out, on the engine that
was started. It owns no HTTP: `frontend.py` and the wire formats in `protocols/` call it.

A request is tokenized here (in a worker thread, after admission, behind a cheap length
bound), checked against the engine's limits, and streamed through `TextStream`
(detokenizer, stop strings, throttling).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import NamedTuple

from mistral_serving.artifacts.artifact import open_artifact, resolve_artifact
from mistral_serving.artifacts.manifest import describe
from mistral_serving.engines.base import (
    Engine,
    EngineError,
    EngineRequestError,
    SamplingOptions,
    TokenDelta,
    TokenLogprob,
)
from mistral_serving.engines.factory import start_engine
from mistral_serving.engines.watchdog import Watchdog
from mistral_serving.errors import RequestError
from mistral_serving.generation import deadline
from mistral_serving.generation.outcome import Outcome
from mistral_serving.ops.metrics import Metrics, default_metrics
from mistral_serving.ops.record import RequestRecord
from mistral_serving.ops.startup import process_age_seconds
from mistral_serving.ops.telemetry import Telemetry
from mistral_serving.ops.tracing import tracing_for
from mistral_serving.settings import Settings
from mistral_serving.structured.grammar import export_metrics, gate_for
from mistral_serving.text.chat import ChatFormatError, Message, encode_chat, message_texts
from mistral_serving.text.streaming import TextStream
from mistral_serving.text.tokenizer import Tokenizer, load_tokenizer
from mistral_serving.tools.tool_calls import Tool, parameters_text, tool_texts

log = logging.getLogger(__name__)

# Tokenizing more text than this runs in a worker thread, off the event loop.
INLINE_TOKENIZE_CHARS = 2048
# A prompt longer than 2 x (max_input_len + PROBE_MARGIN_TOKENS) characters is tokenized
# in growing prefixes first (`_probe_length`); a prefix of more than max_input_len +
# PROBE_MARGIN_TOKENS tokens refuses the request. The margin covers what cutting the text
# (at a space) can change in the count; the prefix is cut before a space, where
# SentencePiece and byte-level BPE pieces start anyway.
PROBE_MARGIN_TOKENS = 8
_PROBES = itertools.count(1)  # health probes' engine ids


@dataclass(frozen=True)
class GenerationRequest:
    """A validated request in engine terms, whichever route it came from; the prompt is
    not tokenized yet (that happens after admission)."""

    sampling: SamplingOptions  # max_new_tokens: what was asked; clamped by `prepare`
    prompt: str | None = None
    prompt_ids: tuple[int, ...] | None = None  # a prompt given as token ids
    messages: tuple[Message, ...] | None = None
    stop: tuple[str, ...] = ()
    interval: int = 1  # tokens per streamed chunk
    param: str = "prompt"  # the body field that holds the prompt (named in errors)
    # The answer continues the prompt's text (completions' echo): the output keeps a
    # SentencePiece model's leading space, which a decode from the start would strip.
    echo: bool = False
    tools: tuple[Tool, ...] = ()  # offered to the model in its own format (chat.encode_chat)

    @property
    def prompt_text(self) -> str | None:
        """What the request log may show as the prompt (with log_prompts on)."""
        if self.messages is not None:
            return "\n".join(f"{m.role}: {m.content}" for m in self.messages)
        return self.prompt


@dataclass(frozen=True)
class PreparedRequest:
    """Tokenized and within the engine's limits."""

    prompt_ids: list[int]
    sampling: SamplingOptions
    stop: tuple[str, ...]
    interval: int
    echo: bool = False


class Chunk(NamedTuple):
    """Text ready to send, and the logprobs of the tokens it holds (when asked)."""

    text: str
    logprobs: list[TokenLogprob] | None = None


class GenerationService:
    def __init__(
        self,
        settings: Settings,
        tokenizer: Tokenizer,
        engine: Engine,
        metrics: Metrics | None = None,
    ) -> None:
        self.settings = settings
        self.tokenizer = tokenizer
        self.engine = engine
        self.telemetry = Telemetry(
            metrics or default_metrics(settings.metrics_prefix),
            settings.log_prompts,
            tracing_for(settings.otlp_traces_endpoint),
        )

        self.live: set[str] = set()  # engine ids of the requests in the engine now
        # Seconds each phase of `start` took (artifact, tokenizer, engine); GET /version
        # reports them so a slow cold start shows which phase to look at.
        self.startup: dict[str, float] = {}
        self.watchdog = Watchdog(
            engine, settings.engine_stall_unready_seconds, settings.engine_stall_exit_seconds
        )
        # response_format schemas are checked (bounds, a timed compile in a child process)
        # here, before any engine kind sees them.
        self.grammar = gate_for(settings, tokenizer)
        export_metrics(settings.metrics_prefix, self.grammar, getattr(engine, "guided", None))
        # No token is longer than this many bytes (so no prompt of more characters than
        # max_input_len * this can fit): the bound checked before tokenizing.
        self._max_token_chars = max((len(b) for b in tokenizer.table.token_bytes if b), default=1)

    @classmethod
    def start(
        cls, settings: Settings, hf_token: str | None, metrics: Metrics | None = None
    ) -> GenerationService:
        """Resolve the artifact, check it, start its engine; log what and how long."""
        started = time.monotonic()
        process = process_age_seconds()  # interpreter, imports, server start: before load()
        if process is not None:
            log.info("startup phase process (interpreter, imports, server): %.1fs", process)
        path = resolve_artifact(settings, hf_token)  # the Hub's download, or a local/mounted dir
        resolved = time.monotonic()
        artifact = open_artifact(path, settings)  # confined, verified (hashes once), read once
        fetched = time.monotonic()
        manifest = artifact.manifest
        described = describe(manifest) if manifest is not None else "no build manifest"
        log.info("artifact %s: %s", artifact.path, described)
        log.info(
            "startup phase artifact (fetch, verify, read): %.1fs (fetch %.1fs, verify %.1fs)",
            fetched - started,
            resolved - started,
            fetched - resolved,
        )
        tokenizer = load_tokenizer(artifact.path)
        tokenized = time.monotonic()
        log.info("startup phase tokenizer: %.1fs", tokenized - fetched)
        engine = start_engine(artifact, settings, tokenizer)
        done = time.monotonic()
        log.info("startup phase engine start: %.1fs", done - tokenized)
        log.info(
            "loaded %s (%s) with the %s engine in %.1fs (artifact %.1fs, start %.1fs); limits %s",
            settings.artifact,
            artifact.kind,
            engine.info.name,
            done - started,
            fetched - started,
            done - fetched,
            engine.limits,
        )
        service = cls(settings, tokenizer, engine, metrics)
        service.startup = {
            **({"process": process} if process is not None else {}),
            "artifact": round(fetched - started, 3),
            "artifact_fetch": round(resolved - started, 3),
            "artifact_verify": round(fetched - resolved, 3),
            "tokenizer": round(tokenized - fetched, 3),
            "engine": round(done - tokenized, 3),
        }
        service.watchdog.start()  # a served engine that hangs ends the process
        service.telemetry.metrics.artifact.labels(
            engine.info.name, settings.artifact, described
        ).set(1)
        return service

    def is_healthy(self) -> bool:
        return self.engine.is_healthy()

    def stalled(self) -> str | None:
        """Why readiness must fail although the engine lives (it stalled), or None."""
        return self.watchdog.stall()

    async def probe(self, timeout_s: float) -> float:
        """One greedy token from a two-token prompt, straight to the engine (no queue, no
        request metrics): the seconds it took. TimeoutError past `timeout_s`; EngineError
        if the engine fails it. The deep health probe: a process can be up, its engine
        hung, and a plain /health none the wiser."""
        engine_id = f"health-probe-{next(_PROBES)}"
        prompt = self.tokenizer.encode("ok", bos=True)
        started = time.monotonic()
        tokens = self.engine.generate(engine_id, prompt, SamplingOptions(1, top_k=1))
        self.live.add(engine_id)  # a drain's abort_all ends it too
        done = False
        try:
            async with asyncio.timeout(timeout_s):
                async for delta in tokens:
                    if delta.token_ids or delta.finish_reason is not None:
                        done = delta.finish_reason is not None
                        break
        finally:
            if not done:
                self.engine.abort(engine_id)
            if isinstance(tokens, AsyncGenerator):
                await tokens.aclose()
            self.live.discard(engine_id)
        return time.monotonic() - started

    def abort_all(self) -> int:
        """Abort every request in the engine (end of a drain); returns how many."""
        live = list(self.live)
        for request_id in live:
            self.engine.abort(request_id)
        return len(live)

    def shutdown(self) -> None:
        """Stop the engine (its executor and workers); the server is exiting."""
        self.watchdog.stop()
        self.grammar.close()
        self.engine.shutdown()
        if self.telemetry.tracing is not None:
            self.telemetry.tracing.shutdown()  # flush the spans still queued

    # ---- requests ----

    async def prepare(
        self,
        req: GenerationRequest,
        deadline_at: float | None = None,
        is_disconnected: Callable[[], Awaitable[bool]] | None = None,
    ) -> PreparedRequest:
        """Tokenize (off the event loop when long) and check against the engine; a
        schema's check waits at most until `deadline_at` and while the client is there."""
        limits = self.engine.limits
        ids = await self.prompt_ids(req)
        try:
            max_new = limits.fit(len(ids), req.sampling.max_new_tokens, what=req.param)
        except EngineRequestError as exc:
            raise RequestError(str(exc), param=req.param) from None
        sampling = req.sampling
        if sampling.guided is not None:  # a bad or too costly schema: a 4xx, never a 5xx
            check = self.grammar.check(sampling.guided)
            if deadline_at is None and is_disconnected is None:
                await check
            else:  # a compile may queue behind others': not past the request's end
                where = "while its schema waited for its compile"
                await deadline.while_present(deadline_at, check, where, is_disconnected)
        if sampling.max_new_tokens != max_new:
            sampling = dataclasses.replace(sampling, max_new_tokens=max_new)
        # The model's other end-of-turn tokens (generation_config's eos_token_id list);
        # EOS itself always ends generation unless ignore_eos.
        extra = tuple(t for t in self.tokenizer.stop_token_ids if t != self.engine.eos_token_id)
        if extra and not sampling.ignore_eos:
            stops = tuple(dict.fromkeys((*sampling.stop_token_ids, *extra)))
            sampling = dataclasses.replace(sampling, stop_token_ids=stops)
        return PreparedRequest(ids, sampling, req.stop, req.interval, req.echo)

    async def prompt_ids(self, req: GenerationRequest) -> list[int]:
        """The prompt's token ids (a chat in the model's format, its tools included),
        within the engine's input limit; what `prepare` starts from, and what a count of
        the prompt's tokens counts."""
        limits = self.engine.limits
        if req.prompt_ids is not None:
            ids = list(req.prompt_ids)
            vocab = self.tokenizer.vocab_size
            if ids and (min(ids) < 0 or max(ids) >= vocab):
                raise RequestError(f"prompt token ids must be in [0, {vocab})", param=req.param)
        else:
            # Every text that reaches the prompt is counted (tool descriptions, earlier
            # calls' arguments, results), not only message contents: each is tokenized.
            chars = sum(map(len, _texts(req)))
            self._check_chars(req, chars)
            # Tool schemas are measured (serialized) in the worker thread too.
            if chars > INLINE_TOKENIZE_CHARS or req.tools:
                ids = await asyncio.to_thread(self._encode_within, req, limits.max_input_len)
            else:
                ids = self._encode_within(req, limits.max_input_len)
        return ids

    def _check_chars(self, req: GenerationRequest, chars: int) -> None:
        """No token is longer than `_max_token_chars`: more characters than the input
        limit times that cannot fit, refused before anything is tokenized."""
        limit = self.engine.limits.max_input_len
        if chars > limit * self._max_token_chars:
            raise RequestError(
                f"{req.param} is {chars} characters: more than this engine's "
                f"{limit}-token input limit can hold",
                param=req.param,
            )

    def _encode_within(self, req: GenerationRequest, limit: int) -> list[int]:
        """`_encode`, after `_probe_length` found nothing over `limit` tokens: a prompt
        far over the limit costs about what tokenizing `limit` tokens costs, not what its
        whole length (up to the character bound) would."""
        texts = list(_texts(req))
        if req.tools:
            texts.append(parameters_text(req.tools))
            self._check_chars(req, sum(map(len, texts)))
        text = "\n".join(texts)
        found = self._probe_length(text, limit)
        if found is not None:
            cut, count = found
            raise RequestError(
                f"{req.param} is more than {limit} tokens (its first {cut} characters are "
                f"{count} tokens); this engine accepts at most {limit} input tokens",
                param=req.param,
            )
        return self._encode(req)

    def _probe_length(self, text: str, limit: int) -> tuple[int, int] | None:
        """(characters, tokens) of the first prefix of `text` that shows it holds more
        than `limit` tokens; None if none does. Prefixes double from 2 x (limit + margin)
        characters, each cut before a space, so the characters tokenized here are at
        most about twice those of the prefix that proved it, and a text that fits is
        tokenized at most about twice over in all. (For chat, the messages' contents:
        the chat's own tokens are more.)"""
        bound = limit + PROBE_MARGIN_TOKENS
        size = 2 * bound
        while size < len(text):
            cut = _cut_before_space(text, size)
            count = len(self.tokenizer.encode(text[:cut]))
            if count > bound:
                return cut, count
            size *= 2
        return None

    def _encode(self, req: GenerationRequest) -> list[int]:
        if req.messages is not None:
            try:
                return encode_chat(list(req.messages), self.tokenizer, req.tools)
            except ChatFormatError as exc:
                raise RequestError(str(exc), param=req.param) from None
        return self.tokenizer.encode(req.prompt or "", bos=True)

    def generate(self, req: PreparedRequest, record: RequestRecord) -> Generation:
        """The request's generation: its chunks as they are ready, then its `Outcome`.
        `record` gets its times (submitted, first token); closing it is the caller's."""
        return Generation(self, req, record)


class Generation:
    """One request's generation: async-iterate it for its chunks; once they end (or the
    iteration stops early, or fails) `outcome` says how it ended and what it produced.
    Leaving early (client gone, stop string) aborts the engine request. A failure of
    this request raises RequestError (the client's fault) or EngineError; other
    requests go on."""

    def __init__(self, service: GenerationService, req: PreparedRequest, record: RequestRecord):
        self._service = service
        self._req = req
        self._record = record
        self.prompt_tokens = len(req.prompt_ids)
        self.completion_tokens = 0  # so far: a stream's continuous usage reads it
        self.outcome: Outcome | None = None
        self._text = ""
        self._stop_string: str | None = None
        self._logprobs: list[TokenLogprob] | None = (
            [] if req.sampling.logprobs is not None else None
        )
        self._iterator: AsyncGenerator[Chunk, None] | None = None

    def __aiter__(self) -> AsyncIterator[Chunk]:
        if self._iterator is not None:
            raise RuntimeError("a generation is iterated once")
        self._iterator = self._chunks()
        return self._iterator

    async def aclose(self) -> None:
        """Stop it now if it is still running (the engine request is aborted): its
        outcome is set when this returns."""
        if self._iterator is not None:
            await self._iterator.aclose()

    async def complete(
        self, is_disconnected: Callable[[], Awaitable[bool]] | None = None
    ) -> Outcome:
        """Run it to the end and return its outcome; stops (and aborts the engine
        request) if the client leaves. A failure of this request raises RequestError or
        EngineError, with `outcome` set."""

        async def drain() -> None:
            async for _ in self:
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
        return self.outcome or self.cut()

    def cut(self) -> Outcome:
        """What was produced so far, as an answer cut short (abort)."""
        return self._ended("abort")

    def _ended(self, reason: str) -> Outcome:
        logprobs = tuple(self._logprobs) if self._logprobs is not None else None
        stop = self._stop_string if reason == "stop" else None
        return Outcome(
            reason, self._text, self.prompt_tokens, self.completion_tokens, logprobs, stop
        )

    async def _chunks(self) -> AsyncGenerator[Chunk, None]:
        service, req, record = self._service, self._req, self._record
        text = self._text_stream()
        want_logprobs = self._logprobs is not None
        pending: list[TokenLogprob] = []
        if deadline.passed(record.deadline):  # never reaches the engine
            self.outcome = self._ended(deadline.FINISH_REASON)
            return
        tokens = self._submit()
        engine_done = False
        engine_reason: str | None = None
        reason = "abort"  # unless we get to the end below
        try:
            async for delta in tokens:
                chunk = text.add(delta.token_ids)
                self.completion_tokens = text.num_tokens
                if want_logprobs and delta.prompt_logprobs is not None:
                    # Echo: the prompt's logprobs lead (its first token has none).
                    pending[:0] = [TokenLogprob(req.prompt_ids[0], None), *delta.prompt_logprobs]
                if want_logprobs and delta.logprobs:
                    pending.extend(delta.logprobs)
                if chunk:
                    self._text = text.text
                    record.first_token_at = record.first_token_at or time.monotonic()
                    yield self._chunk(chunk, pending)
                    pending = []
                if text.stopped:
                    break
                if delta.finish_reason is not None:
                    engine_done, engine_reason = True, delta.finish_reason
                    break
            tail = text.finish()  # may complete a stop string (a byte-fallback character)
            reason = "stop" if text.stopped else (engine_reason or "abort")
            self._text = text.text
            if tail or pending:
                record.first_token_at = record.first_token_at or time.monotonic()
                yield self._chunk(tail, pending)
        except deadline.DeadlineExceeded:  # aborted below; the answer says "timeout"
            reason = deadline.FINISH_REASON
        except EngineRequestError as exc:
            reason = "invalid"
            raise RequestError(str(exc)) from None
        except EngineError:
            reason = "error"
            raise
        except Exception:
            reason = "error"
            log.exception("request %s failed", record.request_id)
            raise EngineError("generation failed") from None
        finally:
            self._close(text, reason, engine_done)  # sync first: nothing may await past a cancel
            if isinstance(tokens, AsyncGenerator):  # what every engine returns: close it now
                await tokens.aclose()
            service.live.discard(record.engine_id)

    def _text_stream(self) -> TextStream:
        """The request's detokenizer, with its stop strings and streaming interval (echo
        keeps the prompt's leading space)."""
        table = self._service.tokenizer.table
        if self._req.echo:
            table = dataclasses.replace(table, strip_leading_space=False)
        return TextStream(table, self._req.stop, self._req.interval)

    def _submit(self) -> AsyncIterator[TokenDelta]:
        """Hand the request to the engine: its deltas, bounded by its deadline."""
        service, req, record = self._service, self._req, self._record
        record.submitted_at = time.monotonic()
        tokens = service.engine.generate(record.engine_id, req.prompt_ids, req.sampling)
        if record.deadline is not None:
            tokens = deadline.bounded(tokens, record.deadline)
        service.live.add(record.engine_id)
        return tokens

    def _close(self, text: TextStream, reason: str, engine_done: bool) -> None:
        """The outcome, once generation ended for `reason`; the engine's request aborted
        unless the engine ended it."""
        self._text = text.text
        self._stop_string = text.stop_string
        self.outcome = self._ended(reason)
        if not engine_done:
            self._service.engine.abort(self._record.engine_id)

    def _chunk(self, text: str, pending: list[TokenLogprob]) -> Chunk:
        if self._logprobs is None:
            return Chunk(text)
        self._logprobs.extend(pending)
        return Chunk(text, pending)


def _texts(req: GenerationRequest) -> Iterator[str]:
    """The request's texts that reach the prompt, but the tools' parameter schemas."""
    if req.messages is None:
        yield req.prompt or ""
        return
    yield from message_texts(req.messages)
    yield from tool_texts(req.tools)


def _cut_before_space(text: str, at: int, reach: int = 64) -> int:
    """A cut at or below `at` just before a whitespace that follows a non-space (no
    token spans it), looking back at most `reach` characters; else `at` itself."""
    for i in range(at, max(0, at - reach), -1):
        if text[i].isspace() and not text[i - 1].isspace():
            return i
    return at
