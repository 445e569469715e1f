"""The engine watchdog on the real Truss server with `engine_process: on`: a SIGSTOPped
engine process with a request pending turns readiness 503 past
`engine_stall_unready_seconds` (SIGCONT brings it back), and past
`engine_stall_exit_seconds` the server exits with status 1 and the reason last in its log (no other line after it).
Nothing here times the machine: limits are small, the waits are generous bounds."""

from __future__ import annotations

import os
import signal

import pytest
import requests

from mistral_build.local_server import raw_post
from tests.e2e.test_engine_process_e2e import alive, engine_processes
from tests.e2e.util import wait_for

pytestmark = pytest.mark.e2e

BODY = {"prompt": "Write about the sea", "max_new_tokens": 8}


def readiness(url: str) -> int:
    return requests.get(f"{url}/v1/models/model", timeout=30).status_code


def test_a_stopped_engine_process_is_unready_until_it_continues(start_server):
    # The exit limit is far away: this test only sees readiness go and come back.
    server = start_server(
        engine_process="on", engine_stall_unready_seconds=1, engine_stall_exit_seconds=3600
    )
    (child,) = engine_processes(server.process.pid)
    os.kill(child, signal.SIGSTOP)
    try:
        sock = raw_post(server.url, "/v1/models/model:predict", BODY)  # pending in the engine
        wait_for(lambda: readiness(server.url) == 503, what="readiness to fail")
        wait_for(lambda: "readiness fails until it moves" in server.log(), what="the warning")
        assert server.process.poll() is None
    finally:
        os.kill(child, signal.SIGCONT)
    wait_for(lambda: readiness(server.url) == 200, what="readiness to come back")
    sock.settimeout(120)  # an answer that never comes fails here, not at the test's limit
    answer = sock.makefile("rb").readline()  # the pending request was answered after all
    sock.close()
    assert answer.startswith(b"HTTP/1.1 200"), answer
    wait_for(lambda: "readiness restored" in server.log(), what="the watchdog to see it move")
    server.stop()


def test_a_stopped_engine_process_past_the_exit_limit_ends_the_server(start_server):
    server = start_server(
        engine_process="on", engine_stall_unready_seconds=1, engine_stall_exit_seconds=4
    )
    (child,) = engine_processes(server.process.pid)
    os.kill(child, signal.SIGSTOP)
    try:
        sock = raw_post(server.url, "/v1/models/model:predict", BODY)
        assert server.process.wait(120) == 1
        sock.close()
    finally:
        if server.process.poll() is None:
            os.kill(child, signal.SIGCONT)
    last = server.log().strip().splitlines()[-1]
    assert "engine stalled: no progress for" in last, last
    assert "exiting with status 1" in last
    wait_for(lambda: not alive(child), what="the stopped engine process to be killed")
