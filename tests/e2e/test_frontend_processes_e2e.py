"""Several front-end processes over one engine process (`frontend_processes: 2`), the
real Truss server in each, the replay engine in the shared engine process: both
front-ends serve on the one port, `/metrics` from either sums both, SIGTERM drains a
stream on either before the engine stops, and a front-end or the engine that dies takes
the whole server down (so that Kubernetes restarts the pod) and leaves no process behind.

Which front-end takes a connection is the kernel's choice; a test that needs one of them
stops the other (SIGSTOP) while it connects: the stopped one accepts nothing."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.e2e.util import unready, value, wait_for
from tests.processes import alive, children

pytestmark = pytest.mark.e2e

SHARED = {
    "engine": "replay",
    "engine_process": "on",
    "frontend_processes": 2,
    "replay_step_ms": 2,
}
BODY = {"prompt": "Write about the sea", "max_new_tokens": 24}


def frontends(launcher: int) -> list[int]:
    """The front-end processes, the owner (the first started: the lowest pid) first."""
    return children(launcher, b"mistral_serving.http.server")


def engine_process(owner: int) -> int:
    (pid,) = children(owner, b"mistral_gpu_fallback.process.worker")
    return pid


@contextlib.contextmanager
def only(serving: int, others: list[int]) -> Iterator[None]:
    """New connections go to `serving` alone: the others are stopped meanwhile."""
    for pid in others:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in others:
            os.kill(pid, signal.SIGCONT)


def predict(url: str) -> dict:
    r = requests.post(f"{url}/v1/models/model:predict", json=BODY, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def test_both_front_ends_serve_one_engine_and_the_metrics_sum_both(start_server):
    server = start_server(**SHARED)
    fronts = frontends(server.process.pid)
    assert len(fronts) == 2
    engine = engine_process(fronts[0])
    assert children(fronts[1], b"worker") == []  # the guest started no engine of its own
    before = value(
        server.url, "mtt:request_finished_total", route="predict", finished_reason="length"
    )
    answers = []
    for serving in fronts:
        with only(serving, [p for p in fronts if p != serving]):
            answers += [predict(server.url) for _ in range(3)]
            version = requests.get(f"{server.url}/version", timeout=60).json()
            assert version["details"]["engine_process"] in (engine, "shared")
    assert all(a == answers[0] for a in answers) and answers[0]["output"]
    after = value(
        server.url, "mtt:request_finished_total", route="predict", finished_reason="length"
    )
    assert after - before == 6  # three from each process, whichever answers the scrape
    assert value(server.url, "mtt:num_requests_running") == 0
    assert server.stop(signal.SIGTERM) == 0
    wait_for(lambda: all(not alive(p) for p in [*fronts, engine]), what="every process to end")


def test_sigterm_lets_a_guests_stream_finish_before_the_engine_stops(start_server):
    server = start_server(**SHARED | {"replay_step_ms": 20})
    owner, guest = frontends(server.process.pid)
    expected = predict(server.url)["output"]  # 24 tokens: about half a second
    with only(guest, [owner]):
        stream = requests.post(
            f"{server.url}/v1/models/model:predict",
            json=BODY | {"streaming": True},
            stream=True,
            timeout=120,
        )
        assert stream.status_code == 200
    server.process.send_signal(signal.SIGTERM)
    assert b"".join(stream.iter_content(chunk_size=None)).decode() == expected
    assert server.process.wait(120) == 0
    lines = server.log()
    assert "stopping the front-end processes" in lines


def test_a_killed_front_end_stops_the_server_and_leaves_no_process(start_server):
    server = start_server(**SHARED)
    owner, guest = frontends(server.process.pid)
    engine = engine_process(owner)
    os.kill(guest, signal.SIGKILL)
    assert server.process.wait(120) != 0
    assert "front-end process 1" in server.log() and "killed by SIGKILL" in server.log()
    wait_for(lambda: all(not alive(p) for p in (owner, engine)), what="every process to end")


def test_a_killed_engine_process_stops_every_front_end(start_server):
    server = start_server(**SHARED)
    fronts = frontends(server.process.pid)
    os.kill(engine_process(fronts[0]), signal.SIGKILL)
    # Whichever front-end a probe reaches sees the dead engine and stops; the launcher
    # then stops the other. Probed until then, as a kubelet does.
    wait_for(
        lambda: unready(server.url) and server.process.poll() is not None,
        what="the server to report unhealthy and stop",
    )
    assert server.process.returncode != 0
    log = server.log()
    assert "killed by SIGKILL" in log or "closed its connection" in log
    wait_for(lambda: all(not alive(p) for p in fronts), what="every front-end to end")


def test_the_metrics_directory_and_the_engine_socket_are_removed_at_exit(start_server):
    server = start_server(**SHARED)
    owner = frontends(server.process.pid)[0]
    environ = dict(
        item.split(b"=", 1)
        for item in Path(f"/proc/{owner}/environ").read_bytes().split(b"\0")
        if b"=" in item
    )
    workdir = Path(environ[b"PROMETHEUS_MULTIPROC_DIR"].decode()).parent
    assert (workdir / "engine.sock").exists()
    assert oct(workdir.stat().st_mode & 0o777) == "0o700"
    assert server.stop(signal.SIGTERM) == 0
    assert not workdir.exists()


def test_several_front_ends_without_an_engine_process_are_refused_at_start(start_server):
    server = start_server(wait=False, engine_process="off", frontend_processes=2)
    assert server.process.wait(120) == 2
    assert "frontend_processes=2 needs engine_process: on" in server.log()
