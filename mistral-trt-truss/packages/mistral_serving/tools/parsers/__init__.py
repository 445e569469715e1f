"""Tool calls read out of a model's answer as it arrives, one parser class per tool format
(docs/tool-calling.md): `stream.py` (the stream and the whole answer, the same for every
format), `registry.py` (the parser for a format's name), `base.py` (the interface),
`json_tokens.py` (the JSON reader they share), one module per format, and
`constrained.py` (the answer generated under the tool-call grammar)."""
