"""The real Truss server: a non-streamed answer that outlasts the drain's grace period is
answered 503 with the partial text and finish_reason "abort", not 200."""

from __future__ import annotations

import signal
import threading

import pytest
import requests

from tests.e2e.util import value, wait_for

pytestmark = pytest.mark.e2e


def test_a_non_streamed_answer_cut_by_the_drain_is_a_503(start_server) -> None:
    server = start_server(drain_grace_seconds=1)
    answers: list[requests.Response] = []
    body = {"prompt": "Write about the sea", "max_new_tokens": 4000}

    def ask() -> None:
        answers.append(
            requests.post(f"{server.url}/v1/models/model:predict", json=body, timeout=120)
        )

    asker = threading.Thread(target=ask)
    asker.start()
    wait_for(lambda: value(server.url, "mtt:num_requests_running") >= 1, 60, "it to run")
    server.process.send_signal(signal.SIGTERM)
    asker.join(120)
    server.process.wait(60)
    (answer,) = answers
    assert answer.status_code == 503, answer.text
    data = answer.json()
    assert data["finish_reason"] == "abort" and data["output"]
    assert "cut short" in data["error"]
    assert 0 < data["usage"]["completion_tokens"] < 4000
