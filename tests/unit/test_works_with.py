"""The README's "Works with" table names each tool at the version the project pins and
installs (the dev extra, or guidellm's own venv's requirements)."""

from __future__ import annotations

import importlib.metadata
import tomllib
from pathlib import Path

from tests.works_with import rows

REPO = Path(__file__).resolve().parents[2]


def test_the_table_names_the_tools_the_tests_run() -> None:
    assert set(rows()) == {"openai SDK", "LangChain", "guidellm"}


def test_dev_venv_tools_are_pinned_and_installed_at_the_readme_version() -> None:
    dev = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for tool in ("openai SDK", "LangChain"):
        row = rows()[tool]
        assert f"{row.package}=={row.version}" in dev["dev"]
        assert importlib.metadata.version(row.package) == row.version


def test_guidellm_is_pinned_in_its_venv_requirements() -> None:
    row = rows()["guidellm"]
    pins = (REPO / "tests/tools/requirements.txt").read_text().splitlines()
    assert f"{row.package}=={row.version}" in pins
