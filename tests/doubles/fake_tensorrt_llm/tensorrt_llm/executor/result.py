"""Mirrors tensorrt_llm/executor/result.py: `CompletionOutput` (token_ids, token_ids_diff,
finish_reason) and `GenerationResult` (async iterator of itself, `finished`, `abort()`).

Instead of reading responses from the C++ executor, each step of the iteration "decodes"
tokens from the LLM double's script and applies the runtime's stop rules: end_id (unless
ignore_eos), stop_token_ids (trimmed from the output, as the LLM API does when
include_stop_str_in_output is False), max_tokens, and abort ('cancelled')."""

import asyncio
from dataclasses import dataclass, field
from typing import Any

from tensorrt_llm.executor.utils import RequestError


@dataclass(slots=True)
class CompletionOutput:
    index: int
    text: str = ""
    token_ids: list[int] | None = field(default_factory=list)
    finish_reason: str | None = None  # 'stop' | 'length' | 'timeout' | 'cancelled'
    stop_reason: Any | None = None
    _last_token_ids_len: int = field(default=0, init=False, repr=False)

    @property
    def length(self) -> int:
        return len(self.token_ids)

    @property
    def token_ids_diff(self) -> list[int]:
        return self.token_ids[self._last_token_ids_len :]


class GenerationResult:
    def __init__(self, request_id: int, prompt_token_ids, sampling_params, streaming, llm):
        self.id = request_id
        self.sampling_params = sampling_params
        self._prompt_token_ids = list(prompt_token_ids)
        self._streaming = streaming
        self._llm = llm
        self._outputs = [CompletionOutput(0)]
        self._done = False
        self._aborted = False
        self._request_error: str | None = None  # test knob: fail this request only

    # -- the real public surface -------------------------------------------------------
    @property
    def request_id(self) -> int:
        return self.id

    @property
    def prompt_token_ids(self) -> list[int]:
        return self._prompt_token_ids

    @property
    def outputs(self) -> list[CompletionOutput]:
        return self._outputs[: self.sampling_params.n]

    @property
    def finished(self) -> bool:
        return self._done

    def abort(self) -> None:
        self._llm._executor.abort_request(self.request_id)
        self._aborted = True

    def aborted(self) -> bool:
        return self._aborted

    def __aiter__(self):
        return self

    async def __anext__(self):
        if self._done:
            raise StopAsyncIteration
        await self._aresult_step()
        return self

    async def aresult(self):
        while not self._done:
            await self._aresult_step()
        return self

    # -- the double's engine -----------------------------------------------------------
    async def _aresult_step(self) -> None:
        await asyncio.sleep(self._llm.step_delay)  # the real one awaits its response queue
        executor = self._llm._executor
        if executor is not None and executor.background_error is not None:
            # `_handle_background_error`: shut the executor down, raise the error.
            executor.shutdown()
            raise executor.background_error
        if self._request_error is not None:
            self._done = True
            raise RequestError(self._request_error)

        out = self._outputs[0]
        out._last_token_ids_len = len(out.token_ids)
        if self._aborted:
            out.finish_reason = "cancelled"
            self._done = True
            return

        sp = self.sampling_params
        steps = self._llm.tokens_per_step if self._streaming else sp.max_tokens
        for _ in range(steps):
            script = self._llm.script
            generated = len(out.token_ids)
            token = script[generated] if generated < len(script) else sp.end_id
            if token == sp.end_id and not sp.ignore_eos:
                if self._llm.include_end_id_in_output:
                    out.token_ids.append(token)
                out.finish_reason = "stop"
                break
            out.token_ids.append(token)
            if sp.stop_token_ids and token in sp.stop_token_ids:
                out.stop_reason = token
                if not sp.include_stop_str_in_output:
                    out.token_ids = out.token_ids[:-1]
                out.finish_reason = "stop"
                break
            if len(out.token_ids) >= sp.max_tokens:
                out.finish_reason = "length"
                break
        self._done = out.finish_reason is not None
