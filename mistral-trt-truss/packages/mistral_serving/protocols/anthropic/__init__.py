"""Anthropic's Messages API: `POST /v1/messages` and `POST /v1/messages/count_tokens`
(`format.py`), its request body (`requests.py`), answer, event and error shapes
(`types.py`). docs/anthropic-messages.md is the contract."""
