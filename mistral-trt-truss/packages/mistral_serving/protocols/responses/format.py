"""`POST /v1/responses`: the Responses API over the generation service, with the chat
route's encoding, tool formats, tool parsers and tool-call grammar (`protocols/answers.py`).

The answer is output items: a `message` with the text (when there is text, or nothing
else), then one `function_call` per call. Streamed, each item is opened, filled and closed
as the model writes it (`response.output_item.added`, `response.output_text.delta` or
`response.function_call_arguments.delta`, ..., `response.output_item.done`), between
`response.created` / `response.in_progress` and the terminal event, which carries the
whole Response: `response.completed`, `response.incomplete` (max_output_tokens reached) or
`response.failed` (the answer was cut: drain, deadline). A complete answer asked with
`store` is kept (`store.py`) for `previous_response_id` and `GET /v1/responses/{id}`.
docs/responses-api.md is the contract."""

from __future__ import annotations

import secrets
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import msgspec

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
from mistral_serving.protocols.fields import validate
from mistral_serving.protocols.openai.types import openai_error_body
from mistral_serving.protocols.responses.requests import ResponsesRequest, input_messages
from mistral_serving.protocols.responses.store import ResponseStore, conversation_bytes
from mistral_serving.protocols.responses.types import (
    Deleted,
    FunctionCall,
    IncompleteDetails,
    ItemStatus,
    OutputItem,
    OutputMessage,
    OutputText,
    Response,
    ResponseError,
    ResponseUsage,
    Status,
    StreamEvent,
)
from mistral_serving.protocols.sse import named_sse
from mistral_serving.text.chat import (
    ChatMessage,
    HistoryCall,
    Message,
    ToolCallsMessage,
)
from mistral_serving.tools.parsers.stream import ParsedAnswer, new_call_id
from mistral_serving.tools.tool_calls import RESPONSES_TOOLS, ToolRequest, parse_tool_request


@dataclass(frozen=True)
class ResponsesCall:
    gen: GenerationRequest
    stream: bool
    template: Response  # the Response as created: what the request set, no output yet
    tools: ToolRequest | None
    conversation: tuple[Message, ...]  # what a continuation starts from (no instructions)
    store: bool

    @property
    def message_id(self) -> str:
        return "msg_" + self.template.id.removeprefix("resp_")


def _new_id(prefix: str) -> str:
    return prefix + secrets.token_hex(24)


def _function_item_id(call_id: str) -> str:
    return "fc_" + call_id.removeprefix("call_")


class ResponsesFormat:
    route: ClassVar[str] = "responses"
    stream_media_type = "text/event-stream"

    def __init__(
        self, model_name: str, tool_format: str, store: ResponseStore, miss_hint: str = ""
    ) -> None:
        self.model_name = model_name
        self.tool_format = tool_format
        self.store = store
        self._miss_hint = miss_hint  # why a stored id may be missed (several processes)

    # ---- request ----

    def parse(self, body: dict[str, Any], ctx: ParseContext) -> ResponsesCall:
        tools: ToolRequest | None = parse_tool_request(body, RESPONSES_TOOLS)
        req = validate(ResponsesRequest, body)
        assert isinstance(req, ResponsesRequest)
        ledger = CallLedger()
        prior = self._continued(req.previous_response_id, ledger)
        conversation = (*prior, *input_messages(req.input, ledger))
        text_format = req.text.format if req.text is not None else None
        guided = text_format.guided() if text_format is not None else None
        tools, guided = constrain(tools, guided, "text.format")
        system = (ChatMessage(role="system", content=req.instructions),) if req.instructions else ()
        temperature = 1.0 if req.temperature is None else req.temperature
        top_p = 1.0 if req.top_p is None else req.top_p
        sampling = SamplingOptions(
            max_new_tokens=req.max_output_tokens or ctx.default_max_tokens,
            temperature=temperature,
            top_p=top_p,  # (0, 1]: 1 is off, as every engine takes it
            guided=guided,
        )
        gen = GenerationRequest(
            sampling=sampling,
            messages=(*system, *conversation),
            param="input",
            tools=tools.tools if tools is not None else (),
        )
        template = self._template(req, body, temperature, top_p)
        return ResponsesCall(gen, req.stream, template, tools, conversation, req.store)

    def _continued(self, response_id: str | None, ledger: CallLedger) -> tuple[Message, ...]:
        """The stored conversation `previous_response_id` continues (its calls noted)."""
        if response_id is None:
            return ()
        stored = self.store.get(response_id)
        if stored is None:
            raise RequestError(
                f"previous response {response_id!r} is not stored here (never stored, "
                f"expired, deleted or evicted{self._miss_hint}); send the whole "
                "conversation as input instead",
                status=404,
                param="previous_response_id",
                code="previous_response_not_found",
            )
        for message in stored.conversation:
            if isinstance(message, ToolCallsMessage):
                for c in message.tool_calls:
                    ledger.called(c.id)
        return stored.conversation

    def _template(
        self, req: ResponsesRequest, body: dict[str, Any], temperature: float, top_p: float
    ) -> Response:
        """The request's settings as the Response object repeats them."""
        tools = [
            {"type": "function", **{k: v for k, v in t.items() if k != "type"}}
            for t in (req.tools or [])
        ]
        text = {"format": {"type": "text"}} | (
            body["text"] if isinstance(body.get("text"), dict) else {}
        )
        return Response(
            id=_new_id("resp_"),
            created_at=int(time.time()),
            status="in_progress",
            instructions=req.instructions,
            max_output_tokens=req.max_output_tokens,
            model=self.model_name,
            output=[],
            parallel_tool_calls=req.parallel_tool_calls is not False,
            previous_response_id=req.previous_response_id,
            store=req.store,
            temperature=temperature,
            text=text,
            tool_choice=req.tool_choice if req.tool_choice is not None else "auto",
            tools=tools,
            top_p=top_p,
            usage=None,
            user=req.user,
            metadata=req.metadata or {},
        )

    # ---- answer ----

    def response_body(
        self, call: ResponsesCall, outcome: Outcome, answer_id: str
    ) -> dict[str, Any]:
        parsed = read_answer(outcome.text, call.tools, self.tool_format, answer_id)
        ids = [new_call_id(self.tool_format) for _ in parsed.calls]
        return self.final(call, outcome, parsed, ids)

    def final(
        self, call: ResponsesCall, outcome: Outcome, parsed: ParsedAnswer, call_ids: list[str]
    ) -> dict[str, Any]:
        """The whole Response (streamed: the terminal event's); stored when asked and whole."""
        status, incomplete, error = _status(outcome)
        output: list[OutputItem] = []
        if parsed.content or not parsed.calls:
            text = OutputText(text=parsed.content)
            status_of_text = _text_status(outcome, parsed)
            output.append(OutputMessage(id=call.message_id, status=status_of_text, content=[text]))
        output += [
            FunctionCall(
                id=_function_item_id(cid), call_id=cid, name=c.name, arguments=c.arguments,
                status="completed",
            )
            for cid, c in zip(call_ids, parsed.calls)
        ]  # fmt: skip
        usage = ResponseUsage(
            input_tokens=outcome.prompt_tokens,
            output_tokens=outcome.completion_tokens,
            total_tokens=outcome.prompt_tokens + outcome.completion_tokens,
        )
        response = msgspec.structs.replace(
            call.template,
            status=status,
            output=output,
            usage=usage,
            incomplete_details=incomplete,
            error=error,
        )
        if call.store and outcome.complete:
            self._keep(call, response, parsed, call_ids)
        return response.wire()

    def _keep(
        self, call: ResponsesCall, response: Response, parsed: ParsedAnswer, call_ids: list[str]
    ) -> None:
        answer: tuple[Message, ...] = ()
        if parsed.calls:
            calls = tuple(
                HistoryCall(id=cid, name=c.name, arguments=c.arguments)
                for cid, c in zip(call_ids, parsed.calls)
            )
            answer = (ToolCallsMessage(content=parsed.content, tool_calls=calls),)
        elif parsed.content:
            answer = (ChatMessage(role="assistant", content=parsed.content),)
        conversation = (*call.conversation, *answer)
        size = conversation_bytes(conversation) + len(msgspec.json.encode(response))
        self.store.put(response.id, response.wire(), conversation, size)

    def error_body(self, err: RequestError) -> dict[str, Any]:
        return openai_error_body(err)

    # ---- stored responses ----

    def stored(self, response_id: str) -> dict[str, Any]:
        found = self.store.get(response_id)
        if found is None:
            raise self._not_found(response_id)
        return found.body

    def delete(self, response_id: str) -> dict[str, Any]:
        if not self.store.delete(response_id):
            raise self._not_found(response_id)
        return Deleted(id=response_id).wire()

    def _not_found(self, response_id: str) -> RequestError:
        return RequestError(
            f"response {response_id!r} is not stored here{self._miss_hint}",
            status=404,
            param="response_id",
        )

    # ---- stream ----

    async def stream_events(
        self, call: ResponsesCall, generation: Generation, answer_id: str
    ) -> AsyncIterator[str]:
        events = _Events(call)
        yield events.lifecycle("response.created", call.template)
        yield events.lifecycle("response.in_progress", call.template)
        blocks = BlockStream(call.tools, self.tool_format, answer_id)
        try:
            async for chunk in generation:
                for step in blocks.feed(chunk.text):
                    for event in events.block(step, "completed"):
                        yield event
        except RequestError as exc:
            yield events.error(exc)
            failed = msgspec.structs.replace(
                call.template, status="failed", error=ResponseError(message=exc.message)
            )
            yield events.lifecycle("response.failed", failed)
            return
        outcome = generation.outcome
        assert outcome is not None  # the iteration ended: the generation has its outcome
        parsed, last = blocks.finish()
        for step in last:
            for event in events.block(step, _text_status(outcome, parsed)):
                yield event
        body = self.final(call, outcome, parsed, blocks.call_ids)
        yield events.terminal(body)


def _status(outcome: Outcome) -> tuple[Status, IncompleteDetails | None, ResponseError | None]:
    if outcome.reason == "length":
        return "incomplete", IncompleteDetails(reason="max_output_tokens"), None
    if outcome.complete:
        return "completed", None, None
    why = "its deadline passed" if outcome.reason == "timeout" else "the server is shutting down"
    return "failed", None, ResponseError(message=f"the answer was cut short ({why})")


def _text_status(outcome: Outcome, parsed: ParsedAnswer) -> ItemStatus:
    """The text item is incomplete when the answer ended before the model did, unless
    calls followed it (then it was complete when they began)."""
    return "completed" if outcome.reason == "stop" or parsed.calls else "incomplete"


_TERMINAL = {"completed": "response.completed", "incomplete": "response.incomplete"}


class _Events:
    """One stream's events, numbered in order; block steps rendered as output items."""

    def __init__(self, call: ResponsesCall) -> None:
        self._call = call
        self._seq = 0
        self._calls: dict[int, tuple[str, str]] = {}  # block -> (name, call_id)

    def _event(self, type_: str, **fields: Any) -> str:
        event = StreamEvent(type=type_, sequence_number=self._seq, **fields)
        self._seq += 1
        return named_sse(type_, event.wire())

    def lifecycle(self, type_: str, response: Response) -> str:
        return self._event(type_, response=response)

    def terminal(self, body: dict[str, Any]) -> str:
        type_ = _TERMINAL.get(body["status"], "response.failed")
        data = {"type": type_, "sequence_number": self._seq, "response": body}
        self._seq += 1
        return named_sse(type_, data)

    def error(self, err: RequestError) -> str:
        return self._event("error", code=err.code, message=err.message, param=err.param)

    def block(self, step: BlockEvent, text_status: ItemStatus) -> Iterator[str]:
        if step.kind.startswith("text"):
            yield from self._text(step, text_status)
        else:
            yield from self._function_call(step)

    def _text(self, step: BlockEvent, status: ItemStatus) -> Iterator[str]:
        # Text is the first block but where call markup did not parse: text after the
        # calls then has an item of its own (an SDK refuses two items with one id).
        item_id = self._call.message_id + (f"_{step.block}" if step.block else "")
        at = {"item_id": item_id, "output_index": step.block}
        if step.kind == "text_start":
            item = OutputMessage(id=item_id, status="in_progress", content=[])
            yield self._event("response.output_item.added", output_index=step.block, item=item)
            yield self._event("response.content_part.added", **at, content_index=0,
                              part=OutputText(text=""))  # fmt: skip
        elif step.kind == "text_delta":
            yield self._event("response.output_text.delta", **at, content_index=0,
                              delta=step.text, logprobs=[])  # fmt: skip
        else:
            part = OutputText(text=step.text)
            yield self._event("response.output_text.done", **at, content_index=0,
                              text=step.text, logprobs=[])  # fmt: skip
            yield self._event("response.content_part.done", **at, content_index=0, part=part)
            item = OutputMessage(id=item_id, status=status, content=[part])
            yield self._event("response.output_item.done", output_index=step.block, item=item)

    def _function_call(self, step: BlockEvent) -> Iterator[str]:
        if step.kind == "call_start":
            self._calls[step.block] = (step.name, step.call_id)
        name, call_id = self._calls[step.block]
        item_id = _function_item_id(call_id)
        if step.kind == "call_delta":
            yield self._event("response.function_call_arguments.delta", item_id=item_id,
                              output_index=step.block, delta=step.text)  # fmt: skip
            return
        done = step.kind == "call_end"
        item = FunctionCall(
            id=item_id,
            call_id=call_id,
            name=name,
            arguments=step.text,
            status="completed" if done else "in_progress",
        )
        if done:
            yield self._event("response.function_call_arguments.done", item_id=item_id,
                              output_index=step.block, arguments=step.text, name=name)  # fmt: skip
        kind = "response.output_item.done" if done else "response.output_item.added"
        yield self._event(kind, output_index=step.block, item=item)
