"""docs/deploy.md's fleet guide: every `gcloud` command it shows names a command group and
flags the installed Google Cloud CLI has (none can run here: no project), the GCS FUSE
values it shows are the rendered ones, and the cold-start table names each phase the
server reports in /version."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from functools import cache

import pytest

from mistral_build import k8s_weights
from mistral_build.deploy_settings import load_deploy_settings
from mistral_build.paths import K8S_DIR
from tests.doc_commands import ROOT, shell_commands

DEPLOY = ROOT / "docs" / "deploy.md"


def gcloud_commands() -> list[list[str]]:
    return [shlex.split(c) for c in shell_commands(DEPLOY) if c.startswith("gcloud ")]


@cache
def gcloud_help(group: tuple[str, ...]) -> str | None:
    out = subprocess.run(
        ["gcloud", *group, "--help"], capture_output=True, text=True, check=False, timeout=120
    )
    return re.sub(r"\x1b\[[0-9;]*m", "", out.stdout) if out.returncode == 0 else None


def test_the_guide_shows_the_gcloud_steps() -> None:
    groups = {" ".join(c[1:4]) for c in gcloud_commands()}
    assert {"container clusters create", "container node-pools create"} <= groups
    assert "storage buckets add-iam-policy-binding" in groups


@pytest.mark.skipif(shutil.which("gcloud") is None, reason="no gcloud here")
@pytest.mark.parametrize("argv", gcloud_commands(), ids=lambda a: " ".join(a[1:4]))
def test_each_gcloud_command_exists_with_its_flags(argv: list[str]) -> None:
    words = [w for w in argv[1:5] if re.fullmatch(r"[a-z][a-z0-9-]*", w)]
    for depth in range(len(words), 0, -1):  # the longest prefix that is a command
        help_text = gcloud_help(tuple(words[:depth]))
        if help_text is not None and depth >= 2:
            break
    else:
        pytest.fail(f"no gcloud command group in {argv[:5]}")
    flags = {a.split("=", 1)[0] for a in argv if a.startswith("--")}
    missing = [f for f in sorted(flags) if not re.search(re.escape(f) + r"\b", help_text)]
    assert missing == [], f"{' '.join(words[:depth])}: {missing}"


def test_the_cold_start_table_names_every_reported_phase() -> None:
    text = DEPLOY.read_text()
    section = text[text.index("## Cold start, phase by phase") :]
    section = section[: section.index("\n## ", 1)]
    for phase in ("process", "artifact_fetch", "artifact_verify", "engine"):
        assert f"`{phase}`" in section or f"startup_seconds.{phase}" in section, phase


def test_the_gcsfuse_example_in_the_guide_renders_what_the_guide_says() -> None:
    s = load_deploy_settings(K8S_DIR / "values-gcsfuse.yaml.example")
    text = DEPLOY.read_text()
    options = k8s_weights.gcsfuse_mount_options(s).split(",")
    for option in ("implicit-dirs", "file-cache:enable-parallel-downloads:true"):
        assert option in options and f"`{option}`" in text
    assert f"`{k8s_weights.GCSFUSE_CACHE_VOLUME}`" in text
    assert '`gke-gcsfuse/volumes: "true"`' in text
    assert k8s_weights.service_account_name(s) in text
