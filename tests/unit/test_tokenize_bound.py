"""The bounded tokenization of `GenerationService.prepare`, with the real Mistral
tokenizer, measured by what the tokenizer is asked to encode (never by time): a prompt far
over the token limit but under the character bound is refused after tokenizing about
twice the limit's worth of text, not all of it; every text that reaches the prompt (tool
descriptions and schemas, earlier calls' arguments) counts toward the character bound
and is tokenized off the event loop; and the refusal is exact (hypothesis: a prompt or
chat is refused if and only if its real token count is over the limit)."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from mistral_serving.engines.base import EngineLimits, SamplingOptions
from mistral_serving.errors import RequestError
from mistral_serving.generation.service import (
    PROBE_MARGIN_TOKENS,
    GenerationRequest,
    GenerationService,
)
from mistral_serving.ops.metrics import Metrics
from mistral_serving.settings import Settings
from mistral_serving.text.chat import (
    ChatMessage,
    HistoryCall,
    ToolCallsMessage,
    ToolResultMessage,
    encode_chat,
)
from mistral_serving.text.tokenizer import Tokenizer
from mistral_serving.tools.tool_calls import Tool
from tests.doubles.scripted_engine import ScriptedEngine

PROSE = (
    "The mistral is a strong, cold, northwesterly wind that blows from southern France "
    "into the Gulf of Lion in the northern Mediterranean, with sustained winds often "
    "exceeding 66 km/h, sometimes reaching 185 km/h.\n"
)


class Counting:
    """Wraps the tokenizer's encoder: the characters it was asked to encode, per call."""

    def __init__(self, tok: Tokenizer) -> None:
        self.calls: list[int] = []
        self.threads: set[int] = set()
        self._inner = tok._encode
        tok._encode = self

    def __call__(self, text: str) -> list[int]:
        self.calls.append(len(text))
        self.threads.add(threading.get_ident())
        return self._inner(text)


def service_for(tok: Tokenizer, max_input_len: int) -> GenerationService:
    limits = EngineLimits(max_input_len, 100_000, 1)
    return GenerationService(
        Settings(), tok, ScriptedEngine(limits=limits), metrics=Metrics(CollectorRegistry())
    )


def prepare(service: GenerationService, **fields: object):
    return asyncio.run(
        service.prepare(GenerationRequest(sampling=SamplingOptions(max_new_tokens=1), **fields))
    )


@pytest.fixture
def counting(tok: Tokenizer):
    original = tok._encode
    counter = Counting(tok)
    yield counter
    tok._encode = original


def test_a_prompt_far_over_the_limit_is_refused_after_a_bounded_prefix(
    tok: Tokenizer, counting: Counting
) -> None:
    limit = 512
    service = service_for(tok, limit)
    bound = limit * service._max_token_chars  # the cheap character bound
    prompt = (PROSE * (bound // len(PROSE) + 1))[: bound - 1]  # just under it
    with pytest.raises(RequestError) as err:
        prepare(service, prompt=prompt)
    assert (err.value.status, err.value.param) == (400, "prompt")
    assert "input tokens" in err.value.message and str(limit) in err.value.message
    # Tokenized: prefixes of 2 x (limit + margin) and twice that, not the 12,799 characters.
    assert sum(counting.calls) <= 6 * (limit + PROBE_MARGIN_TOKENS) < len(prompt) // 2
    assert max(counting.calls) <= 4 * (limit + PROBE_MARGIN_TOKENS)


def test_a_long_chat_is_refused_after_a_bounded_prefix(
    tok: Tokenizer, counting: Counting, monkeypatch: pytest.MonkeyPatch
) -> None:
    import mistral_serving.generation.service as service_module

    def counted_chat(messages, tokenizer: Tokenizer) -> list[int]:
        counting.calls.append(sum(len(m.content) for m in messages))  # the chat encoder's
        return encode_chat(messages, tokenizer)

    monkeypatch.setattr(service_module, "encode_chat", counted_chat)
    limit = 256
    service = service_for(tok, limit)
    bound = limit * service._max_token_chars
    content = (PROSE * (bound // len(PROSE) + 1))[: bound - 1]  # just under the bound
    messages = (ChatMessage(role="user", content=content),)
    with pytest.raises(RequestError) as err:
        prepare(service, messages=messages, param="messages")
    assert err.value.param == "messages"
    assert sum(counting.calls) <= 6 * (limit + PROBE_MARGIN_TOKENS)


def test_a_prompt_that_fits_is_tokenized_exactly(tok: Tokenizer, counting: Counting) -> None:
    limit = 512
    service = service_for(tok, limit)
    prompt = (PROSE * 20)[:1500]
    want = tok.encode(prompt, bos=True)
    assert len(want) <= limit
    counting.calls.clear()
    assert prepare(service, prompt=prompt).prompt_ids == want
    assert sum(counting.calls) <= 2 * len(prompt) + 2 * (limit + PROBE_MARGIN_TOKENS)


# Text with the shapes that move a token count: words, runs of spaces, newlines, digits,
# punctuation, multi-byte characters (byte-fallback tokens).
PIECES = st.sampled_from(
    ["the", " wind", " ", "  ", "    ", "\n", "\n\n", "7", "1999", ",", ".", "é", "日本", "🙂",
     "mistral", "Rhône", "\t", "x", "--", "(", ")", "km/h"]
)  # fmt: skip


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(parts=st.lists(PIECES, max_size=400), limit=st.integers(1, 60))
def test_refusal_is_exact_for_prompts(tok: Tokenizer, parts: list[str], limit: int) -> None:
    prompt = "".join(parts)
    service = service_for(tok, limit)
    n = len(tok.encode(prompt, bos=True))
    if n > limit:
        with pytest.raises(RequestError) as err:
            prepare(service, prompt=prompt)
        assert err.value.status == 400
    else:
        assert prepare(service, prompt=prompt).prompt_ids == tok.encode(prompt, bos=True)


@settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    turns=st.lists(st.lists(PIECES, min_size=1, max_size=120), min_size=1, max_size=3),
    limit=st.integers(8, 80),
)
def test_refusal_is_exact_for_chats(tok: Tokenizer, turns: list[list[str]], limit: int) -> None:
    roles = ["user", "assistant"]
    messages = tuple(
        ChatMessage(role=roles[i % 2], content="".join(t)) for i, t in enumerate(turns)
    )
    if len(messages) % 2 == 0:  # end on a user turn
        messages = messages[:-1]
    service = service_for(tok, limit)
    n = len(encode_chat(list(messages), tok))
    if n > limit:
        with pytest.raises(RequestError):
            prepare(service, messages=messages, param="messages")
    else:
        assert len(prepare(service, messages=messages, param="messages").prompt_ids) == n


# ---- every text that reaches the prompt ----

HI = (ChatMessage(role="user", content="hi"),)
NO_PARAMETERS: dict[str, object] = {"type": "object", "properties": {}}


def tool(description: str = "", parameters: dict[str, object] | None = None) -> Tool:
    return Tool("lookup", description, parameters or NO_PARAMETERS, False)


def over_bound(service: GenerationService) -> str:
    bound = service.engine.limits.max_input_len * service._max_token_chars
    return "x" * (bound + 1)


def history_with(arguments: str) -> tuple[object, ...]:
    call = HistoryCall(id="call_1", name="lookup", arguments=arguments)
    return (
        *HI,
        ToolCallsMessage(tool_calls=(call,)),
        ToolResultMessage(content="42", tool_call_id="call_1"),
    )


@pytest.mark.parametrize("where", ["description", "parameters", "arguments"])
def test_a_huge_tool_text_is_refused_before_any_tokenizing(
    tok: Tokenizer, counting: Counting, where: str
) -> None:
    """A tool's description or schema, or an earlier call's arguments, past the character
    bound: 400 with nothing tokenized (only message contents were counted; the rest was
    tokenized in full, on the event loop)."""
    service = service_for(tok, 64)
    huge = over_bound(service)
    fields: dict[str, object] = {"messages": HI, "param": "messages"}
    if where == "description":
        fields["tools"] = (tool(description=huge),)
    elif where == "parameters":
        schema = {"type": "object", "properties": {"q": {"type": "string", "description": huge}}}
        fields["tools"] = (tool(parameters=schema),)
    else:
        fields["messages"] = history_with('{"q": "' + huge + '"}')
        fields["tools"] = (tool(),)
    with pytest.raises(RequestError) as err:
        prepare(service, **fields)
    assert err.value.status == 400 and "characters" in err.value.message
    assert counting.calls == []


def test_tool_texts_are_tokenized_off_the_event_loop(tok: Tokenizer, counting: Counting) -> None:
    """Short messages but a long tool description: tokenized in a worker thread."""
    service = service_for(tok, 4096)
    prepare(service, messages=HI, tools=(tool(description=PROSE * 20),), param="messages")
    assert counting.calls and threading.get_ident() not in counting.threads


def test_a_long_history_argument_is_tokenized_off_the_event_loop(
    tok: Tokenizer, counting: Counting
) -> None:
    service = service_for(tok, 4096)
    arguments = json.dumps({"q": PROSE * 20})
    prepare(service, messages=history_with(arguments), param="messages")
    assert counting.calls and threading.get_ident() not in counting.threads
