"""`POST /v1/chat/completions`: messages in the model's chat format, with tools.

Tools: `tools`, `tool_choice`, `parallel_tool_calls` and the tool history are read
strictly by `tools/tool_calls.py`; the prompt takes the model's tool format
(`text/chat.py`); `required` or a named function constrain the output with the tool-call
grammar (`structured/grammar.py`); the answer is read by that format's parser
(`tools/`) and streamed in OpenAI's shape as it is generated: content first, then per
call a delta with `index`, `id`, `type` and `function.name` once the name is complete,
then its `arguments` in fragments as the model writes them. docs/tool-calling.md is the
contract."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from msgspec import UNSET, UnsetType

from mistral_serving.engines.base import TokenLogprob
from mistral_serving.errors import RequestError
from mistral_serving.generation.outcome import Outcome
from mistral_serving.generation.service import Chunk, Generation, GenerationRequest
from mistral_serving.protocols import ParseContext
from mistral_serving.protocols.answers import calls_finish, constrain, log_broken, read_answer
from mistral_serving.protocols.fields import validate
from mistral_serving.protocols.openai.base import OpenAICall, OpenAIRoute, StreamWriter
from mistral_serving.protocols.openai.requests import ChatCompletionRequest
from mistral_serving.protocols.openai.types import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatLogprobs,
    ChatTokenLogprob,
    Delta,
    FunctionCall,
    FunctionDelta,
    ToolCall,
    ToolCallDelta,
    TopLogprob,
    Usage,
)
from mistral_serving.protocols.sse import sse
from mistral_serving.tools.parsers.stream import CallDelta, CallStream, ParsedAnswer, new_call_id
from mistral_serving.tools.tool_calls import ToolRequest, check_history, parse_tool_request


@dataclass(frozen=True)
class ChatCall(OpenAICall):
    tools: ToolRequest | None = None  # tools offered and tool_choice not none

    @property
    def constrained(self) -> bool:
        return self.tools is not None and self.tools.constrained


class ChatCompletionsFormat(OpenAIRoute[ChatCall]):
    route: ClassVar[str] = "chat_completions"
    id_prefix: ClassVar[str] = "chatcmpl-"
    chunk_class = ChatCompletionChunk

    def __init__(
        self,
        model_name: str,
        token_bytes: Callable[[int], bytes],
        tool_format: str = "fallback_json",  # the loaded model's (Tokenizer.tool_format)
    ) -> None:
        super().__init__(model_name, token_bytes)
        self.tool_format = tool_format

    # ---- request ----

    def parse(self, body: dict[str, Any], ctx: ParseContext) -> ChatCall:
        self.refuse_unsupported(body)
        tool_req: ToolRequest | None = parse_tool_request(body)  # each bad field named
        req = validate(ChatCompletionRequest, body)
        assert isinstance(req, ChatCompletionRequest)
        check_history(body["messages"])
        messages = tuple(m.to_chat(f"messages[{i}]") for i, m in enumerate(req.messages))
        wanted = req.max_completion_tokens or req.max_tokens or ctx.default_max_tokens
        if req.top_logprobs is not None and not req.logprobs:
            raise RequestError("top_logprobs requires logprobs: true", param="top_logprobs")
        logprobs = (req.top_logprobs or 0) if req.logprobs else None
        guided = req.response_format.guided() if req.response_format else None
        tool_req, guided = constrain(tool_req, guided, "response_format")
        if tool_req is not None and logprobs is not None:
            raise RequestError("logprobs are not supported with tools", param="logprobs")
        gen = GenerationRequest(
            sampling=self.sampling(req, wanted, logprobs, guided),
            messages=messages,
            stop=tuple(req.stop or ()),
            param="messages",
            tools=tool_req.tools if tool_req is not None else (),
        )
        include_usage, continuous = self.usage_options(req)
        return ChatCall(gen, req.stream, include_usage, int(time.time()), continuous, tool_req)

    # ---- answer ----

    def response_body(self, call: ChatCall, outcome: Outcome, answer_id: str) -> dict[str, Any]:
        message = AssistantMessage(content=outcome.text)
        finish_reason = outcome.reason
        parsed = self._tool_answer(call, outcome.text, answer_id)
        if parsed is not None and parsed.calls:
            calls = [
                ToolCall(id=cid, function=FunctionCall(name=c.name, arguments=c.arguments))
                for cid, c in zip(self._call_ids(parsed), parsed.calls)
            ]
            message = AssistantMessage(content=parsed.content or None, tool_calls=calls)
            finish_reason = calls_finish(finish_reason)
        answer = ChatCompletion(
            id=self.id_prefix + answer_id,
            created=call.created,
            model=self.model_name,
            choices=[
                ChatChoice(
                    message=message,
                    logprobs=self.chat_logprobs(outcome.logprobs),
                    finish_reason=finish_reason,
                )
            ],
            usage=self.usage_of(outcome.prompt_tokens, outcome.completion_tokens),
        )
        return answer.wire()

    def _tool_answer(self, call: ChatCall, text: str, answer_id: str) -> ParsedAnswer | None:
        """The answer read by the model's tool parser (None: no tools in play)."""
        if call.tools is None:
            return None
        return read_answer(text, call.tools, self.tool_format, answer_id)

    def _call_ids(self, answer: ParsedAnswer) -> list[str]:
        return [new_call_id(self.tool_format) for _ in answer.calls]

    def chat_logprobs(
        self, logprobs: tuple[TokenLogprob, ...] | list[TokenLogprob] | None
    ) -> ChatLogprobs | None:
        if logprobs is None:
            return None
        pair = self._token_pair
        content = []
        for lp in logprobs:
            top = []
            for token_id, value in lp.top:
                text, raw = pair(token_id)
                top.append(TopLogprob(token=text, logprob=value, bytes=raw))
            text, raw = pair(lp.token_id)
            content.append(
                ChatTokenLogprob(token=text, logprob=lp.logprob, bytes=raw, top_logprobs=top)
            )
        return ChatLogprobs(content=content)

    def _token_pair(self, token_id: int) -> tuple[str, list[int]]:
        """A chat logprob entry's `token` and `bytes`."""
        raw = self._token_bytes(token_id)
        return raw.decode("utf-8", errors="replace"), list(raw)

    # ---- stream ----

    def chunk(
        self,
        call: ChatCall,
        rid: str,
        text: str | None,
        finish: str | None = None,
        logprobs: list[TokenLogprob] | None = None,
        offset: int = 0,
        usage: Usage | None | UnsetType = UNSET,
        role: bool = False,
    ) -> ChatCompletionChunk:
        delta = (
            Delta(role="assistant", content="")
            if role
            else (Delta() if text is None else Delta(content=text))
        )
        choice = ChatChunkChoice(
            delta=delta, logprobs=self.chat_logprobs(logprobs), finish_reason=finish
        )
        return ChatCompletionChunk(
            id=rid, created=call.created, model=self.model_name, choices=[choice], usage=usage
        )

    def stream_logprobs(self, logprobs: list[TokenLogprob], offset: int) -> ChatLogprobs:
        lps = self.chat_logprobs(logprobs)
        assert lps is not None
        return lps

    def opening_events(self, call: ChatCall, rid: str, no_usage: None | UnsetType) -> list[str]:
        # The role chunk keeps null usage: it is sent before the prompt is counted.
        return [sse(self.chunk(call, rid, None, role=True, usage=no_usage).wire())]

    def stream_writer(
        self, call: ChatCall, generation: Generation, rid: str
    ) -> StreamWriter[ChatCall]:
        if call.tools is None:
            return StreamWriter(self, call, generation, rid)
        return _ToolStreamWriter(self, call, generation, rid)


class _ToolStreamWriter(StreamWriter[ChatCall]):
    """With tools, text that may be a call is not content: it is read as calls as it
    arrives, and each call's name and arguments go out as soon as they are read."""

    def __init__(
        self, route: ChatCompletionsFormat, call: ChatCall, generation: Generation, rid: str
    ) -> None:
        super().__init__(route, call, generation, rid)
        self._chat = route
        self._calls = CallStream(route.tool_format, call.constrained)
        self._ids: list[str] = []  # one per call, made when its first delta goes out

    def _call_events(self, deltas: list[CallDelta]) -> list[str]:
        events = []
        for d in deltas:
            if d.name is not None:
                self._ids.append(new_call_id(self._chat.tool_format))
            event = ChatCompletionChunk(
                id=self.rid,
                created=self.call.created,
                model=self._chat.model_name,
                choices=[ChatChunkChoice(delta=call_delta(d, self._ids[d.index]))],
                usage=self.usage_so_far(),
            )
            events.append(sse(event.wire()))
        return events

    def content(self, chunk: Chunk) -> list[str]:
        text, deltas = self._calls.feed(chunk.text)
        events = [self.content_event(text, chunk.logprobs)] if text else []
        return events + self._call_events(deltas)

    def closing(self, outcome: Outcome, finish: str | None = None) -> list[str]:
        parsed, rest, deltas = self._calls.finish()
        log_broken(parsed, self.rid)
        events = [self.text_event(rest)] if rest else []  # content held back, or not calls
        events += self._call_events(deltas)
        reason = calls_finish(outcome.reason) if parsed.calls else outcome.reason
        return events + super().closing(outcome, reason)


def call_delta(piece: CallDelta, call_id: str) -> Delta:
    """OpenAI's stream shape for a call: index, id, type and name on its first delta
    (arguments ""), then deltas with its index and an arguments fragment."""
    if piece.name is not None:
        fn = FunctionDelta(name=piece.name, arguments="")
        first = ToolCallDelta(index=piece.index, id=call_id, type="function", function=fn)
        return Delta(tool_calls=[first])
    fragment = FunctionDelta(arguments=piece.arguments)
    return Delta(tool_calls=[ToolCallDelta(index=piece.index, function=fragment)])
