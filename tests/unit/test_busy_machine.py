"""The suite on a busy 2-core CI machine: pyproject's pytest settings give every test a
time limit (pytest-timeout) past which that test fails with a traceback, its teardown
runs (the servers it started are killed) and the run goes on to the next test; property
tests have no per-example deadline (tests/conftest.py's hypothesis profile)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import settings as hyp_settings
from hypothesis import strategies as st
from hypothesis.configuration import storage_directory

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


@given(st.integers())
@hyp_settings(max_examples=3)
def test_a_slow_example_is_not_a_deadline_failure(n: int) -> None:
    # Slower than hypothesis' default 200 ms deadline, as a descheduled test can be.
    time.sleep(0.3)


def test_property_tests_write_nothing_into_the_checkout() -> None:
    assert hyp_settings.default.database is None
    cache = storage_directory("constants", intent_to_write=False).path.resolve()
    assert not cache.is_relative_to(ROOT), cache
