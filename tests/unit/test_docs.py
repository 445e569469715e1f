"""The docs tell the truth about the code: every setting and metric is documented, the
generated reference pages are current, and the README shows the two commands."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from prometheus_client import CollectorRegistry

from mistral_build import reference
from mistral_serving.ops.metrics import Metrics
from mistral_serving.settings import ENV_PREFIX, Settings

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
SETTINGS_DOC = (ROOT / "docs" / "settings.md").read_text()
OBSERVABILITY_DOC = (ROOT / "docs" / "observability.md").read_text()


def test_the_generated_pages_are_current() -> None:
    """docs/settings.md and the package map: `python build.py docs` has been run."""
    for path, text in reference.pages().items():
        assert path.read_text() == text, f"{path} is stale: run `python build.py docs`"


def test_every_setting_is_in_the_settings_page_with_its_variable_and_default() -> None:
    rows = re.findall(r"^\| `(\w+)` \| `(MTT_\w+)` \| ([^|]+) \|", SETTINGS_DOC, flags=re.M)
    assert sorted(name for name, _, _ in rows) == sorted(Settings.model_fields)
    for name, variable, cell in rows:
        assert variable == f"{ENV_PREFIX}{name.upper()}"
        field = Settings.model_fields[name]
        default, shown = field.get_default(call_default_factory=True), cell.strip().strip("`")
        if default in (None, "", {}):
            assert shown == "unset", name
        elif isinstance(default, bool):
            assert shown == str(default).lower(), name
        elif isinstance(default, int | float):
            assert float(shown) == default, name
        else:
            assert shown == default, name


def test_every_setting_says_what_it_does() -> None:
    assert [n for n, f in Settings.model_fields.items() if not f.description] == []


def test_every_metric_is_documented() -> None:
    registry = CollectorRegistry()
    Metrics(registry)
    names = {family.name for family in registry.collect()}
    assert names
    for name in names:
        assert name in OBSERVABILITY_DOC, name


def test_the_two_commands_exist() -> None:
    makefile = (ROOT / "Makefile").read_text()
    for target in ("serve", "test"):
        assert f"make {target}" in README and re.search(rf"^{target}:", makefile, re.M)


def test_the_served_version_is_the_projects() -> None:
    import tomllib

    from mistral_serving import __version__

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert __version__ == project["version"]  # what GET /version says


def test_the_readme_states_no_test_count() -> None:
    """A count of tests drifts with every commit: the README gives none to go stale."""
    text = (ROOT / "README.md").read_text()
    assert not re.findall(r"\b\d[\d,]* (?:tests|passed)\b", text)


def test_build_py_help_says_what_serve_serves() -> None:
    """`make serve` answers with SmolLM2: `build.py serve` alone serves the tiny dev model,
    and both `--help` texts say so (serve's had no description at all)."""
    top = subprocess.run(
        [sys.executable, "build.py", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    line = " ".join(top.stdout.split()).split(" serve ", 1)[1]
    assert line.startswith("Run the real Truss server locally: --artifact, else $MTT_ARTIFACT")
    assert "SmolLM2" in line.split(" image ")[0]
    serve = subprocess.run(
        [sys.executable, "build.py", "serve", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    description = serve.stdout.split("\n\n")[1]
    assert description.startswith("Run the real Truss model server locally"), serve.stdout
    assert "dev model" in description and "SmolLM2" in description
