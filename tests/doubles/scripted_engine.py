"""`ScriptedEngine`: a test double of the `Engine` protocol (`engines/base.py`), no model.

Every `generate` call plays the same script, one step per iteration:
- a `TokenDelta` is yielded as is (a finish reason on it ends the stream);
- an exception instance is raised at that point (e.g. `EngineRequestError`).
When the script runs out without a finish reason the stream waits, like a long generation,
until `abort(request_id)` is called; then (as after any abort) it ends with
`TokenDelta([], "abort")`, as the protocol asks.

What the service did is recorded: `calls` (request id, prompt ids, sampling), `aborted`
(ids passed to `abort`, in order) and `closed` (ids whose stream was closed or finished).
`step_delay_s` sleeps before each step so tests can act while a stream is live.
`num_running()` counts the live streams; `kv_cache_usage()` returns `kv_usage` (set it).
`stalled_for()` returns `stalled_s` (set it to play a hung engine for the watchdog).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from mistral_serving.engines.base import EngineInfo, EngineLimits, SamplingOptions, TokenDelta


@dataclass(frozen=True)
class GenerateCall:
    request_id: str
    prompt_ids: list[int]
    sampling: SamplingOptions


class ScriptedEngine:
    def __init__(
        self,
        script: Sequence[TokenDelta | BaseException] = (),
        *,
        limits: EngineLimits | None = None,
        eos_token_id: int = 2,
        step_delay_s: float = 0.0,
    ) -> None:
        self.script = list(script)
        self.limits = limits or EngineLimits(max_input_len=64, max_seq_len=128, max_batch_size=4)
        self.info = EngineInfo("scripted", {"steps": len(self.script)})
        self.eos_token_id = eos_token_id
        self.step_delay_s = step_delay_s
        self.calls: list[GenerateCall] = []
        self.aborted: list[str] = []
        self.closed: list[str] = []
        self.healthy = True
        self.kv_usage = 0.0
        self.stalled_s = 0.0
        self.shutdowns = 0
        self._abort_events: dict[str, asyncio.Event] = {}

    @classmethod
    def from_ids(
        cls,
        token_ids: Sequence[int],
        finish_reason: str | None = "length",
        per_step: int = 1,
        **kwargs,
    ) -> ScriptedEngine:
        """A script that yields `token_ids` `per_step` at a time; the last step carries
        `finish_reason` (None: the stream then waits for an abort)."""
        steps = [list(token_ids[i : i + per_step]) for i in range(0, len(token_ids), per_step)]
        script = [TokenDelta(ids) for ids in steps]
        if finish_reason is not None:
            last = script.pop() if script else TokenDelta([])
            script.append(TokenDelta(last.token_ids, finish_reason))
        return cls(script, **kwargs)

    async def generate(
        self, request_id: str, prompt_ids: list[int], sampling: SamplingOptions
    ) -> AsyncIterator[TokenDelta]:
        self.calls.append(GenerateCall(request_id, list(prompt_ids), sampling))
        aborted = self._abort_events.setdefault(request_id, asyncio.Event())
        try:
            for step in self.script:
                if self.step_delay_s:
                    await asyncio.sleep(self.step_delay_s)
                if aborted.is_set():
                    break
                if isinstance(step, BaseException):
                    raise step
                yield step
                if step.finish_reason is not None:
                    return
            else:
                await aborted.wait()  # script over, no finish: run until aborted
            yield TokenDelta([], "abort")
        finally:
            self.closed.append(request_id)
            self._abort_events.pop(request_id, None)

    def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)
        event = self._abort_events.get(request_id)
        if event is not None:
            event.set()

    def is_healthy(self) -> bool:
        return self.healthy

    def kv_cache_usage(self) -> float:
        return 0.0  # no cache: the gauge reads 0

    def num_running(self) -> int:
        return len(self._abort_events)  # streams started and not yet closed

    def stalled_for(self) -> float:
        return self.stalled_s

    def shutdown(self) -> None:
        self.healthy = False
        for request_id in list(self._abort_events):
            self.abort(request_id)
