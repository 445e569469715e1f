"""`mistral`: Mistral tokenizers with tool tokens (v3 and later). The calls follow the
`[TOOL_CALLS]` token (decoded to its text): a JSON list of `{"name", "arguments"}`."""

from __future__ import annotations

from mistral_serving.tools.parsers.base import MarkerParser, random_alnum


class MistralParser(MarkerParser):
    name = "mistral"
    marker = "[TOOL_CALLS]"

    def new_call_id(self) -> str:
        # mistral-common's validator demands 9 letters or digits when the id comes back
        # in the history.
        return random_alnum(9)
