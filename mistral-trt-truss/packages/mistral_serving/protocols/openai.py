"""OpenAI-compatible `POST /v1/chat/completions` and `POST /v1/completions`: request
models, answers and SSE chunks in OpenAI's exact shapes, errors in OpenAI's error shape.

Accepted beyond OpenAI's core: vLLM's `top_k`, `repetition_penalty`, `ignore_eos` and
`min_tokens`. `logprobs` (chat: `logprobs` + `top_logprobs`; completions: `logprobs` as
a count) are the log-softmax of the logits the sampler saw, after penalties and before
temperature, top-k and top-p. `response_format` (`json_object`, `json_schema`) constrains
the output with a grammar where the engine supports it (the schema is checked by
`grammar.GrammarGate` before any engine sees it; `min_tokens` with it is refused). `echo` (completions) puts the
prompt before the completion; with `logprobs` the choice's logprobs cover the prompt
tokens first (the first one null, then each given the tokens before it, the model's own
log-softmax), then the generated ones; `max_tokens: 0` (echo only) generates nothing, so
`echo, max_tokens 0, logprobs k` scores a text (lm-evaluation-harness's loglikelihood).
A prompt may be one list of token ids, or a batch holding one. Fields we cannot honour
(`n` > 1, echo with `stream`, ...) are refused with a 400 that names the field.

Tools (chat): `tools`, `tool_choice`, `parallel_tool_calls` and the tool history are read
strictly by `tool_calls.py`; the prompt takes the model's tool format (`chat.py`);
`required` or a named function constrain the output with the tool-call grammar
(`grammar.tool_call_schema`); the answer is read by that format's parser
(`tool_parsers.py`) and streamed in OpenAI's shape as it is generated: content first,
then per call a delta with `index`, `id`, `type` and `function.name` once the name is
complete, then its `arguments` in fragments as the model writes them.
docs/tool-calling.md is the contract.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from msgspec import UNSET, UnsetType
from pydantic import Discriminator, Field, Tag, model_validator

from mistral_serving.engines.base import SamplingOptions, TokenLogprob
from mistral_serving.errors import RequestError
from mistral_serving.generation.service import Chunk, GenerationRequest
from mistral_serving.ops.telemetry import RequestRecord
from mistral_serving.protocols import ParseContext
from mistral_serving.protocols.fields import (
    MAX_TOKENS_LIMIT,
    AdditivePenalty,
    MaxTokens,
    MinTokens,
    RepetitionPenalty,
    Seed,
    Stop,
    StrictModel,
    Temperature,
    TopK,
    validate,
)
from mistral_serving.protocols.openai_types import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatLogprobs,
    ChatTokenLogprob,
    Completion,
    CompletionChoice,
    CompletionChunk,
    CompletionChunkChoice,
    CompletionLogprobs,
    Delta,
    FunctionCall,
    FunctionDelta,
    ToolCall,
    ToolCallDelta,
    TopLogprob,
    Usage,
    openai_error_body,
)
from mistral_serving.structured.constraint import GuidedDecoding
from mistral_serving.structured.grammar import tool_call_grammar
from mistral_serving.text.chat import (
    ChatMessage,
    HistoryCall,
    Message,
    ToolCallsMessage,
    ToolResultMessage,
)
from mistral_serving.tools.parsers.stream import (
    CallDelta,
    CallStream,
    ParsedAnswer,
    new_call_id,
    parse_answer,
)
from mistral_serving.tools.tool_calls import ToolRequest, check_history, parse_tool_request

log = logging.getLogger(__name__)

MAX_TOP_LOGPROBS = 20
MAX_TOOLS = 128  # OpenAI's own limit on `tools`
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default on /v1/completions


class StreamOptions(StrictModel):
    include_usage: bool = False
    # vLLM's: with include_usage, every chunk carries the usage so far (guidellm asks).
    continuous_usage_stats: bool = False


class TextPart(StrictModel):
    type: Literal["text"]
    text: str


class FunctionCallIn(StrictModel):
    name: str = Field(max_length=64)
    arguments: str  # JSON text, as OpenAI sends it


class ToolCallIn(StrictModel):
    id: str = Field(min_length=1, max_length=256)
    type: Literal["function"] = "function"
    function: FunctionCallIn


class OpenAIMessage(StrictModel):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = Field(None, max_length=256)  # accepted; Mistral's format has no names
    tool_calls: list[ToolCallIn] | None = Field(None, max_length=128)
    tool_call_id: str | None = Field(None, max_length=256)

    def to_chat(self, where: str) -> Message:
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise RequestError(f"{where}.content is required", param=f"{where}.content")
        content = (
            self.content
            if isinstance(self.content, str) or self.content is None
            else "\n\n".join(p.text for p in self.content)
        ) or ""
        if self.tool_call_id is not None and self.role != "tool":
            raise RequestError(
                f"{where}.tool_call_id is only for tool messages", param=f"{where}.tool_call_id"
            )
        if self.role == "tool":
            assert self.tool_call_id is not None  # check_history has made sure
            return ToolResultMessage(content=content, tool_call_id=self.tool_call_id)
        if self.tool_calls:
            calls = tuple(
                HistoryCall(id=c.id, name=c.function.name, arguments=c.function.arguments)
                for c in self.tool_calls
            )
            return ToolCallsMessage(content=content, tool_calls=calls)
        role = "system" if self.role == "developer" else self.role
        return ChatMessage(role=role, content=content)


class JsonSchemaFormat(StrictModel):
    name: str = Field(max_length=256)
    schema_: dict[str, Any] = Field(default_factory=dict, alias="schema")
    description: str | None = None
    strict: bool | None = None


class ResponseFormat(StrictModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_when_asked(self) -> ResponseFormat:
        if (self.type == "json_schema") != (self.json_schema is not None):
            raise ValueError("json_schema is required with type json_schema, and only then")
        return self

    def guided(self) -> GuidedDecoding | None:
        if self.type == "json_object":
            return GuidedDecoding("json_object")
        if self.type == "json_schema" and self.json_schema is not None:
            return GuidedDecoding("json_schema", json.dumps(self.json_schema.schema_))
        return None


class _Common(StrictModel):
    """Fields both routes share; anything not declared is refused by name."""

    model: str | None = Field(None, max_length=256)  # any name; the served name is returned
    max_tokens: MaxTokens | None = None
    temperature: Temperature = 1.0
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    stop: Stop | None = None
    seed: Seed | None = None
    presence_penalty: AdditivePenalty = 0.0
    frequency_penalty: AdditivePenalty = 0.0
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = Field(None, max_length=256)
    n: Literal[1] = 1
    response_format: ResponseFormat | None = None
    # vLLM's extensions.
    top_k: TopK = 0
    repetition_penalty: RepetitionPenalty = 1.0
    ignore_eos: bool = False
    min_tokens: MinTokens = 0


class ChatCompletionRequest(_Common):
    messages: list[OpenAIMessage] = Field(min_length=1, max_length=4096)
    max_completion_tokens: MaxTokens | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    # Read (and refused by name) by tool_calls.parse_tool_request before this model.
    tools: list[Any] | None = Field(None, max_length=MAX_TOOLS)
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None


# 0 is allowed on completions with echo: the prompt's logprobs, nothing generated.
CompletionMaxTokens = Annotated[int, Field(ge=0, le=MAX_TOKENS_LIMIT)]


def _prompt_kind(value: Any) -> str:
    """Which of the prompt's forms to check `value` against, from its first element: a
    plain union tries each form in turn, and each failed form costs a check of every
    element (most of a long token-id prompt's parse)."""
    if not isinstance(value, list):
        return "text"  # a string, or refused as not one
    first = value[0] if value else 0
    if isinstance(first, list):
        return "batch"
    return "texts" if isinstance(first, str) else "ids"


# `batch`: a batch of token-id prompts (lm-evaluation-harness sends one).
CompletionPrompt = Annotated[
    Annotated[str, Tag("text")]
    | Annotated[list[str], Tag("texts")]
    | Annotated[list[int], Tag("ids")]
    | Annotated[list[list[int]], Tag("batch")],
    Discriminator(_prompt_kind),
]


class CompletionRequest(_Common):
    prompt: CompletionPrompt
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    best_of: Literal[1] | None = None
    suffix: None = None
    max_tokens: CompletionMaxTokens | None = COMPLETIONS_DEFAULT_MAX_TOKENS


@dataclass(frozen=True)
class OpenAICall:
    chat: bool
    gen: GenerationRequest
    stream: bool
    include_usage: bool
    created: int
    continuous_usage: bool = False  # usage so far in every chunk (needs include_usage)
    echo: bool = False  # completions: the prompt leads the text (and the logprobs)
    tools: ToolRequest | None = None  # chat with tools offered and tool_choice not none

    @property
    def constrained(self) -> bool:
        return self.tools is not None and self.tools.constrained


# Fields we accept only at their default (None is accepted for each too).
_UNSUPPORTED: dict[str, object] = {"best_of": 1, "suffix": None, "n": 1}


class OpenAIFormat:
    stream_media_type = "text/event-stream"

    def __init__(
        self,
        chat: bool,
        model_name: str,
        token_bytes: Callable[[int], bytes],
        tool_format: str = "fallback_json",  # the loaded model's (Tokenizer.tool_format)
    ) -> None:
        self.chat = chat
        self.tool_format = tool_format
        self.route = "chat_completions" if chat else "completions"
        self._model_name = model_name
        self._token_bytes = token_bytes

    # ---- request ----

    def parse(self, body: dict[str, Any], ctx: ParseContext) -> OpenAICall:
        for name, default in _UNSUPPORTED.items():  # a clearer word than "input should be 1"
            value = body.get(name)
            # By type too: `true == 1` in Python, but `n: true` is not OpenAI's default.
            if value is not None and (type(value) is not type(default) or value != default):
                raise RequestError(
                    f"unsupported field: {name} (only its default is supported)", param=name
                )
        tool_req: ToolRequest | None = None
        if self.chat:
            tool_req = parse_tool_request(body)  # each bad field named exactly
        elif "tools" in body or "tool_choice" in body:
            raise RequestError("tools are taken by /v1/chat/completions only", param="tools")
        req = validate(ChatCompletionRequest if self.chat else CompletionRequest, body)
        assert isinstance(req, ChatCompletionRequest | CompletionRequest)
        if isinstance(req, ChatCompletionRequest):
            check_history(body["messages"])
            messages = tuple(m.to_chat(f"messages[{i}]") for i, m in enumerate(req.messages))
            prompt, prompt_ids, param = None, None, "messages"
            wanted = req.max_completion_tokens or req.max_tokens or ctx.default_max_tokens
            if req.top_logprobs is not None and not req.logprobs:
                raise RequestError("top_logprobs requires logprobs: true", param="top_logprobs")
            logprobs = (req.top_logprobs or 0) if req.logprobs else None
            echo = False
        else:
            messages, param = None, "prompt"
            prompt, prompt_ids = _completion_prompt(req.prompt)
            wanted = COMPLETIONS_DEFAULT_MAX_TOKENS if req.max_tokens is None else req.max_tokens
            logprobs = req.logprobs
            echo = req.echo
            if wanted == 0 and not echo:
                raise RequestError("max_tokens may be 0 only with echo: true", param="max_tokens")
            if echo and req.stream:
                raise RequestError("echo is not supported with stream: true", param="echo")
        guided = req.response_format.guided() if req.response_format else None
        if tool_req is not None and tool_req.choice == "none":
            tool_req = None  # the tools stay out of the prompt and the answer is text
        if tool_req is not None and tool_req.constrained:
            if guided is not None:
                raise RequestError(
                    "response_format cannot be combined with tool_choice required or a named "
                    "function: the answer is the calls",
                    param="response_format",
                )
            guided = tool_call_grammar(tool_req)
        if tool_req is not None and logprobs is not None:
            raise RequestError("logprobs are not supported with tools", param="logprobs")
        if guided is not None and req.min_tokens:
            # The grammar ends the output (only EOS is allowed once it is complete), and
            # min_tokens forbids EOS: the two cannot both hold.
            raise RequestError(
                "min_tokens cannot be combined with response_format json_object or "
                "json_schema: the grammar decides where the output ends",
                param="min_tokens",
            )
        sampling = SamplingOptions(
            max_new_tokens=wanted,
            temperature=req.temperature,
            top_k=req.top_k,
            top_p=req.top_p,
            seed=req.seed,
            repetition_penalty=req.repetition_penalty,
            presence_penalty=req.presence_penalty,
            frequency_penalty=req.frequency_penalty,
            ignore_eos=req.ignore_eos,
            min_tokens=req.min_tokens,
            logprobs=logprobs,
            prompt_logprobs=logprobs if echo else None,
            guided=guided,
        )
        gen = GenerationRequest(
            sampling=sampling,
            prompt=prompt,
            prompt_ids=prompt_ids,
            messages=messages,
            stop=tuple(req.stop or ()),
            param=param,
            echo=echo,
            tools=tool_req.tools if tool_req is not None else (),
        )
        if req.stream_options is not None and not req.stream:
            raise RequestError(
                "stream_options is only allowed when stream is true", param="stream_options"
            )
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        continuous = bool(
            include_usage and req.stream_options and req.stream_options.continuous_usage_stats
        )
        return OpenAICall(
            self.chat, gen, req.stream, include_usage, int(time.time()), continuous, echo, tool_req
        )

    # ---- answer ----

    def _id(self, record: RequestRecord) -> str:
        return ("chatcmpl-" if self.chat else "cmpl-") + record.engine_id

    def response_body(
        self, call: OpenAICall, record: RequestRecord, logprobs: list[TokenLogprob] | None
    ) -> dict[str, Any]:
        answer: ChatCompletion | Completion
        if self.chat:
            message = AssistantMessage(content=record.output)
            finish_reason = record.finish_reason
            parsed = self._tool_answer(call, record.output, record)
            if parsed is not None and parsed.calls:
                calls = [
                    ToolCall(id=cid, function=FunctionCall(name=c.name, arguments=c.arguments))
                    for cid, c in zip(self._call_ids(parsed), parsed.calls)
                ]
                message = AssistantMessage(content=parsed.content or None, tool_calls=calls)
                finish_reason = _calls_finish(finish_reason)
            answer = ChatCompletion(
                id=self._id(record),
                created=call.created,
                model=self._model_name,
                choices=[
                    ChatChoice(
                        message=message,
                        logprobs=self._chat_logprobs(logprobs),
                        finish_reason=finish_reason,
                    )
                ],
                usage=_usage(record),
            )
            return answer.wire()
        if call.echo:
            prompt = self._prompt_text(call)
            text = prompt + record.output
            lps = self._echo_logprobs(logprobs, record.prompt_tokens, len(prompt))
        else:
            text, lps = record.output, self._completion_logprobs(logprobs, 0)
        answer = Completion(
            id=self._id(record),
            created=call.created,
            model=self._model_name,
            choices=[CompletionChoice(text=text, logprobs=lps, finish_reason=record.finish_reason)],
            usage=_usage(record),
        )
        return answer.wire()

    def _tool_answer(
        self, call: OpenAICall, text: str, record: RequestRecord
    ) -> ParsedAnswer | None:
        """The answer read by the model's tool parser (None: no tools in play)."""
        if call.tools is None:
            return None
        answer = parse_answer(text, self.tool_format, call.constrained)
        _log_broken(answer, record)
        return answer

    def _call_ids(self, answer: ParsedAnswer) -> list[str]:
        return [new_call_id(self.tool_format) for _ in answer.calls]

    def _prompt_text(self, call: OpenAICall) -> str:
        """The prompt as given; token ids as their tokens' texts joined."""
        if call.gen.prompt is not None:
            return call.gen.prompt
        ids = call.gen.prompt_ids or ()
        return b"".join(self._token_bytes(t) for t in ids).decode("utf-8", errors="replace")

    def _echo_logprobs(
        self, logprobs: list[TokenLogprob] | None, n_prompt: int, prompt_chars: int
    ) -> CompletionLogprobs | None:
        """The prompt's entries (offsets from 0, over their token texts), then the
        output's (offsets from the end of the prompt text, as in `text`)."""
        if logprobs is None:
            return None
        head = self._completion_logprobs(logprobs[:n_prompt], 0)
        tail = self._completion_logprobs(logprobs[n_prompt:], prompt_chars)
        assert head is not None and tail is not None
        return CompletionLogprobs(
            tokens=head.tokens + tail.tokens,
            token_logprobs=head.token_logprobs + tail.token_logprobs,
            top_logprobs=head.top_logprobs + tail.top_logprobs,
            text_offset=head.text_offset + tail.text_offset,
        )

    def _chat_logprobs(self, logprobs: list[TokenLogprob] | None) -> ChatLogprobs | None:
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

    def _stream_logprobs(
        self, logprobs: list[TokenLogprob], offset: int
    ) -> ChatLogprobs | CompletionLogprobs:
        lps = (
            self._chat_logprobs(logprobs)
            if self.chat
            else self._completion_logprobs(logprobs, offset)
        )
        assert lps is not None
        return lps

    def _completion_logprobs(
        self, logprobs: list[TokenLogprob] | None, offset: int
    ) -> CompletionLogprobs | None:
        if logprobs is None:
            return None
        tokens, offsets = [], []
        for lp in logprobs:
            text = self._token_text(lp.token_id)
            tokens.append(text)
            offsets.append(offset)
            offset += len(text)
        return CompletionLogprobs(
            tokens=tokens,
            token_logprobs=[lp.logprob for lp in logprobs],
            top_logprobs=[
                None if lp.logprob is None else {self._token_text(t): v for t, v in lp.top}
                for lp in logprobs
            ],
            text_offset=offsets,
        )

    def _token_text(self, token_id: int) -> str:
        return self._token_bytes(token_id).decode("utf-8", errors="replace")

    def _token_pair(self, token_id: int) -> tuple[str, list[int]]:
        """A chat logprob entry's `token` and `bytes`."""
        raw = self._token_bytes(token_id)
        return raw.decode("utf-8", errors="replace"), list(raw)

    def _chunk(
        self,
        call: OpenAICall,
        rid: str,
        text: str | None,
        finish: str | None = None,
        logprobs: list[TokenLogprob] | None = None,
        offset: int = 0,
        role: bool = False,
        usage: Usage | None | UnsetType = UNSET,
    ) -> ChatCompletionChunk | CompletionChunk:
        """One stream chunk of one choice; `text` None ends the answer."""
        if self.chat:
            delta = (
                Delta(role="assistant", content="")
                if role
                else (Delta() if text is None else Delta(content=text))
            )
            choice = ChatChunkChoice(
                delta=delta, logprobs=self._chat_logprobs(logprobs), finish_reason=finish
            )
            return ChatCompletionChunk(
                id=rid, created=call.created, model=self._model_name, choices=[choice], usage=usage
            )
        text_choice = CompletionChunkChoice(
            text=text or "",
            logprobs=self._completion_logprobs(logprobs, offset),
            finish_reason=finish,
        )
        return CompletionChunk(
            id=rid, created=call.created, model=self._model_name, choices=[text_choice], usage=usage
        )

    async def stream_events(
        self, call: OpenAICall, chunks: AsyncIterator[Chunk], record: RequestRecord
    ) -> AsyncIterator[str]:
        """OpenAI's stream: a role chunk first (chat), content deltas, a chunk with the
        finish_reason (`abort` when the answer was cut), the usage chunk when asked,
        then `data: [DONE]`."""
        rid = self._id(record)
        # `usage` is absent unless asked; then null, or the counts so far (continuous).
        no_usage: None | UnsetType = None if call.include_usage else UNSET

        def usage_so_far() -> Usage | None | UnsetType:
            # The role chunk keeps null: it is sent before the prompt is counted.
            return _usage(record) if call.continuous_usage else no_usage

        if self.chat:
            yield _sse(self._chunk(call, rid, None, role=True, usage=no_usage).wire())
        # Every content event is the same JSON around its text (and logprobs): render
        # the chunk once with a marker in the text's place and splice each text in
        # (byte-identical to rendering each, ~3x cheaper: the stream is the hot path).
        marker = "\x00text\x00"
        template = _sse(self._chunk(call, rid, marker, usage=no_usage).wire())
        head, tail = template.split(json.dumps(marker))
        lp_head, lp_tail = tail.split(_NO_LOGPROBS)  # once: the one choice's
        offset = 0
        continuous = call.continuous_usage
        # With tools, text that may be a call is not content: it is read as calls as it
        # arrives, and each call's name and arguments go out as soon as they are read.
        calls = CallStream(self.tool_format, call.constrained) if call.tools else None
        ids: list[str] = []  # one per call, made when its first delta goes out

        def call_events(deltas: list[CallDelta]) -> list[str]:
            events = []
            for d in deltas:
                if d.name is not None:
                    ids.append(new_call_id(self.tool_format))
                event = ChatCompletionChunk(
                    id=rid,
                    created=call.created,
                    model=self._model_name,
                    choices=[ChatChunkChoice(delta=_call_delta(d, ids[d.index]))],
                    usage=usage_so_far(),
                )
                events.append(_sse(event.wire()))
            return events

        try:
            async for chunk in chunks:
                if calls is None:
                    text = chunk.text
                else:
                    text, deltas = calls.feed(chunk.text)
                    if not text:
                        for sse in call_events(deltas):
                            yield sse
                        continue
                if chunk.logprobs is None and not continuous:
                    yield f"{head}{_event_json(text)}{tail}"
                elif continuous:
                    event = self._chunk(
                        call, rid, text, None, chunk.logprobs, offset, usage=usage_so_far()
                    )
                    yield _sse(event.wire())
                else:
                    assert chunk.logprobs is not None
                    text_json = _event_json(text)
                    lps = self._stream_logprobs(chunk.logprobs, offset)
                    lp_json = _event_json(lps.wire())
                    yield f'{head}{text_json}{lp_head}"logprobs": {lp_json}{lp_tail}'
                offset += len(text)
                if calls is not None:
                    for sse in call_events(deltas):
                        yield sse
        except RequestError as exc:
            yield _sse(self.error_body(exc))
            yield "data: [DONE]\n\n"
            return
        finish_reason = record.finish_reason
        if calls is not None:
            parsed, rest, deltas = calls.finish()
            _log_broken(parsed, record)
            if rest:  # content held back, or a text that did not parse after all
                yield f"{head}{_event_json(rest)}{tail}"
            for sse in call_events(deltas):
                yield sse
            if parsed.calls:
                finish_reason = _calls_finish(finish_reason)
        yield _sse(self._chunk(call, rid, None, finish_reason, usage=usage_so_far()).wire())
        if call.include_usage:
            last = (ChatCompletionChunk if self.chat else CompletionChunk)(
                id=rid,
                created=call.created,
                model=self._model_name,
                choices=[],
                usage=_usage(record),
            )
            yield _sse(last.wire())
        yield "data: [DONE]\n\n"

    def error_body(self, err: RequestError) -> dict[str, Any]:
        return openai_error_body(err)


# How a chunk without logprobs says so; the stream splices logprobs in its place.
_NO_LOGPROBS = '"logprobs": null'


def _usage(record: RequestRecord) -> Usage:
    return Usage(
        prompt_tokens=record.prompt_tokens,
        completion_tokens=record.completion_tokens,
        total_tokens=record.prompt_tokens + record.completion_tokens,
    )


def _completion_prompt(
    prompt: str | list[str] | list[int] | list[list[int]],
) -> tuple[str | None, tuple[int, ...] | None]:
    # Validated as one of its forms (CompletionPrompt): the first element tells which.
    if isinstance(prompt, str):
        return prompt, None
    if prompt and isinstance(prompt[0], int):
        return None, tuple(prompt)  # token ids, used as given (range-checked later)
    if len(prompt) == 1 and isinstance(prompt[0], list) and prompt[0]:
        return None, tuple(prompt[0])  # a batch of one token-id prompt
    if len(prompt) == 1 and isinstance(prompt[0], str):
        return prompt[0], None
    raise RequestError(
        "prompt must be one string or one list of token ids (batches are not supported)",
        param="prompt",
    )


def _call_delta(piece: CallDelta, call_id: str) -> Delta:
    """OpenAI's stream shape for a call: index, id, type and name on its first delta
    (arguments ""), then deltas with its index and an arguments fragment."""
    if piece.name is not None:
        fn = FunctionDelta(name=piece.name, arguments="")
        first = ToolCallDelta(index=piece.index, id=call_id, type="function", function=fn)
        return Delta(tool_calls=[first])
    fragment = FunctionDelta(arguments=piece.arguments)
    return Delta(tool_calls=[ToolCallDelta(index=piece.index, function=fragment)])


def _calls_finish(reason: str | None) -> str | None:
    # An answer that ended in calls says so; a cut one (abort) keeps its reason.
    return "tool_calls" if reason in ("stop", "length") else reason


def _log_broken(answer: ParsedAnswer, record: RequestRecord) -> None:
    if answer.broken:
        log.warning(
            "request %s: tool-call markup did not parse; the answer is delivered as text",
            record.request_id,
        )


# JSON leaves U+0085, U+2028 and U+2029 unescaped, and line splitters that follow Unicode
# (Python's str.splitlines, which some SSE clients use) end a line there, cutting an event
# in two. Escaped, the event is the same JSON and one line for every client.
_UNICODE_LINE_BREAKS = {0x85: "\\u0085", 0x2028: "\\u2028", 0x2029: "\\u2029"}


def _event_json(value: object) -> str:
    """`value` as the JSON of one SSE event: non-ASCII as is, but never a line break."""
    return json.dumps(value, ensure_ascii=False).translate(_UNICODE_LINE_BREAKS)


def _sse(data: dict[str, Any]) -> str:
    return f"data: {_event_json(data)}\n\n"
