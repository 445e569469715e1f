"""Structured output's limits through the real Truss server with the dev model: schema
bombs get a 400 naming the limit while the server keeps answering; a compile that overruns
is killed (the bystander is answered meanwhile) and its refusal cached; the compiled
grammar cache stays within its bound; min_tokens with a grammar and keywords xgrammar
would ignore are 400s, never 5xx."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import pytest
import requests

from tests.e2e.util import value, wait_for

pytestmark = pytest.mark.e2e

MESSAGES = [{"role": "user", "content": "Answer in JSON."}]
BOMB = {"type": "string", "pattern": "((a{0,30}){0,30}){0,30}"}  # minutes in xgrammar


def chat(url: str, schema: dict | None = None, **extra: object) -> requests.Response:
    body: dict = {"model": "m", "messages": MESSAGES, "max_tokens": 8, "temperature": 0}
    if schema is not None:
        body["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "s", "schema": schema},
        }
    return requests.post(f"{url}/v1/chat/completions", json=body | extra, timeout=600)


def deep(levels: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "array", "items": schema}
    return schema


BOMBS = {
    "nested quantifiers": (BOMB, "grammar_max_pattern_repeat"),
    # ~700 KB of enum (the 709 KB one froze the server for 189 s).
    "huge enum": (
        {"type": "string", "enum": [f"v{i:07d}" for i in range(60_000)]},
        "grammar_max_schema_bytes",
    ),  # fmt: skip
    "many enum values": ({"enum": list(range(5000))}, "grammar_max_enum_values"),
    "deep nesting": (deep(25), "grammar_max_schema_depth"),
}


@pytest.mark.parametrize("name", list(BOMBS))
def test_a_schema_bomb_is_a_400_naming_the_limit_and_others_are_served(
    server_url: str, name: str
) -> None:
    schema, limit = BOMBS[name]
    with ThreadPoolExecutor(3) as pool:
        bomb = pool.submit(chat, server_url, schema)
        health = pool.submit(requests.get, f"{server_url}/health", timeout=600)
        bystander = pool.submit(chat, server_url)
        r = bomb.result()
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert limit in error["message"] and error["param"] == "response_format"
        assert health.result().status_code == 200
        assert bystander.result().status_code == 200


def test_an_overrunning_compile_is_killed_while_others_are_answered(
    start_server: Callable,
) -> None:
    # The static bound lifted: the bomb reaches the compiler process and overruns there.
    server = start_server(
        grammar_max_pattern_repeat=10**9,
        grammar_compile_timeout_seconds=20,
        grammar_cache_bytes=300_000,
    )
    url = server.url
    done: list[str] = []  # which answer arrived first
    lock = threading.Lock()

    def tagged(tag: str, call: Callable[[], requests.Response]) -> requests.Response:
        r = call()
        with lock:
            done.append(tag)
        return r

    with ThreadPoolExecutor(3) as pool:
        bomb = pool.submit(tagged, "bomb", lambda: chat(url, BOMB))
        # The compile has begun once the server counts it (and /metrics answers).
        wait_for(lambda: value(url, "mtt:grammar_compiles_total") >= 1, 300, "the compile")
        health = pool.submit(tagged, "health", lambda: requests.get(f"{url}/health", timeout=600))
        bystander = pool.submit(tagged, "bystander", lambda: chat(url))
        assert health.result().status_code == 200
        assert bystander.result().status_code == 200
        r = bomb.result()
    assert r.status_code == 400, r.text
    assert "grammar_compile_timeout_seconds" in r.json()["error"]["message"]
    assert done[-1] == "bomb"  # the others were answered during the compile
    assert value(url, "mtt:grammar_compile_kills_total") == 1
    # The refusal is cached: asked again, no compile.
    again = chat(url, BOMB)
    assert again.status_code == 400 and again.json() == r.json()
    assert value(url, "mtt:grammar_compiles_total") == 1

    # The compiled grammar cache (the in-process engine's) holds to grammar_cache_bytes:
    # six 1000-value enums need ~90 KB each.
    for i in range(6):
        schema = {"type": "string", "enum": [f"s{i}-value-{j}" for j in range(1000)]}
        ok = chat(url, schema, max_tokens=2)
        assert ok.status_code == 200, ok.text
    assert value(url, "mtt:grammar_compiles_total") == 7
    assert 0 < value(url, "mtt:grammar_cache_bytes") <= 300_000


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("kind", ["json_object", "json_schema"])
def test_min_tokens_with_a_grammar_is_a_400(server_url: str, stream: bool, kind: str) -> None:
    fmt: dict = {"type": kind}
    if kind == "json_schema":
        fmt["json_schema"] = {"name": "s", "schema": {"type": "boolean"}}
    body = {
        "model": "m",
        "messages": MESSAGES,
        "max_tokens": 32,
        "min_tokens": 16,  # past the grammar's end: a boolean is at most 5 characters
        "response_format": fmt,
        "stream": stream,
    }
    r = requests.post(f"{server_url}/v1/chat/completions", json=body, timeout=600)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "min_tokens"


def test_a_grammar_without_min_tokens_still_ends_valid(server_url: str) -> None:
    r = chat(server_url, {"type": "boolean"}, max_tokens=32)
    assert r.status_code == 200, r.text
    jsonschema.validate(
        json.loads(r.json()["choices"][0]["message"]["content"]), {"type": "boolean"}
    )


@pytest.mark.parametrize(
    ("schema", "named"),
    [
        ({"type": "string", "not": {"const": "a"}}, "'not'"),
        ({"type": "object", "properties": {"a": {"type": "string", "if": {}}}}, "'if'"),
        ({"type": "array", "items": {"type": "integer"}, "contains": {"const": 3}}, "'contains'"),
        ({"type": "number", "multipleOf": 0.5}, "multipleOf"),
        ({"type": "string", "format": "regex"}, "'regex'"),
    ],
)
def test_a_keyword_xgrammar_ignores_is_a_400_naming_it(
    server_url: str, schema: dict, named: str
) -> None:
    r = chat(server_url, schema)
    assert r.status_code == 400, r.text
    assert named in r.json()["error"]["message"]


def test_xgrammar_refusals_carry_no_build_paths(server_url: str) -> None:
    r = chat(server_url, {"type": "nonsense"})
    assert r.status_code == 400
    message = r.json()["error"]["message"]
    assert message == 'response_format: cannot use this schema: Unsupported type "nonsense"'
