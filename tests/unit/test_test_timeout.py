"""The suite's own guard against a hang: pyproject's pytest settings give every test a
time limit (pytest-timeout) past which that test fails with a traceback, its teardown
runs (the servers it started are killed) and the run goes on to the next test."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

HANGS = """
import pathlib, threading
import pytest

@pytest.fixture
def server(tmp_path_factory):
    yield
    pathlib.Path(r"{marker}").write_text("torn down")  # as start_server kills its servers

def test_hangs(server):
    threading.Event().wait()  # forever

def test_after():
    pass
"""


def test_every_test_has_a_generous_time_limit(pytestconfig: pytest.Config) -> None:
    assert pytestconfig.pluginmanager.hasplugin("timeout")
    limit = float(pytestconfig.getini("timeout"))
    # Past a server start (180 s) plus the longest command a test runs (300 s), well
    # inside CI's 90 minutes.
    assert 600 <= limit <= 1800
    assert pytestconfig.getini("timeout_method") == "signal"


def test_a_hung_test_fails_its_teardown_runs_and_the_run_goes_on(tmp_path: Path) -> None:
    marker = tmp_path / "teardown"
    test_file = tmp_path / "test_hang.py"
    test_file.write_text(textwrap.dedent(HANGS.format(marker=marker)))
    # The project's own settings (-c pyproject.toml); only the limit is made short.
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-c", str(ROOT / "pyproject.toml"),
         "--rootdir", str(tmp_path), "-p", "no:cacheprovider", "-o", "timeout=3",
         "-o", "testpaths=.", str(test_file)],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert "1 failed, 1 passed" in out, out
    assert "Timeout" in out and "test_hangs" in out  # the traceback says where it hung
    assert marker.read_text() == "torn down"
