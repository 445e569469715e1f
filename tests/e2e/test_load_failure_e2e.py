"""A failed load raced by readiness probes: the real Truss server exits with status 1 and
"load failed: ..." as its last log line, never SIGKILLed by Truss's `check_healthy` (exit
137, a traceback last) when a probe lands between the failure and Truss's own shutdown;
a refusal with its reason (no artifact, a manifest that cannot be served) comes without a
traceback."""

from __future__ import annotations

import contextlib
import json
import shutil
import threading
from pathlib import Path

import pytest
import requests

pytestmark = pytest.mark.e2e

PROBES = ("/v1/models/model", "/v1/models/model/loaded", "/ping", "/health")


def test_a_failed_load_under_probes_exits_1_with_the_reason_last(start_server) -> None:
    server = start_server(wait=False, artifact="/nonexistent/artifact")
    stop = threading.Event()
    answered: list[int] = []

    def probe() -> None:  # as a kubelet with a very short period would
        session = requests.Session()
        while not stop.is_set() and server.process.poll() is None:
            for path in PROBES:
                with contextlib.suppress(requests.RequestException):  # not up yet, or gone
                    answered.append(session.get(server.url + path, timeout=5).status_code)

    probers = [threading.Thread(target=probe, daemon=True) for _ in range(4)]
    for t in probers:
        t.start()
    try:
        status = server.process.wait(180)
    finally:
        stop.set()
        for t in probers:
            t.join(10)
    assert answered  # probes did land while it loaded
    assert status == 1, status
    last = [line for line in server.log().splitlines() if line.strip()][-1]
    assert "load failed" in last and "/nonexistent/artifact" in last, last


def with_a_file_outside(dev_model: Path, tmp_path: Path) -> str:
    """A copy of the dev model whose manifest lists a file outside the artifact."""
    art = shutil.copytree(dev_model, tmp_path / "artifact")
    manifest = json.loads((art / "build_manifest.json").read_text())
    manifest["files"]["../outside.bin"] = next(iter(manifest["files"].values()))
    (art / "build_manifest.json").write_text(json.dumps(manifest))
    return str(art)


@pytest.mark.parametrize(
    ("artifact", "reason"),
    [
        (lambda dev, tmp: str(tmp / "no-such-artifact"), "no such directory"),
        (with_a_file_outside, "../outside.bin"),
    ],
    ids=["missing directory", "manifest names a file outside"],
)
def test_an_expected_refusal_is_one_line_without_a_traceback(
    start_server, dev_model: Path, tmp_path: Path, artifact, reason: str
) -> None:
    """A refusal that says why (no artifact there, a manifest that cannot be served) was
    printed after a traceback that read like a crash in our code."""
    server = start_server(wait=False, artifact=artifact(dev_model, tmp_path))
    assert server.process.wait(180) == 1
    log = server.log()
    assert "Traceback" not in log, log[-3000:]
    last = [line for line in log.splitlines() if line.strip()][-1]
    assert "load failed: " in last and reason in last, last
