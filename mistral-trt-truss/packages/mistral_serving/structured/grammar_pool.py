"""Schema compiles in child processes that can be killed: xgrammar's compiler runs in C++
and no thread can interrupt it (a 285-byte pattern takes minutes, a 2.7 MB enum longer,
and a process stuck in one ignores SIGTERM), so a compile that overruns its time limit
costs the child process, not the server.

Each worker is `python -m mistral_serving.structured.grammar_pool`, speaking one JSON object per line
on stdin/stdout: first the vocabulary (the same `TokenizerInfo` as `guided.GuidedDecoder`
builds), then one schema per line, answered `{"ok": ms}` or `{"error": message}`. The
child only proves that a schema compiles, and how fast; the engine compiles it again
where it decodes (in-process, in the engine process, or inside TensorRT-LLM), now known
to finish within the limit. Workers start at the first schema; one killed is replaced at
once, in the background; they die with the server (parent-death signal, end of stdin).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from mistral_serving.errors import RequestError

if TYPE_CHECKING:
    from mistral_serving.text.tokenizer import Tokenizer

log = logging.getLogger(__name__)

START_TIMEOUT_S = 120.0  # importing xgrammar and building the vocabulary, on a busy host
_READ_LIMIT = 2**20
# xgrammar's messages start with a timestamp and its build's source path
# ("[21:11:12] /project/cpp/json_schema_converter.cc:5082: ..."): not for clients or logs.
_XGR_PREFIX = re.compile(r"^\s*(\[[0-9:]+\]\s*)?(\S+\.(cc|h|cpp|py):\d+:\s*)?")


def clean_xgrammar_error(exc: BaseException) -> str:
    """One line of an xgrammar error, without its timestamp and source path."""
    text = str(exc).strip()
    first = text.splitlines()[0] if text else ""
    return _XGR_PREFIX.sub("", first).strip()[:300] or type(exc).__name__


@dataclass(frozen=True)
class Vocab:
    """What xgrammar's TokenizerInfo is built from (`GuidedDecoder._compiler_once`)."""

    token_bytes: tuple[bytes, ...]
    vocab_size: int
    stop_token_ids: tuple[int, ...]

    @classmethod
    def of(cls, tokenizer: Tokenizer) -> Vocab:
        tokens = tuple(b or b"" for b in tokenizer.table.token_bytes)
        stops = tuple(sorted({tokenizer.eos_id, *tokenizer.stop_token_ids}))
        return cls(tokens, len(tokens), stops)

    def message(self) -> bytes:
        body = {
            "tokens": [b.hex() for b in self.token_bytes],
            "vocab_size": self.vocab_size,
            "stop_token_ids": list(self.stop_token_ids),
        }
        return json.dumps(body).encode() + b"\n"


class _Worker:
    def __init__(self, proc: asyncio.subprocess.Process, loop: asyncio.AbstractEventLoop):
        self.proc = proc
        self.loop = loop

    async def ask(self, message: bytes) -> dict[str, object]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(message)
        await self.proc.stdin.drain()
        line = await self.proc.stdout.readline()
        if not line:
            raise ConnectionError("the grammar compiler process ended")
        reply = json.loads(line)
        if not isinstance(reply, dict):  # the child writes one JSON object a line
            raise ConnectionError(f"the grammar compiler process answered {line[:200]!r}")
        return reply

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(RuntimeError):  # reap it (the loop may be gone at exit)
            self.loop.call_soon_threadsafe(lambda: asyncio.ensure_future(self.proc.wait()))


class CompilePool:
    """At most `workers` compiles at once, each within `timeout_s`, each in a child."""

    def __init__(self, vocab: Callable[[], Vocab], workers: int, timeout_s: float) -> None:
        self._vocab = vocab  # built at the first start (most servers never need it)
        self.workers = workers
        self.timeout_s = timeout_s
        self._sem: asyncio.Semaphore | None = None
        self._sem_loop: asyncio.AbstractEventLoop | None = None
        self._refill: asyncio.Task[None] | None = None  # a replacement worker starting
        self._idle: list[_Worker] = []
        self._live: set[_Worker] = set()
        self.killed = 0  # workers killed for overrunning the limit (or crashing)
        self.started = 0

    async def compile(self, schema: str) -> str | None:
        """None when `schema` compiles within the limit, else the refusal's reason."""
        loop = asyncio.get_running_loop()
        if self._sem is None or self._sem_loop is not loop:
            self._drop_all()  # workers of another event loop (tests) cannot be used here
            self._sem, self._sem_loop = asyncio.Semaphore(self.workers), loop
        async with self._sem:
            if not self._idle and self._refill is not None and not self._refill.done():
                await asyncio.shield(self._refill)  # a replacement is starting: use it
            worker = self._idle.pop() if self._idle else await self._start(loop)
            started = time.monotonic()
            try:
                reply = await asyncio.wait_for(
                    worker.ask(json.dumps({"schema": schema}).encode() + b"\n"), self.timeout_s
                )
            except TimeoutError:
                self._kill(worker)
                self._start_replacement(loop)
                log.warning(
                    "response_format: a %d-byte schema overran the %.1fs compile limit; "
                    "its compiler process was killed",
                    len(schema),
                    self.timeout_s,
                )
                return (
                    f"the schema's grammar did not compile within {self.timeout_s:g}s "
                    "(grammar_compile_timeout_seconds)"
                )
            except (ConnectionError, ValueError, OSError):
                self._kill(worker)  # it crashed on this schema: the schema's fault
                self._start_replacement(loop)
                log.warning("response_format: the grammar compiler process died on a schema")
                return "the schema crashed the grammar compiler"
            except BaseException:
                self._kill(worker)  # cancelled mid-compile (shutdown): its state is unknown
                raise
            self._idle.append(worker)
            if "error" in reply:
                return f"cannot use this schema: {reply['error']}"
            log.debug("response_format: schema compiled in %.1f ms (%.1f ms round trip)",
                      reply.get("ok", 0.0), (time.monotonic() - started) * 1000)  # fmt: skip
            return None

    async def _start(self, loop: asyncio.AbstractEventLoop) -> _Worker:
        env = dict(os.environ)
        # The package's parent directory, so `-m mistral_serving.structured.grammar_pool` resolves.
        root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "mistral_serving.structured.grammar_pool",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            env=env,
            limit=_READ_LIMIT,
        )
        worker = _Worker(proc, loop)
        self._live.add(worker)
        self.started += 1
        try:
            reply = await asyncio.wait_for(worker.ask(self._vocab().message()), START_TIMEOUT_S)
            if not reply.get("ready"):
                raise ConnectionError(str(reply.get("error", reply))[:200])
        except BaseException as exc:
            self._kill(worker)
            if isinstance(exc, asyncio.CancelledError):
                raise
            log.error("response_format: the grammar compiler process did not start: %s", exc)
            raise RequestError(
                "response_format: structured output is unavailable (the grammar compiler "
                "did not start)",
                status=503,
                param="response_format",
            ) from None
        return worker

    def _start_replacement(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start a worker in the background for the one just killed, so the next schema
        does not wait for a process start (seconds)."""
        if self._refill is not None and not self._refill.done():
            return

        async def refill() -> None:
            with contextlib.suppress(RequestError):  # logged; the next compile retries
                self._idle.append(await self._start(loop))

        self._refill = loop.create_task(refill())

    def _kill(self, worker: _Worker) -> None:
        self._live.discard(worker)
        worker.kill()
        self.killed += 1

    def _drop_all(self) -> None:
        if self._refill is not None:
            with contextlib.suppress(RuntimeError):  # its loop may be closed (tests)
                self._refill.get_loop().call_soon_threadsafe(self._refill.cancel)
            self._refill = None
        for worker in list(self._live):
            self._live.discard(worker)
            worker.kill()
        self._idle = []

    def close(self) -> None:
        """Kill every worker (the server is stopping). Safe from any thread, and again."""
        self._drop_all()


def _die_with_parent() -> None:
    """Linux: SIGKILL this process when the server dies, even mid-compile."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _child() -> None:
    _die_with_parent()
    out = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)  # anything xgrammar prints goes to stderr, not into the replies
    lines = sys.stdin.buffer
    first = lines.readline()
    if not first:
        return
    try:
        import xgrammar as xgr

        init = json.loads(first)
        info = xgr.TokenizerInfo(
            [bytes.fromhex(h) for h in init["tokens"]],
            xgr.VocabType.RAW,
            vocab_size=init["vocab_size"],
            stop_token_ids=init["stop_token_ids"],
        )
        # No cache: the parent caches verdicts; each schema is compiled here once.
        compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which refuses
        out.write(json.dumps({"error": clean_xgrammar_error(exc)}).encode() + b"\n")
        return
    out.write(b'{"ready": true}\n')
    for line in lines:
        started = time.perf_counter()
        try:
            # The same call and options as guided.GuidedDecoder.compile.
            compiler.compile_json_schema(json.loads(line)["schema"], any_whitespace=False)
            reply: dict[str, float | str] = {"ok": round((time.perf_counter() - started) * 1000, 3)}
        except Exception as exc:  # noqa: BLE001 - xgrammar: RuntimeError/ValueError
            reply = {"error": clean_xgrammar_error(exc)}
        out.write(json.dumps(reply).encode() + b"\n")


if __name__ == "__main__":
    _child()
