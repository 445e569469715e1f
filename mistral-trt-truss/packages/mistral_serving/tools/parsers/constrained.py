"""The answer generated under the tool-call grammar (`tool_choice` required or a named
function; structured.grammar.tool_call_schema): the JSON list of calls itself, from the
first character, without the format's markup and with `arguments` whatever the format."""

from __future__ import annotations

from mistral_serving.tools.parsers.base import MarkedJson


class ConstrainedCalls(MarkedJson):
    def __init__(self) -> None:
        super().__init__("", ("arguments",))
