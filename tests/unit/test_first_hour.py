"""What a newcomer runs first does what the README says: a dry run needs no network,
`make serve` honours (or refuses) settings from the environment, the dev server binds
loopback."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from mistral_build import local_server

ROOT = Path(__file__).resolve().parents[2]


class CountingListener:
    """A loopback TCP listener that counts connections (a stand-in Hub that never answers)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.accepted = 0
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self.sock.close()


def test_engine_dry_run_never_contacts_the_hub() -> None:
    hub = CountingListener()
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith("HF_HUB_OFFLINE")}
        run = subprocess.run(
            [sys.executable, "build.py", "engine", "--dry-run"],
            cwd=ROOT,
            env=env | {"HF_ENDPOINT": hub.url, "HF_HOME": str(ROOT / ".cache" / "no-hub-home")},
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        hub.close()
    assert run.returncode == 0, run.stderr
    assert "trtllm-build" in run.stdout
    assert hub.accepted == 0


def test_build_py_serve_refuses_environment_settings_it_would_override(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("MTT_ENGINE", "trtllm_pytorch")
    problem = local_server.environment_conflicts({"engine": "pytorch", "device": "cpu"})
    assert problem is not None and "MTT_ENGINE=trtllm_pytorch" in problem
    assert "MTT_ARTIFACT" in problem  # says how to serve another artifact
    monkeypatch.setenv("MTT_ENGINE", "pytorch")
    assert local_server.environment_conflicts({"engine": "pytorch"}) is None


def test_make_serve_takes_the_artifact_from_the_environment() -> None:
    """`MTT_ARTIFACT=... make serve` serves that artifact: make passes no dev-model arguments."""
    run = subprocess.run(
        ["make", "-n", "serve"],
        cwd=ROOT,
        env=os.environ | {"MTT_ARTIFACT": "/models/x", "MTT_ENGINE": "trtllm_pytorch"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    line = next(ln for ln in run.stdout.splitlines() if "build.py serve" in ln)
    assert "--artifact" not in line and "engine=" not in line and "smollm2" not in line


def test_the_dev_server_binds_loopback_by_default() -> None:
    assert local_server.serve_settings(None, host=None)["host"] == "127.0.0.1"
    assert local_server.serve_settings(None, host="0.0.0.0")["host"] == "0.0.0.0"


def run_build_py(args: list[str], env: dict[str, str], timeout: float = 300) -> tuple[int, str]:
    """`python build.py ARGS` in its own process group (all of it is killed past `timeout`:
    a command that should have refused at once may be serving instead)."""
    proc = subprocess.Popen(
        [sys.executable, "build.py", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"build.py {' '.join(args)} still running after {timeout} s:\n{out[-2000:]}")
    return proc.returncode, out


def environ_without_settings() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("MTT_")}


@pytest.mark.parametrize(
    ("args", "env", "line"),
    [
        (
            ["--set", "bogus_key=1"],
            {},
            "cannot serve: --set bogus_key is not a setting (every setting: docs/settings.md)",
        ),
        (
            ["--set", "max_inflite=3"],
            {},
            "cannot serve: --set max_inflite is not a setting (did you mean max_inflight?)",
        ),
        (
            [],
            {"MTT_MAX_INFLITE": "3"},
            "cannot serve: MTT_MAX_INFLITE is not a setting (did you mean MTT_MAX_INFLIGHT?)",
        ),
        (
            ["--set", "max_inflight=zero"],
            {},
            "cannot serve: invalid settings: max_inflight: Input should be a valid integer, "
            "unable to parse string as an integer",
        ),
        (
            ["--set", "max_inflight"],
            {},
            "cannot serve: --set expects KEY=VALUE, got 'max_inflight'",
        ),
    ],
)
def test_build_py_serve_refuses_what_the_server_would_not_take_before_building(
    args: list[str], env: dict[str, str], line: str
) -> None:
    """A typo in a setting's name was served without a word: `build.py serve` (and so
    `make serve`) refuses it, as the server itself does, in one line and at once."""
    port = local_server.free_port()
    rc, out = run_build_py(["serve", "--port", str(port), *args], environ_without_settings() | env)
    assert rc == 2, out
    assert out.strip() == line
