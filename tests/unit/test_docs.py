"""The README tells the truth about the code: every setting and metric is documented."""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client import CollectorRegistry

from mistral_serving.metrics import Metrics
from mistral_serving.settings import ENV_PREFIX, Settings

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def test_every_setting_is_in_the_readme_table_with_its_env_var():
    for name in Settings.model_fields:
        assert re.search(rf"\| `{name}` \| `{ENV_PREFIX}{name.upper()}` \|", README), name


def test_every_metric_is_documented():
    registry = CollectorRegistry()
    Metrics(registry)
    names = {family.name for family in registry.collect()}
    assert names
    for name in names:
        assert name in README, name


def test_the_two_commands_exist():
    makefile = (Path(__file__).resolve().parents[2] / "Makefile").read_text()
    for target in ("serve", "test"):
        assert f"make {target}" in README and re.search(rf"^{target}:", makefile, re.M)


def test_the_served_version_is_the_projects() -> None:
    import tomllib

    from mistral_serving import __version__

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert __version__ == project["version"]  # what GET /version says
