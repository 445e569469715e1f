"""`POST /v1/completions`: a prompt (text or token ids) continued, with `echo`."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, ClassVar

from msgspec import UNSET, UnsetType

from mistral_serving.engines.base import TokenLogprob
from mistral_serving.errors import RequestError
from mistral_serving.generation.outcome import Outcome
from mistral_serving.generation.service import GenerationRequest
from mistral_serving.protocols import ParseContext
from mistral_serving.protocols.fields import validate
from mistral_serving.protocols.openai.base import OpenAICall, OpenAIRoute
from mistral_serving.protocols.openai.requests import (
    COMPLETIONS_DEFAULT_MAX_TOKENS,
    CompletionRequest,
    completion_prompt,
)
from mistral_serving.protocols.openai.types import (
    Completion,
    CompletionChoice,
    CompletionChunk,
    CompletionChunkChoice,
    CompletionLogprobs,
    Usage,
)


@dataclass(frozen=True)
class CompletionCall(OpenAICall):
    echo: bool = False  # the prompt leads the text (and the logprobs)


class CompletionsFormat(OpenAIRoute[CompletionCall]):
    route: ClassVar[str] = "completions"
    id_prefix: ClassVar[str] = "cmpl-"
    chunk_class = CompletionChunk

    def parse(self, body: dict[str, Any], ctx: ParseContext) -> CompletionCall:
        self.refuse_unsupported(body)
        if "tools" in body or "tool_choice" in body:
            raise RequestError("tools are taken by /v1/chat/completions only", param="tools")
        req = validate(CompletionRequest, body)
        assert isinstance(req, CompletionRequest)
        prompt, prompt_ids = completion_prompt(req.prompt)
        wanted = COMPLETIONS_DEFAULT_MAX_TOKENS if req.max_tokens is None else req.max_tokens
        if wanted == 0 and not req.echo:
            raise RequestError("max_tokens may be 0 only with echo: true", param="max_tokens")
        if req.echo and req.stream:
            raise RequestError("echo is not supported with stream: true", param="echo")
        guided = req.response_format.guided() if req.response_format else None
        logprobs = req.logprobs
        sampling = self.sampling(
            req, wanted, logprobs, guided, prompt_logprobs=logprobs if req.echo else None
        )
        gen = GenerationRequest(
            sampling=sampling,
            prompt=prompt,
            prompt_ids=prompt_ids,
            stop=tuple(req.stop or ()),
            param="prompt",
            echo=req.echo,
        )
        include_usage, continuous = self.usage_options(req)
        return CompletionCall(
            gen, req.stream, include_usage, int(time.time()), continuous, req.echo
        )

    def response_body(
        self, call: CompletionCall, outcome: Outcome, answer_id: str
    ) -> dict[str, Any]:
        logprobs = outcome.logprobs
        if call.echo:
            prompt = self._prompt_text(call)
            text = prompt + outcome.text
            lps = self._echo_logprobs(logprobs, outcome.prompt_tokens, len(prompt))
        else:
            text, lps = outcome.text, self.completion_logprobs(logprobs, 0)
        answer = Completion(
            id=self.id_prefix + answer_id,
            created=call.created,
            model=self.model_name,
            choices=[CompletionChoice(text=text, logprobs=lps, finish_reason=outcome.reason)],
            usage=self.usage_of(outcome.prompt_tokens, outcome.completion_tokens),
        )
        return answer.wire()

    def _prompt_text(self, call: CompletionCall) -> str:
        """The prompt as given; token ids as their tokens' texts joined."""
        if call.gen.prompt is not None:
            return call.gen.prompt
        ids = call.gen.prompt_ids or ()
        return b"".join(self._token_bytes(t) for t in ids).decode("utf-8", errors="replace")

    def _echo_logprobs(
        self, logprobs: tuple[TokenLogprob, ...] | None, n_prompt: int, prompt_chars: int
    ) -> CompletionLogprobs | None:
        """The prompt's entries (offsets from 0, over their token texts), then the
        output's (offsets from the end of the prompt text, as in `text`)."""
        if logprobs is None:
            return None
        head = self.completion_logprobs(logprobs[:n_prompt], 0)
        tail = self.completion_logprobs(logprobs[n_prompt:], prompt_chars)
        assert head is not None and tail is not None
        return CompletionLogprobs(
            tokens=head.tokens + tail.tokens,
            token_logprobs=head.token_logprobs + tail.token_logprobs,
            top_logprobs=head.top_logprobs + tail.top_logprobs,
            text_offset=head.text_offset + tail.text_offset,
        )

    def chunk(
        self,
        call: CompletionCall,
        rid: str,
        text: str | None,
        finish: str | None = None,
        logprobs: list[TokenLogprob] | None = None,
        offset: int = 0,
        usage: Usage | None | UnsetType = UNSET,
    ) -> CompletionChunk:
        choice = CompletionChunkChoice(
            text=text or "",
            logprobs=self.completion_logprobs(logprobs, offset),
            finish_reason=finish,
        )
        return CompletionChunk(
            id=rid, created=call.created, model=self.model_name, choices=[choice], usage=usage
        )

    def stream_logprobs(self, logprobs: list[TokenLogprob], offset: int) -> CompletionLogprobs:
        lps = self.completion_logprobs(logprobs, offset)
        assert lps is not None
        return lps
