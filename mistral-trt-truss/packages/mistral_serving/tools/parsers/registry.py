"""The parser of each tool format, by the name the tokenizer reports
(text.tokenizer.ToolFormat, `Tokenizer.tool_format`). A new format is a module of its own
and one line here."""

from __future__ import annotations

from mistral_serving.tools.parsers.base import ToolParser
from mistral_serving.tools.parsers.fallback_json import FallbackJsonParser
from mistral_serving.tools.parsers.hermes import HermesParser
from mistral_serving.tools.parsers.llama3_json import Llama3JsonParser
from mistral_serving.tools.parsers.mistral import MistralParser

PARSERS: dict[str, type[ToolParser]] = {
    parser.name: parser
    for parser in (
        MistralParser,
        HermesParser,
        Llama3JsonParser,
        FallbackJsonParser,
    )
}
FORMATS = tuple(PARSERS)


def parser_for(fmt: str) -> ToolParser:
    """The parser of format `fmt`; an unknown name is refused (a ValueError)."""
    parser = PARSERS.get(fmt)
    if parser is None:
        raise ValueError(f"unknown tool format {fmt!r}; known: {', '.join(FORMATS)}")
    return parser()
