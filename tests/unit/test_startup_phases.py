"""GenerationService.start times each phase of its start and keeps the figures: the
process's own part before load() (interpreter, imports, server), the artifact's fetch and
verification, the tokenizer and the engine."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mistral_serving.generation.service import GenerationService
from mistral_serving.ops import startup
from mistral_serving.settings import Settings


def test_start_records_each_phase(dev_model: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO")
    service = GenerationService.start(Settings(artifact=str(dev_model), engine="pytorch"), None)
    try:
        phases = service.startup
        assert set(phases) == {
            "process",
            "artifact",
            "artifact_fetch",
            "artifact_verify",
            "tokenizer",
            "engine",
        }
        assert all(seconds >= 0 for seconds in phases.values())
        # The artifact's figure is its fetch and its verification together.
        parts = phases["artifact_fetch"] + phases["artifact_verify"]
        assert abs(phases["artifact"] - parts) <= 0.002  # each figure is rounded to 1 ms
        assert phases["process"] > 0  # this test process did start before load()
        logged = caplog.text
        for phase in ("process", "artifact", "tokenizer", "engine start"):
            assert f"startup phase {phase}" in logged
        assert "(fetch " in logged and ", verify " in logged
    finally:
        service.shutdown()


def test_a_younger_process_is_younger() -> None:
    """The age is this process's: a child started now is not older than us."""
    ours = startup.process_age_seconds()
    code = "from mistral_serving.ops import startup; print(startup.process_age_seconds())"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    child = float(out.stdout)
    assert ours is not None and 0 <= child <= startup.process_age_seconds()  # type: ignore[operator]


def test_the_stat_line_is_read_after_the_command_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The command name may hold spaces and ')': fields are counted after the last ')'."""
    ticks = os.sysconf("SC_CLK_TCK")
    rest = ["S"] + ["0"] * 18 + [str(50 * ticks)] + ["0"] * 30  # starttime: 50 s after boot
    stat = tmp_path / "stat"
    stat.write_text(f"123 (evil) (name 1 2 3) {' '.join(rest)}\n")
    uptime = tmp_path / "uptime"
    uptime.write_text("80.25 100.00\n")
    monkeypatch.setattr(startup, "PROC_STAT", stat)
    monkeypatch.setattr(startup, "PROC_UPTIME", uptime)
    assert startup.process_age_seconds() == 30.25
    uptime.write_text("garbage\n")
    assert startup.process_age_seconds() is None
    monkeypatch.setattr(startup, "PROC_STAT", tmp_path / "absent")
    assert startup.process_age_seconds() is None


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200), st.text(max_size=40))
def test_any_proc_text_gives_an_age_or_none_never_an_error(stat: str, uptime: str) -> None:
    folder = Path(os.environ.get("TMPDIR", "/tmp")) / f"proc-fuzz-{os.getpid()}"
    folder.mkdir(exist_ok=True)
    (folder / "stat").write_text(stat, errors="surrogateescape")
    (folder / "uptime").write_text(uptime, errors="surrogateescape")
    old = startup.PROC_STAT, startup.PROC_UPTIME
    startup.PROC_STAT, startup.PROC_UPTIME = folder / "stat", folder / "uptime"
    try:
        age = startup.process_age_seconds()
        assert age is None or age >= 0
    finally:
        startup.PROC_STAT, startup.PROC_UPTIME = old
