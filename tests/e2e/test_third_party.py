"""Third-party clients, unchanged, against the real Truss server with the dev model: each
runs the README's "Works with" command as written (aimed at the test server). guidellm,
which needs its own venv, is in tests/tools (`make test-tools`)."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import openai
import pytest
from langchain_openai import ChatOpenAI

from tests.dashboard import exposed, load, parse, queries, with_prefix
from tests.works_with import rows

pytestmark = pytest.mark.e2e

SERVED = "mistral-7b-instruct"  # the served id (settings' served_model_name default)


def test_openai_sdk_lists_the_served_model(server_url: str, dev_model: Path) -> None:
    row = rows()["openai SDK"]
    page = eval(row.local(server_url), {"OpenAI": openai.OpenAI})  # the README's command
    (model,) = page.data
    assert (model.id, model.object) == (SERVED, "model")
    # vLLM's field: the sequence limit, here the dev model's own.
    config = json.loads((dev_model / "config.json").read_text())
    assert model.model_extra["max_model_len"] == config["max_position_embeddings"]


def test_langchain_chatopenai_streams_the_whole_answer(server_url: str) -> None:
    row = rows()["LangChain"]
    chunks = list(eval(row.local(server_url), {"ChatOpenAI": ChatOpenAI}))
    merged = chunks[0]
    for chunk in chunks[1:]:
        merged += chunk
    assert merged.response_metadata["finish_reason"] == "length"
    assert merged.response_metadata["model_name"] == SERVED
    # The same request through the openai SDK, not streamed (greedy: the same text).
    client = openai.OpenAI(base_url=f"{server_url}/v1", api_key="unused", max_retries=0)
    same = client.chat.completions.create(
        model=SERVED,
        messages=[{"role": "user", "content": "What is a mistral?"}],
        max_tokens=16,
        temperature=0,
    )
    assert merged.content == same.choices[0].message.content
    assert same.usage.completion_tokens == 16


def test_continuous_usage_stats_as_guidellm_asks(server_url: str) -> None:
    """vLLM's stream_options.continuous_usage_stats: the usage so far in every chunk
    after the role chunk, ending at the final usage."""
    body = {
        "model": SERVED,
        "messages": [{"role": "user", "content": "Hello"}],
        "max_completion_tokens": 8,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    with httpx.stream("POST", f"{server_url}/v1/chat/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        events = [line.removeprefix("data: ") for line in r.iter_lines() if line]
    assert events[-1] == "[DONE]"
    role, *chunks, last = (json.loads(e) for e in events[:-1])
    assert role["usage"] is None and last["choices"] == []
    counts = [c["usage"]["completion_tokens"] for c in chunks]
    assert counts == sorted(counts) and counts[-1] == 8
    assert {c["usage"]["prompt_tokens"] for c in chunks} == {last["usage"]["prompt_tokens"]}
    assert last["usage"]["completion_tokens"] == 8


def test_the_grafana_dashboard_queries_metrics_the_server_exports(server_url: str) -> None:
    names = exposed(httpx.get(f"{server_url}/metrics", timeout=10).text)
    for title, expr in queries(load()):
        metrics = parse(with_prefix(expr, "mtt")).metrics
        assert metrics and metrics <= names.keys(), f"{title}: {sorted(metrics - names.keys())}"
