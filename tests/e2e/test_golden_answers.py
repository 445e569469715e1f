"""Whole answers held against snapshots: the exact bytes the real Truss server sends (dev
model, greedy, fixed seeds) for each route, streamed and not, with logprobs, with
`response_format`, echo, an error of each route and `GET /v1/models`, in
tests/golden/answers/ (`.json`: status and body; `.sse`: status comment and the event
stream; `.txt`: a streamed predict body). Only the volatile fields (ids, `created`) are
normalised, in `normalise`; floats are held to 1e-4 (see `check`); everything else, key
order included, must stay byte for byte. After a deliberate change, regenerate and review the diff:

    UPDATE_GOLDEN=1 .venv/bin/python -m pytest -p no:cacheprovider tests/e2e/test_golden_answers.py
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import pytest
import requests

pytestmark = pytest.mark.e2e

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "answers"
UPDATE = os.environ.get("UPDATE_GOLDEN") == "1"

PREDICT = "/v1/models/model:predict"
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
MESSAGES = [{"role": "user", "content": "What is a mistral? 🌬️"}]
GREEDY = {"temperature": 0, "seed": 7}
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 8}, "ok": {"type": "boolean"}},
    "required": ["name", "ok"],
    "additionalProperties": False,
}

# name -> (path, body); a body with "stream": true (or predict's "streaming") streams.
CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "predict.json": (PREDICT, {"prompt": "What is a mistral?", "max_new_tokens": 12, "seed": 7}),
    "predict_stream.txt": (
        PREDICT,
        {"prompt": "What is a mistral?", "max_new_tokens": 12, "seed": 7, "streaming": True},
    ),
    "predict_error.json": (PREDICT, {"prompt": "hi", "max_new_tokens": -1}),
    "chat.json": (CHAT, {"messages": MESSAGES, "max_tokens": 12} | GREEDY),
    "chat_stream.sse": (
        CHAT,
        {
            "messages": MESSAGES,
            "max_tokens": 12,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        | GREEDY,
    ),
    "chat_logprobs.json": (
        CHAT,
        {"messages": MESSAGES, "max_tokens": 4, "logprobs": True, "top_logprobs": 2} | GREEDY,
    ),
    "chat_json_schema.json": (
        CHAT,
        {
            "messages": MESSAGES,
            "max_tokens": 40,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "thing", "schema": SCHEMA},
            },
        }
        | GREEDY,
    ),
    "chat_error.json": (CHAT, {"messages": MESSAGES, "n": 2}),
    "completions.json": (COMPLETIONS, {"prompt": "Once upon a time", "max_tokens": 10} | GREEDY),
    "completions_stream.sse": (
        COMPLETIONS,
        {"prompt": "Once upon a time", "max_tokens": 10, "stream": True} | GREEDY,
    ),
    "completions_echo.json": (
        COMPLETIONS,
        {"prompt": "Once upon a time", "max_tokens": 3, "echo": True, "logprobs": 1} | GREEDY,
    ),
    "completions_error.json": (COMPLETIONS, {"prompt": "Once", "best_of": 3}),
}

# The volatile parts of an answer, whatever the route: an answer's id (made from the
# request id) and its creation time (a clock reading; the model list's, the server's start).
_VOLATILE = (
    (re.compile(r'("id": ?)"(chatcmpl|cmpl)-[^"]*"'), r'\1"\2-ID"'),
    (re.compile(r'("created": ?)\d+'), r"\g<1>0"),
)


def normalise(text: str, sse: bool = False) -> str:
    for pattern, replacement in _VOLATILE:
        text = pattern.sub(replacement, text)
    return merge_content_events(text) if sse else text


def _content(event: dict[str, Any]) -> str | None:
    """The text of a plain content event (no finish, no logprobs), else None."""
    choices = event.get("choices") or [{}]
    choice = choices[0]
    if len(choices) != 1 or choice.get("finish_reason") or choice.get("logprobs"):
        return None
    if "delta" in choice:
        delta = choice["delta"]
        return delta["content"] if list(delta) == ["content"] else None
    return choice.get("text")


def merge_content_events(stream: str) -> str:
    """Runs of plain content events as one event with their texts joined. How many tokens
    an event carries is timing (an engine step may hand over several when the stream is
    behind); the events around them and every event's bytes are not. A merged event is
    rendered as the server renders it (`json.dumps`, non-ASCII as is)."""
    out: list[str] = []
    last: dict[str, Any] | None = None
    for block in stream.split("\n\n"):
        event = json.loads(block[6:]) if block.startswith("data: {") else None
        text = None if event is None else _content(event)
        if text is None or event is None:
            out.append(block)
            last = None
            continue
        if last is not None:
            choice = last["choices"][0]
            if "delta" in choice:
                choice["delta"]["content"] += text
            else:
                choice["text"] += text
            out[-1] = "data: " + json.dumps(last, ensure_ascii=False)
        else:
            last = event
            out.append(block)
    return "\n\n".join(out)


def snapshot(name: str, response: requests.Response) -> str:
    """What the golden file holds for this answer."""
    body = normalise(response.content.decode("utf-8"), sse=name.endswith(".sse"))
    kind = response.headers.get("content-type", "").split(";")[0]
    if name.endswith(".sse"):
        return f": status {response.status_code} {kind}\n{body}"
    if name.endswith(".txt"):
        return body
    return f'{{"status": {response.status_code}, "body": {body}}}\n'


def check(name: str, actual: str) -> None:
    path = GOLDEN / name
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(actual, encoding="utf-8")
        return
    assert path.exists(), f"no snapshot {path.name}: run with UPDATE_GOLDEN=1 to record it"
    expected = path.read_text(encoding="utf-8")
    hint = f"{name} changed; if deliberate, regenerate with UPDATE_GOLDEN=1 and review the diff"
    # Logprobs are float sums over a CPU matmul: their last digits follow the CPU's vector
    # width and thread count (CI's machine is not this one), so they are held to 1e-4 and
    # every other byte exactly.
    assert _FLOAT.sub("<float>", actual) == _FLOAT.sub("<float>", expected), hint
    got = [float(m) for m in _FLOAT.findall(actual)]
    want = [float(m) for m in _FLOAT.findall(expected)]
    assert got == pytest.approx(want, rel=1e-4, abs=1e-4), hint


# A float literal as json.dumps writes one (a decimal point or an exponent), never an int.
_FLOAT = re.compile(r"-?\d+(?:\.\d+(?:[eE][-+]?\d+)?|[eE][-+]?\d+)")


def test_floats_are_held_to_a_tolerance_and_the_rest_exactly(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(sys.modules[__name__], "GOLDEN", tmp_path)
    (tmp_path / "x.json").write_text('{"logprob": -1.2345678, "n": 3, "t": "a"}')
    check("x.json", '{"logprob": -1.2345679, "n": 3, "t": "a"}')
    for changed in (
        '{"logprob": -1.3345678, "n": 3, "t": "a"}',
        '{"logprob": -1.2345678, "n": 4, "t": "a"}',
        '{"logprob": -1.2345678, "n": 3, "t": "b"}',
        '{"logprob": -1e-05, "n": 3, "t": "a"}',
    ):
        with pytest.raises(AssertionError):
            check("x.json", changed)


def test_normalise_touches_only_ids_and_clock_readings() -> None:
    raw = '{"id": "chatcmpl-abc-12", "object": "x", "created": 1767312000, "model": "m-7"}'
    assert normalise(raw) == '{"id": "chatcmpl-ID", "object": "x", "created": 0, "model": "m-7"}'
    assert normalise('{"id":"cmpl-q","created":17}') == '{"id":"cmpl-ID","created":0}'
    kept = '{"id": "mistral-7b-instruct", "usage": {"prompt_tokens": 5}, "logprob": -1e-05}'
    assert normalise(kept) == kept


def event(choice: dict[str, Any]) -> str:
    return "data: " + json.dumps({"id": "cmpl-ID", "choices": [choice]}, ensure_ascii=False)


def test_runs_of_content_events_merge_and_nothing_else_does() -> None:
    role = event({"delta": {"role": "assistant", "content": ""}, "finish_reason": None})
    a, b = ({"delta": {"content": t}, "logprobs": None, "finish_reason": None} for t in "ab")
    end = event({"delta": {}, "finish_reason": "stop"})
    stream = "\n\n".join([role, event(a), event(b), end, event(a), "data: [DONE]", ""])
    merged = dict(a, delta={"content": "ab"})
    assert merge_content_events(stream) == "\n\n".join(
        [role, event(merged), end, event(a), "data: [DONE]", ""]
    )
    with_logprobs = event(dict(b, logprobs={"content": []}))
    text = event({"text": "é", "finish_reason": None})
    assert merge_content_events(f"{event(a)}\n\n{with_logprobs}\n\n") == (
        f"{event(a)}\n\n{with_logprobs}\n\n"
    )
    joined = event({"text": "éé", "finish_reason": None})
    assert merge_content_events(f"{text}\n\n{text}\n\n") == f"{joined}\n\n"


@pytest.mark.parametrize("name", sorted(CASES))
def test_answer_matches_its_snapshot(server_url: str, name: str) -> None:
    path, body = CASES[name]
    response = requests.post(server_url + path, json=body, timeout=120)
    streamed = body.get("stream") or body.get("streaming")
    assert (response.status_code == 200) == ("error" not in name), response.text
    if streamed:
        assert response.headers["content-type"].startswith(
            "text/event-stream" if name.endswith(".sse") else "text/plain"
        ), response.headers
    check(name, snapshot(name, response))


def test_model_list_matches_its_snapshot(server_url: str) -> None:
    response = requests.get(f"{server_url}/v1/models", timeout=30)
    assert response.status_code == 200
    check("models.json", snapshot("models.json", response))


def test_every_snapshot_belongs_to_a_case() -> None:
    """A case renamed or dropped leaves no stale snapshot behind."""
    assert {p.name for p in GOLDEN.iterdir()} == set(CASES) | {"models.json"}
