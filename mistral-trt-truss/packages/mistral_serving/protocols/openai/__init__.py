"""OpenAI-compatible `POST /v1/chat/completions` (`chat.py`) and `POST /v1/completions`
(`completions.py`), over a shared base (`base.py`): request models (`requests.py`),
answers and SSE chunks in OpenAI's exact shapes (`types.py`), errors in OpenAI's error
shape.

Accepted beyond OpenAI's core: vLLM's `top_k`, `repetition_penalty`, `ignore_eos` and
`min_tokens`. `logprobs` (chat: `logprobs` + `top_logprobs`; completions: `logprobs` as
a count) are the log-softmax of the logits the sampler saw, after penalties and before
temperature, top-k and top-p. `response_format` (`json_object`, `json_schema`) constrains
the output with a grammar where the engine supports it (the schema is checked by
`structured/grammar.py` before any engine sees it; `min_tokens` with it is refused).
`echo` (completions) puts the prompt before the completion; with `logprobs` the choice's logprobs cover the prompt
tokens first (the first one null, then each given the tokens before it, the model's own
log-softmax), then the generated ones; `max_tokens: 0` (echo only) generates nothing, so
`echo, max_tokens 0, logprobs k` scores a text (lm-evaluation-harness's loglikelihood).
A prompt may be one list of token ids, or a batch holding one. Fields we cannot honour
(`n` > 1, echo with `stream`, ...) are refused with a 400 that names the field.

Tools (chat): `chat.py`; docs/tool-calling.md is the contract.
"""
