"""The tool parsers' registry: every format the tokenizer can report has its class, each
name gets its own class (and the stream reads with it), an unknown name is refused, and
a new format is one class and one registry entry."""

from __future__ import annotations

import re
from typing import ClassVar, get_args

import pytest

from mistral_serving.text.tokenizer import ToolFormat
from mistral_serving.tools.parsers.base import CallText, MarkerParser, ToolParser
from mistral_serving.tools.parsers.fallback_json import FallbackJsonParser
from mistral_serving.tools.parsers.hermes import HermesParser
from mistral_serving.tools.parsers.llama3_json import Llama3JsonParser
from mistral_serving.tools.parsers.mistral import MistralParser
from mistral_serving.tools.parsers.registry import FORMATS, PARSERS, parser_for
from mistral_serving.tools.parsers.stream import (
    CallStream,
    ParsedCall,
    new_call_id,
    parse_answer,
)

CLASSES: dict[str, type[ToolParser]] = {
    "mistral": MistralParser,
    "hermes": HermesParser,
    "llama3_json": Llama3JsonParser,
    "fallback_json": FallbackJsonParser,
}
# One answer per format, written as that format writes a call.
ANSWERS = {
    "mistral": 'Hi.[TOOL_CALLS][{"name": "f", "arguments": {"a": 1}}]',
    "hermes": 'Hi.<tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call>',
    "llama3_json": '<|python_tag|>{"name": "f", "parameters": {"a": 1}}',
    "fallback_json": 'Hi. TOOL_CALLS: [{"name": "f", "arguments": {"a": 1}}]',
}


def test_every_format_the_tokenizer_reports_has_a_parser() -> None:
    assert set(PARSERS) == set(get_args(ToolFormat)) == set(FORMATS) == set(CLASSES)


@pytest.mark.parametrize("fmt", sorted(CLASSES))
def test_each_name_gets_its_own_class(fmt: str) -> None:
    parser = parser_for(fmt)
    assert type(parser) is CLASSES[fmt] and parser.name == fmt
    assert parser_for(fmt) is not parser  # stateless, but never shared between answers


@pytest.mark.parametrize("fmt", sorted(CLASSES))
def test_each_format_reads_only_its_own_calls(fmt: str) -> None:
    for other, text in ANSWERS.items():
        answer = parse_answer(text, fmt)
        if other == fmt:
            assert answer.calls == (ParsedCall("f", '{"a": 1}'),)
            assert answer.content == ("" if fmt == "llama3_json" else "Hi.")
        else:  # another format's markup is just text here
            assert answer.calls == () and answer.content == text and not answer.broken


@pytest.mark.parametrize("fmt", sorted(CLASSES))
def test_the_stream_reads_with_the_class_the_registry_names(
    fmt: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[str] = []
    real = CLASSES[fmt]

    class Spy(real):  # type: ignore[misc,valid-type]
        def call_text(self) -> CallText:
            seen.append(self.name)
            return super().call_text()

    monkeypatch.setitem(PARSERS, fmt, Spy)
    assert parse_answer(ANSWERS[fmt], fmt).calls == (ParsedCall("f", '{"a": 1}'),)
    assert seen == [fmt]


@pytest.mark.parametrize("fmt", ["", "Mistral", "json", "constrained", "tool_parsers"])
def test_an_unknown_format_is_refused(fmt: str) -> None:
    for refused in (
        lambda: parser_for(fmt),
        lambda: CallStream(fmt),
        lambda: CallStream(fmt, constrained=True),  # the grammar's answer too: a wrong name
        lambda: parse_answer("text", fmt),
        lambda: new_call_id(fmt),
    ):
        with pytest.raises(ValueError, match="unknown tool format"):
            refused()


def test_call_ids_take_the_formats_style() -> None:
    for fmt, cls in CLASSES.items():
        ids = {cls().new_call_id() for _ in range(50)}
        assert len(ids) == 50
        pattern = r"[A-Za-z0-9]{9}" if fmt == "mistral" else r"call_[A-Za-z0-9]{24}"
        assert all(re.fullmatch(pattern, i) for i in ids), (fmt, ids)


class ToyParser(MarkerParser):
    """A format the library does not have: calls after `<<calls>>`."""

    name: ClassVar[str] = "toy"
    marker: ClassVar[str] = "<<calls>>"


def test_a_new_format_is_a_class_and_a_registry_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    text = 'Sure.<<calls>>[{"name": "g", "arguments": {"x": "y"}}]'
    with pytest.raises(ValueError):
        parse_answer(text, "toy")
    monkeypatch.setitem(PARSERS, "toy", ToyParser)
    answer = parse_answer(text, "toy")
    assert answer.content == "Sure." and answer.calls == (ParsedCall("g", '{"x": "y"}'),)
    stream = CallStream("toy")
    sent = [stream.feed(c)[0] for c in text]
    assert "".join(sent) + stream.finish()[1] == "Sure."  # `<<calls` was held back, not sent
