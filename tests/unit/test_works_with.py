"""The README's "Works with" table names each tool at the version the project pins and
installs (the dev extra, or guidellm's own venv's requirements)."""

from __future__ import annotations

import importlib.metadata
import tomllib
from pathlib import Path

from tests.works_with import rows, runners

REPO = Path(__file__).resolve().parents[2]


def test_every_row_of_the_table_is_run_by_a_test_and_no_test_runs_another() -> None:
    table = rows()
    assert table, "the README's Works with table did not parse"
    assert set(runners()) == set(table)


def test_each_tool_is_pinned_at_the_readme_version_in_the_venv_its_test_runs_in() -> None:
    """tests/tools and tests/agents run in their own venvs (their requirements.txt); the
    others in the dev venv (the dev extra, installed here)."""
    dev = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    own_venvs = ("tools", "agents")  # tests/<name>/requirements.txt: each its own venv
    for tool, files in runners().items():
        row = rows()[tool]
        pin = f"{row.package}=={row.version}"
        folders = {path.parent.name for path in files}
        if len(folders) == 1 and folders <= set(own_venvs):
            (folder,) = folders
            pins = (REPO / "tests" / folder / "requirements.txt").read_text().splitlines()
            assert pin in pins, tool
        else:
            assert pin in dev["dev"], tool
            assert importlib.metadata.version(row.package) == row.version, tool


def test_runners_are_found_in_any_test_file(tmp_path: Path) -> None:
    (tmp_path / "e2e").mkdir()
    (tmp_path / "unit").mkdir()
    (tmp_path / "e2e" / "test_x.py").write_text('row = rows()["tool a"]\nrows()[name]\n')
    (tmp_path / "unit" / "test_y.py").write_text('rows()["tool b"]\n')
    assert runners(tmp_path) == {"tool a": {tmp_path / "e2e" / "test_x.py"}}
