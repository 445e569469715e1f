"""The README tells the truth about the code: every setting and metric is documented."""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client import CollectorRegistry

from mistral_serving.ops.metrics import Metrics
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


def test_the_readme_settings_table_states_each_default() -> None:
    rows = re.findall(r"^\| `(\w+)` \| `MTT_\w+` \| ([^|]+) \|", README, flags=re.M)
    assert {name for name, _ in rows} == set(Settings.model_fields)
    for name, cell in rows:
        default, shown = Settings.model_fields[name].default, cell.strip().strip("`")
        if default in (None, ""):
            assert shown in ("—", "unset", "engine's"), name
        elif isinstance(default, bool):
            assert shown == str(default).lower(), name
        elif isinstance(default, int | float):
            assert float(shown) == default, name
        else:
            assert shown == default, name
