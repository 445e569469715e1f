"""The OpenAI Responses API: `POST /v1/responses` (`format.py`), its request body
(`requests.py`), answer and event shapes (`types.py`), and the stored responses that
`previous_response_id`, `GET` and `DELETE /v1/responses/{id}` read (`store.py`).
docs/responses-api.md is the contract."""
