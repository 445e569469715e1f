"""`POST /v1/messages` (Anthropic's Messages API) over the generation service, with the
chat route's encoding, tool formats, tool parsers and tool-call grammar
(`protocols/answers.py`), and `POST /v1/messages/count_tokens` (the same prompt, counted).

The answer is content blocks: a `text` block (when there is text, or nothing else), then a
`tool_use` block per call. Streamed: `message_start`, then per block
`content_block_start`, its `text_delta` / `input_json_delta` deltas as the model writes
them, `content_block_stop`; then `message_delta` (stop_reason, usage) and `message_stop`.
An answer cut short (drain, deadline) ends with an `error` event instead. Errors are in
Anthropic's shape. docs/anthropic-messages.md is the contract."""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, ClassVar

from mistral_serving.engines.base import SamplingOptions
from mistral_serving.errors import RequestError
from mistral_serving.generation.outcome import Outcome
from mistral_serving.generation.service import Generation, GenerationRequest
from mistral_serving.protocols import ParseContext
from mistral_serving.protocols.answers import (
    BlockEvent,
    BlockStream,
    CallLedger,
    constrain,
    read_answer,
)
from mistral_serving.protocols.anthropic.requests import (
    CountTokensRequest,
    MessagesRequest,
    conversation,
    system_messages,
    tool_request,
)
from mistral_serving.protocols.anthropic.types import (
    BlockDelta,
    BlockStart,
    BlockStop,
    ContentBlock,
    DeltaUsage,
    InputJsonDelta,
    Message,
    MessageDelta,
    MessageStart,
    MessageStop,
    StopDelta,
    StopReason,
    TextContent,
    TextDelta,
    TokenCount,
    ToolUseContent,
    Usage,
    anthropic_error_body,
)
from mistral_serving.protocols.fields import validate
from mistral_serving.protocols.sse import named_sse
from mistral_serving.text.chat import Message as ChatTurn
from mistral_serving.tools.parsers.stream import ParsedAnswer, new_call_id
from mistral_serving.tools.tool_calls import ToolRequest


@dataclass(frozen=True)
class MessagesCall:
    gen: GenerationRequest
    stream: bool
    message_id: str
    tools: ToolRequest | None


def _prompt(body: dict[str, Any], req: CountTokensRequest) -> tuple[
    tuple[ChatTurn, ...], ToolRequest | None
]:  # fmt: skip
    """(the conversation with its system prompt, the tools in play) of either body."""
    tools = tool_request(body)
    turns = conversation(req.messages, CallLedger())
    return (*system_messages(req.system), *turns), tools


class MessagesFormat:
    route: ClassVar[str] = "messages"
    stream_media_type = "text/event-stream"

    def __init__(self, model_name: str, tool_format: str) -> None:
        self.model_name = model_name
        self.tool_format = tool_format

    # ---- request ----

    def parse(self, body: dict[str, Any], ctx: ParseContext) -> MessagesCall:
        req = validate(MessagesRequest, body)
        assert isinstance(req, MessagesRequest)
        messages, tools = _prompt(body, req)
        tools, guided = constrain(tools, None, "tool_choice")
        sampling = SamplingOptions(
            max_new_tokens=req.max_tokens,
            temperature=req.temperature,
            top_p=req.top_p or 1.0,  # (0, 1]: 1 is off, as every engine takes it
            top_k=req.top_k or 0,
            guided=guided,
        )
        gen = GenerationRequest(
            sampling=sampling,
            messages=messages,
            stop=tuple(req.stop_sequences or ()),
            param="messages",
            tools=tools.tools if tools is not None else (),
        )
        return MessagesCall(gen, req.stream, "msg_" + secrets.token_hex(24), tools)

    def parse_count(self, body: dict[str, Any]) -> GenerationRequest:
        """`count_tokens`' body as the prompt it stands for (nothing is generated)."""
        req = validate(CountTokensRequest, body)
        assert isinstance(req, CountTokensRequest)
        messages, tools = _prompt(body, req)
        tools, _ = constrain(tools, None, "tool_choice")
        offered = tools.tools if tools is not None else ()
        return GenerationRequest(
            SamplingOptions(max_new_tokens=1), messages=messages, tools=offered
        )

    def count_body(self, input_tokens: int) -> dict[str, Any]:
        return TokenCount(input_tokens=input_tokens).wire()

    # ---- answer ----

    def response_body(self, call: MessagesCall, outcome: Outcome, answer_id: str) -> dict[str, Any]:
        parsed = read_answer(outcome.text, call.tools, self.tool_format, answer_id)
        ids = [new_call_id(self.tool_format) for _ in parsed.calls]
        content: list[ContentBlock] = []
        if parsed.content or not parsed.calls:
            content.append(TextContent(text=parsed.content))
        content += [
            ToolUseContent(id=cid, name=c.name, input=json.loads(c.arguments))
            for cid, c in zip(ids, parsed.calls)
        ]
        stop_reason, stop_sequence = _stop(outcome, parsed)
        message = Message(
            id=call.message_id,
            model=self.model_name,
            content=content,
            stop_reason=stop_reason,
            stop_sequence=stop_sequence,
            usage=Usage(
                input_tokens=outcome.prompt_tokens, output_tokens=outcome.completion_tokens
            ),
        )
        return message.wire()

    def error_body(self, err: RequestError) -> dict[str, Any]:
        return anthropic_error_body(err)

    # ---- stream ----

    async def stream_events(
        self, call: MessagesCall, generation: Generation, answer_id: str
    ) -> AsyncIterator[str]:
        start = Message(
            id=call.message_id,
            model=self.model_name,
            content=[],
            stop_reason=None,
            stop_sequence=None,
            usage=Usage(input_tokens=generation.prompt_tokens, output_tokens=0),
        )
        yield _event(MessageStart(message=start))
        blocks = BlockStream(call.tools, self.tool_format, answer_id)
        try:
            async for chunk in generation:
                for step in blocks.feed(chunk.text):
                    yield _block_event(step)
        except RequestError as exc:
            yield named_sse("error", self.error_body(exc))
            return
        outcome = generation.outcome
        assert outcome is not None  # the iteration ended: the generation has its outcome
        parsed, last = blocks.finish()
        for step in last:
            yield _block_event(step)
        if not outcome.complete:  # no stop_reason says "cut short": an error event does
            yield named_sse("error", self.error_body(_cut(outcome)))
            return
        stop_reason, stop_sequence = _stop(outcome, parsed)
        usage = DeltaUsage(
            input_tokens=outcome.prompt_tokens, output_tokens=outcome.completion_tokens
        )
        yield _event(
            MessageDelta(
                delta=StopDelta(stop_reason=stop_reason, stop_sequence=stop_sequence), usage=usage
            )
        )
        yield _event(MessageStop())


def _stop(outcome: Outcome, parsed: ParsedAnswer) -> tuple[StopReason | None, str | None]:
    """(stop_reason, stop_sequence); None for an answer cut short (abort, timeout)."""
    if parsed.calls and outcome.complete:
        return "tool_use", None
    if outcome.reason == "length":
        return "max_tokens", None
    if outcome.reason != "stop":
        return None, None
    if outcome.stop_sequence is not None:
        return "stop_sequence", outcome.stop_sequence
    return "end_turn", None


def _cut(outcome: Outcome) -> RequestError:
    if outcome.reason == "timeout":
        return RequestError("the answer was cut short: its deadline passed", status=504)
    return RequestError("the answer was cut short: the server is shutting down", status=503)


def _event(
    event: MessageStart | BlockStart | BlockDelta | BlockStop | MessageDelta | MessageStop,
) -> str:
    data = event.wire()
    return named_sse(data["type"], data)


def _block_event(step: BlockEvent) -> str:
    if step.kind == "text_start":
        return _event(BlockStart(index=step.block, content_block=TextContent(text="")))
    if step.kind == "call_start":
        block = ToolUseContent(id=step.call_id, name=step.name, input={})
        return _event(BlockStart(index=step.block, content_block=block))
    if step.kind == "text_delta":
        return _event(BlockDelta(index=step.block, delta=TextDelta(text=step.text)))
    if step.kind == "call_delta":
        return _event(BlockDelta(index=step.block, delta=InputJsonDelta(partial_json=step.text)))
    return _event(BlockStop(index=step.block))
