"""Hostile input against the real Truss server: no body reaches a 5xx, every refusal is
JSON in the route's error shape, and the server keeps serving.

A fixed battery (every POST route x bodies that broke servers before: lone surrogates,
invalid UTF-8, deep nesting, coerced types, huge numbers, wrong shapes) plus
property-based bodies (arbitrary bytes, arbitrary JSON values, mutated valid bodies).
"""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.e2e.util import scrape

pytestmark = pytest.mark.e2e

PREDICT = "/v1/models/model:predict"
OPENAI = ("/v1/chat/completions", "/v1/completions", "/v1/responses")
ANTHROPIC = ("/v1/messages", "/v1/messages/count_tokens")
OUR_ROUTES = (PREDICT, "/v1/models/model:predict_binary", "/invocations", *OPENAI, *ANTHROPIC)
NOT_SERVED = ("/v1/embeddings", "/hot-reload")

VALID = {
    PREDICT: {"prompt": "Hello", "max_new_tokens": 2},
    "/v1/models/model:predict_binary": {"prompt": "Hello", "max_new_tokens": 2},
    "/invocations": {"prompt": "Hello", "max_new_tokens": 2},
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2},
    "/v1/completions": {"prompt": "Hello", "max_tokens": 2},
    "/v1/responses": {"input": "Hi", "max_output_tokens": 2},
    "/v1/messages": {
        "model": "m",
        "max_tokens": 2,
        "messages": [{"role": "user", "content": "Hi"}],
    },
    "/v1/messages/count_tokens": {"model": "m", "messages": [{"role": "user", "content": "Hi"}]},
}

# Raw bodies that are wrong for every route.
BAD_BYTES = [
    b"",
    b" ",
    b"null",
    b"[]",
    b"42",
    b'"prompt"',
    b"true",
    b"{",
    b"{}}",
    b'{"prompt": "a\\ud800b"}',
    b'{"prompt": "\\udfff"}',
    b'{"messages": [{"role": "user", "content": "\\ud83d"}]}',
    b'{"\\ud800": 1}',
    b"\xff\xfe\x00{",
    b'{"prompt": "\xc3\x28"}',
    b'{"prompt": "\xed\xa0\x80"}',  # a surrogate encoded as UTF-8: not valid UTF-8
    b"\xef\xbb\xbf{}",  # a BOM
    '{"prompt": "caf\u00e9"}'.encode("latin-1"),
    '{"prompt": "hi"}'.encode("utf-16"),
    b"[" * 1000 + b"]" * 1000,
    b'{"a":' * 1000 + b"1" + b"}" * 1000,
    b'{"prompt": ' + b"[" * 100 + b"]" * 100 + b"}",
    b'{"prompt": NaN}',
    b'{"prompt": "x", "temperature": Infinity}',
    b'{"prompt": "x", "temperature": -Infinity}',
    b'{"prompt": "x", "max_new_tokens": 1e400, "max_tokens": 1e400}',
    b"\x00\x00\x00",
    b"\x1f\x8b\x08\x00",  # gzip magic
    b"\x82\xa6prompt\xa2hi",  # msgpack
    b"prompt=hi&max_new_tokens=2",
]

# JSON bodies that are wrong in a field (each route gets the ones that apply to it).
BAD_PREDICT = [
    {"prompt": "x", "max_new_tokens": "2"},
    {"prompt": "x", "max_new_tokens": True},
    {"prompt": "x", "max_new_tokens": 2.0},
    {"prompt": "x", "max_new_tokens": 0},
    {"prompt": "x", "max_new_tokens": -1},
    {"prompt": "x", "max_new_tokens": 10**30},
    {"prompt": "x", "streaming": "yes"},
    {"prompt": "x", "streaming": 1},
    {"prompt": "x", "temperature": "0.5"},
    {"prompt": "x", "temperature": 3},
    {"prompt": "x", "temperature": -1e-300},
    {"prompt": "x", "top_p": 2},
    {"prompt": "x", "top_k": -1},
    {"prompt": "x", "top_k": 1.5},
    {"prompt": "x", "seed": -1},
    {"prompt": "x", "seed": 2**64},
    {"prompt": "x", "stop": ""},
    {"prompt": "x", "stop": [1]},
    {"prompt": "x", "stop": ["a"] * 17},
    {"prompt": "x", "repetition_penalty": 0},
    {"prompt": "x", "presence_penalty": 3},
    {"prompt": "x", "streaming_interval": 0},
    {"prompt": 1},
    {"prompt": None},
    {"prompt": ["x"]},
    {"prompt": {"text": "x"}},
    {},
    {"prompt": "x", "messages": [{"role": "user", "content": "x"}]},
    {"messages": []},
    {"messages": [{"role": "robot", "content": "x"}]},
    {"messages": [{"role": "user", "content": 1}]},
    {"messages": [{"role": "assistant", "content": "x"}]},
    {"messages": "hi"},
    {"prompt": "x", "unknown": 1},
    {"prompt": "x", "max_tokens": 2, "max_new_tokens": 2},
    {"prompt": "x", "stream": True, "streaming": False},
    {"prompt": "x" * 3_000_000},
]

BAD_OPENAI = [
    {"max_tokens": "2"},
    {"max_tokens": True},
    {"max_tokens": 0},
    {"temperature": "1"},
    {"temperature": 2.5},
    {"top_p": 0},
    {"n": 2},
    {"n": "1"},
    {"stream": "true"},
    {"stream_options": {"include_usage": True}},
    {"stream": True, "stream_options": {"include_usage": "yes"}},
    {"stop": ["a"] * 17},
    {"seed": "1"},
    {"tools": []},
    {"logit_bias": {"1": 2}},
    {"echo": "yes"},
    {"echo": True, "stream": True},
    {"best_of": 2},
    {"user": 1},
    {"model": ["m"]},
    {"response_format": {"type": "xml"}},
    {"response_format": {"type": "json_schema"}},
    {"min_tokens": -1},
    {"ignore_eos": "yes"},
    {"top_k": -1},
]

BAD_CHAT_ONLY = [
    {"messages": []},
    {"messages": [{"role": "user"}]},
    {"messages": [{"role": "tool", "content": "x"}]},
    {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}]},
    {"messages": [{"role": "assistant", "content": "x"}]},
    {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2},
    {"messages": [{"role": "user", "content": "x"}], "logprobs": True, "top_logprobs": 99},
    {"messages": [{"role": "user", "content": "x" * 3_000_000}]},
]

BAD_RESPONSES = [
    {"input": []},
    {"input": [{"type": "reasoning"}]},
    {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
    {"input": [{"type": "function_call_output", "call_id": "c", "output": "x"}]},
    {"input": "x", "previous_response_id": "resp_never"},
    {"input": "x", "max_output_tokens": 0},
    {"input": "x", "truncation": "auto"},
    {"input": "x", "tools": [{"type": "web_search"}]},
    {"input": "x", "tool_choice": "required"},
    {"input": "x", "text": {"format": {"type": "json_schema"}}},
    {"input": "x", "reasoning": {"effort": "high"}},
    {"input": "x", "background": True},
    {"input": "x" * 3_000_000},
]

BAD_MESSAGES = [
    {"max_tokens": 0},
    {"max_tokens": "2"},
    {"temperature": 1.5},
    {"messages": []},
    {"messages": [{"role": "system", "content": "x"}]},
    {"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
    {"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t"}]}]},
    {"messages": [{"role": "assistant", "content": "x"}]},
    {"system": [{"type": "image"}]},
    {"thinking": {"type": "enabled", "budget_tokens": 1024}},
    {"tools": [{"name": "f"}]},
    {"tool_choice": {"type": "any"}},
    {"stop_sequences": ["a"] * 17},
    {"messages": [{"role": "user", "content": "x" * 3_000_000}]},
]

BAD_COMPLETIONS_ONLY = [
    {"prompt": [1, "a"]},
    {"prompt": ["a", "b"]},
    {"prompt": []},
    {"prompt": [-1]},
    {"prompt": [10**9]},
    {"prompt": 5},
    {"prompt": "x", "logprobs": 99},
    {"prompt": "x", "logprobs": True},
]


def _battery() -> list[tuple[str, bytes]]:
    cases: list[tuple[str, bytes]] = []
    for route in (*OUR_ROUTES, *NOT_SERVED):
        cases += [(route, body) for body in BAD_BYTES]
    for route in (PREDICT, "/v1/models/model:predict_binary", "/invocations"):
        cases += [(route, json.dumps(b).encode()) for b in BAD_PREDICT]
    for route in OPENAI[:2]:
        base = VALID[route]
        cases += [(route, json.dumps(base | b).encode()) for b in BAD_OPENAI]
    cases += [("/v1/responses", json.dumps(b).encode()) for b in BAD_RESPONSES]
    for route in ANTHROPIC:
        cases += [(route, json.dumps(VALID[route] | b).encode()) for b in BAD_MESSAGES]
    cases += [("/v1/chat/completions", json.dumps(b).encode()) for b in BAD_CHAT_ONLY]
    cases += [
        ("/v1/completions", json.dumps({"max_tokens": 2} | b).encode())
        for b in BAD_COMPLETIONS_ONLY
    ]
    return cases


BATTERY = _battery()


def check_refusal(url: str, route: str, body: bytes) -> requests.Response:
    r = requests.post(
        url + route, data=body, headers={"Content-Type": "application/json"}, timeout=120
    )
    assert r.status_code < 500, (route, body[:200], r.status_code, r.text[:300])
    if r.status_code >= 400 and route in ANTHROPIC:
        body = r.json()  # Anthropic's shape
        assert body["type"] == "error" and body["error"]["type"].endswith("error"), r.text
        assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    elif r.status_code >= 400:
        error = r.json()["error"]  # JSON, in the route's shape
        if route in OPENAI or route in NOT_SERVED:
            assert isinstance(error["message"], str) and error["message"], r.text
            assert error["type"].endswith("error") or error["type"] == "service_unavailable"
        else:
            assert isinstance(error, str) and error, r.text
    return r


def test_the_battery_is_large() -> None:
    assert len(BATTERY) >= 200


def test_every_bad_body_on_every_route_is_a_json_4xx(server_url: str) -> None:
    statuses: dict[int, int] = {}
    for route, body in BATTERY:
        r = check_refusal(server_url, route, body)
        assert r.status_code >= 400, (route, body[:200], r.text[:200])
        statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
    assert requests.get(server_url + "/v1/models/model", timeout=30).status_code == 200
    assert set(statuses) <= {400, 404, 413}, statuses


def test_a_missed_previous_response_is_a_404_naming_it(server_url: str) -> None:
    body = {"input": "x", "previous_response_id": "resp_never"}
    r = check_refusal(server_url, "/v1/responses", json.dumps(body).encode())
    assert r.status_code == 404 and "resp_never" in r.json()["error"]["message"]
    assert r.json()["error"]["param"] == "previous_response_id"


def test_refusals_are_counted_as_invalid(server_url: str) -> None:
    def invalid() -> float:
        return scrape(server_url).get(
            ("mtt:request_finished_total", (("finished_reason", "invalid"), ("route", "predict"))),
            0.0,
        )

    before = invalid()
    for body in (b"\xff", b'{"prompt": 1}', b"[" * 1000):
        check_refusal(server_url, PREDICT, body)
    assert invalid() - before == 3


# ---- property-based ----

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4)
    ),
    max_leaves=12,
)
FIELDS = sorted(
    {
        "input",
        "instructions",
        "previous_response_id",
        "max_output_tokens",
        "text",
        "tools",
        "tool_choice",
        "system",
        "stop_sequences",
        "messages",
        "max_new_tokens",
        "max_tokens",
        "temperature",
        "top_k",
        "top_p",
        "streaming",
        "stream",
        "stop",
        "seed",
        "logprobs",
        "response_format",
        "min_tokens",
    }
)
FUZZ = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@FUZZ
@given(route=st.sampled_from(OUR_ROUTES), body=st.binary(max_size=200))
def test_arbitrary_bytes_never_get_a_5xx(server_url: str, route: str, body: bytes) -> None:
    check_refusal(server_url, route, body)


@FUZZ
@given(route=st.sampled_from(OUR_ROUTES), body=json_values)
def test_arbitrary_json_never_gets_a_5xx(server_url: str, route: str, body: object) -> None:
    check_refusal(server_url, route, json.dumps(body).encode())


# A route's valid body with one field mutated (`mutated`): hypothesis's arguments.
MUTATIONS = {
    "route": st.sampled_from(OUR_ROUTES),
    "field": st.sampled_from(FIELDS),
    "value": json_values,
    "drop": st.booleans(),
}


@FUZZ
@given(**MUTATIONS)
def test_mutated_valid_bodies_never_get_a_5xx(
    server_url: str, route: str, field: str, value: object, drop: bool
) -> None:
    body = mutated(VALID[route], field, value, drop)
    check_refusal(server_url, route, json.dumps(body).encode())


def mutated(valid: dict[str, Any], field: str, value: object, drop: bool) -> dict[str, Any]:
    """A valid body with one field set to `value` (and one of its own dropped first, when
    `drop`); token counts kept short: the properties are about parsing, not long answers."""
    body = dict(valid)
    if drop and body:
        body.pop(random.Random(field).choice(sorted(body)))
    body[field] = value
    for key in ("max_new_tokens", "max_tokens"):
        if isinstance(body.get(key), int) and not isinstance(body[key], bool):
            body[key] = min(body[key], 4)
    return body


def test_probes_answer_head_and_generation_routes_refuse_get(server_url: str) -> None:
    """HEAD on the GET routes (a probe or scraper may use it) is 200 (/metrics was 405); a
    GET on a generation route is a 405 (GET /v1/models/model:predict was Truss's readiness
    route: 200 `{}`)."""
    for path in ("/metrics", "/health", "/version", "/v1/models"):
        r = requests.head(server_url + path, timeout=30)
        assert r.status_code == 200, (path, r.status_code)
    for path in OUR_ROUTES:
        r = requests.get(server_url + path, timeout=30)
        assert r.status_code == 405, (path, r.status_code, r.text[:200])
        assert r.headers["allow"] == "POST"
