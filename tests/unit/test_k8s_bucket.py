"""`build.py copy-to-bucket`: verifies the artifact before anything is copied, copies every
file but the build manifest with a resumable rsync, the manifest last, and prints the pin
(--dry-run prints the exact commands); a broken artifact or a bucket root is refused in one
line; a failed step stops before the manifest; the flags exist in the installed gcloud."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mistral_build.cli import main as build_main
from mistral_build.k8s_bucket import CopyError, copy_commands, parse_destination

DEST = "gs://example-llm-artifacts/mistral/a100-tp1"


def pin_of(path: Path) -> str:
    return hashlib.sha256((path / "build_manifest.json").read_bytes()).hexdigest()


def test_dry_run_prints_the_commands_and_the_pin(
    dev_model: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")  # nothing may run
    code = build_main(["copy-to-bucket", "--artifact-dir", str(dev_model), "--to", DEST,
                       "--dry-run"])  # fmt: skip
    assert code == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1] == (
        f"gcloud storage rsync --recursive '--exclude=^build_manifest\\.json$' {dev_model} {DEST}"
    )
    assert lines[2] == (
        f"gcloud storage cp {dev_model}/build_manifest.json {DEST}/build_manifest.json"
    )
    assert "  gcsfuse: {bucket: example-llm-artifacts, path: mistral/a100-tp1}" in lines
    assert f"  artifact_manifest_sha256: {pin_of(dev_model)}" in lines


def test_the_rsync_excludes_exactly_the_manifest(dev_model: Path) -> None:
    rsync, cp = copy_commands(dev_model, DEST + "/")
    (exclude,) = [a for a in rsync if a.startswith("--exclude=")]
    pattern = re.compile(exclude.removeprefix("--exclude="))
    names = [p.name for p in dev_model.iterdir()]
    assert [n for n in names if pattern.search(n)] == ["build_manifest.json"]
    assert not pattern.search("x_build_manifest.json") and not pattern.search("build_manifestXjson")
    assert cp[-1] == DEST + "/build_manifest.json"  # the trailing slash is not doubled


@pytest.mark.parametrize(
    "dest", ["gs://bucket", "gs://bucket/", "s3://b/p", "gs://B/p", "gs://b/../p", "/tmp/x"]
)
def test_a_destination_that_is_not_a_bucket_folder_is_refused(
    dest: str, dev_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert build_main(["copy-to-bucket", "--artifact-dir", str(dev_model), "--to", dest]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "gs://BUCKET/FOLDER" in err


def test_a_broken_artifact_never_reaches_the_bucket(
    dev_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    art = shutil.copytree(dev_model, tmp_path / "art")
    weights = art / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    assert build_main(["copy-to-bucket", "--artifact-dir", str(art), "--to", DEST]) == 2
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and "model.safetensors" in captured.err
    assert "gcloud" not in captured.out


def fake_gcloud(tmp_path: Path, fail_on: str | None = None) -> Path:
    """A `gcloud` that records its arguments (and fails on one subcommand if asked)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "gcloud"
    fail = f'[ "$2" = "{fail_on}" ] && exit 1\n' if fail_on else ""
    script.write_text(f'#!/bin/sh\necho "$@" >> {tmp_path}/calls\n{fail}exit 0\n')
    script.chmod(0o755)
    return bin_dir


def test_the_manifest_is_copied_after_everything_else(
    dev_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", f"{fake_gcloud(tmp_path)}{os.pathsep}{os.environ['PATH']}")
    assert build_main(["copy-to-bucket", "--artifact-dir", str(dev_model), "--to", DEST]) == 0
    calls = (tmp_path / "calls").read_text().splitlines()
    assert [c.split()[1] for c in calls] == ["rsync", "cp"]


def test_a_failed_rsync_stops_before_the_manifest(
    dev_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    monkeypatch.setenv("PATH", f"{fake_gcloud(tmp_path, 'rsync')}{os.pathsep}{os.environ['PATH']}")
    assert build_main(["copy-to-bucket", "--artifact-dir", str(dev_model), "--to", DEST]) == 1
    assert [c.split()[1] for c in (tmp_path / "calls").read_text().splitlines()] == ["rsync"]
    assert "run the same command again to resume" in capsys.readouterr().err


def test_without_gcloud_the_commands_are_printed_and_it_says_so(
    dev_model: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    assert build_main(["copy-to-bucket", "--artifact-dir", str(dev_model), "--to", DEST]) == 2
    captured = capsys.readouterr()
    assert "gcloud storage rsync" in captured.out and "gcloud is not on PATH" in captured.err


def test_parse_destination() -> None:
    assert parse_destination("gs://b-1/a/b/") == ("b-1", "a/b")


@pytest.mark.skipif(shutil.which("gcloud") is None, reason="no gcloud here")
def test_the_flags_exist_in_the_installed_gcloud() -> None:
    help_text = subprocess.run(
        ["gcloud", "storage", "rsync", "--help"], capture_output=True, text=True, check=False
    ).stdout
    plain = re.sub(r"\x1b\[[0-9;]*m", "", help_text)
    assert "--recursive" in plain and "--exclude=[REGEX,...]" in plain


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(
        st.text(max_size=120),
        st.from_regex(r"gs://[a-z0-9._-]{1,30}(/[A-Za-z0-9._-]{0,20}){0,4}/?"),
    )
)
def test_any_destination_parses_or_is_refused_in_one_line(value: str) -> None:
    try:
        bucket, path = parse_destination(value)
    except CopyError as exc:
        assert "\n" not in str(exc)
        return
    assert value.startswith(f"gs://{bucket}/{path}") and ".." not in path.split("/")
