"""Tool calling: the request side (tools, tool_choice, history) and the parsers that read
tool calls out of an answer, one per format."""
