"""The Truss server's requirements, ours and TensorRT-LLM 1.2.1's pins must not conflict
(resolved offline with `packaging`), and the transformers-4.57.3 test venv (`make
test-compat`) must pin what the image really runs."""

from __future__ import annotations

import re

import pytest
from packaging.utils import canonicalize_name

from mistral_build import image
from mistral_build.paths import REPO_ROOT


def test_the_images_requirement_sources_do_not_conflict() -> None:
    sources = image.requirement_sources()
    assert len(sources) == 5 and all(sources.values())
    assert image.check_requirements() == []


def test_sources_hold_what_they_claim() -> None:
    sources = image.requirement_sources()
    names = {
        src: {r.name.lower().replace("_", "-") for r in image.parse_requirements(lines)}
        for src, lines in sources.items()
    }
    assert {"fastapi", "numpy", "uvicorn"} <= names["truss server requirements.txt"]
    assert {"sentencepiece", "pydantic"} <= names["config.yaml requirements"]
    assert "transformers" in names["pyproject.toml dependencies"]
    pins = {str(r) for r in image.parse_requirements(image.TRTLLM_PINS)}
    assert {"transformers==4.57.3", "numpy<2", "fastapi<=0.121.3,>=0.120.1"} <= pins


@pytest.mark.parametrize(
    "ours,package",
    [
        ("transformers>=5", "transformers"),
        ("fastapi>=0.122", "fastapi"),
        ("numpy>=2", "numpy"),
        ("huggingface_hub>=1.0", "huggingface-hub"),
        ("mistral-common>=1.9", "mistral-common"),
        ("pydantic<2.9", "pydantic"),
    ],
)
def test_a_conflicting_requirement_is_found(ours: str, package: str) -> None:
    sources = image.requirement_sources()
    sources["config.yaml requirements"] = [*sources["config.yaml requirements"], ours]
    conflicts = image.find_conflicts(sources)
    assert [c.package for c in conflicts] == [package]
    assert ours.split(">")[0].split("<")[0].replace("_", "-") in str(conflicts[0]).replace("_", "-")


def test_resolution_rules() -> None:
    assert image.find_conflicts({"a": ["x<2"], "b": ["x<3"]}) == []
    assert image.find_conflicts({"a": ["x>=1,<2"], "b": ["x>=1.5"]}) == []
    assert image.find_conflicts({"a": ["x~=1.4"], "b": ["x<1.4"]}) != []
    assert image.find_conflicts({"a": ["x==1.0"], "b": ["x!=1.0"]}) != []
    # Markers are evaluated for the image's Python (3.12).
    assert image.find_conflicts({"a": ["x<2"], "b": ["x>=2; python_version < '3.11'"]}) == []
    assert image.find_conflicts({"a": ["x<2"], "b": ["x>=2; python_version >= '3.12'"]}) != []
    # Index options, comments and blank lines are not requirements.
    assert [
        str(r)
        for r in image.parse_requirements(
            ["-i https://pypi.org/simple", "", "# c", "msgpack==1.1.0  # note"]
        )
    ] == ["msgpack==1.1.0"]


def compat_pins() -> list[str]:
    makefile = (REPO_ROOT / "Makefile").read_text().replace("\\\n", " ")
    match = re.search(r"^COMPAT_PINS\s*:=\s*(.+)$", makefile, re.M)
    assert match, "Makefile has no COMPAT_PINS"
    return [p.strip('"') for p in match.group(1).split()]


def test_compat_venv_runs_on_the_images_pins() -> None:
    """`make test-compat` installs COMPAT_PINS under the image's pins as constraints."""
    constraints = image.compat_constraints()
    assert "transformers==4.57.3" in constraints and "mistral-common==1.8.6" in constraints
    assert set(constraints) == set(image.TRTLLM_PINS) - {
        p
        for p in image.TRTLLM_PINS
        if image.parse_requirements([p])[0].name in image.COMPAT_DEVIATIONS
    }
    pins = compat_pins()
    assert image.find_conflicts({"Makefile COMPAT_PINS": pins, "constraints": constraints}) == []
    # Where the image pins a version exactly, the Makefile names the package only: one source.
    exact = {
        canonicalize_name(r.name)
        for r in image.parse_requirements(constraints)
        if str(r.specifier).startswith("==")
    }
    for r in image.parse_requirements(pins):
        if canonicalize_name(r.name) in exact:
            assert not str(r.specifier), f"{r.name} is pinned by the image already"
    # A deviation is a package the Makefile really pins apart, with its reason.
    for name, reason in image.COMPAT_DEVIATIONS.items():
        assert reason and name in {
            canonicalize_name(r.name) for r in image.parse_requirements(pins)
        }
        assert image.find_conflicts({"Makefile": pins, "image": list(image.TRTLLM_PINS)}) != []


def test_make_reads_the_constraints_from_image_py() -> None:
    makefile = (REPO_ROOT / "Makefile").read_text()
    assert "from mistral_build.image import compat_constraints" in makefile
    assert "-c $(COMPAT_CONSTRAINTS)" in makefile


def test_ci_runs_the_compat_tests_after_make_test() -> None:
    ci = (REPO_ROOT / ".ci" / "run").read_text()
    assert ci.index("make test\n") < ci.index("make test-compat")
    makefile = (REPO_ROOT / "Makefile").read_text()
    assert re.search(r"^test-compat:", makefile, re.M)
    assert compat_test_globs(makefile) == SERVING_TESTS


# The serving unit tests `make test-compat` runs under the image's pins.
SERVING_TESTS = {
    "tests/unit/test_tokenizer*.py",
    "tests/unit/test_chat*.py",
    "tests/unit/test_detokenizer*.py",
    "tests/unit/test_streaming*.py",
    "tests/unit/test_server.py",
    "tests/unit/test_frontend*.py",
    "tests/unit/test_protocol_*.py",
    "tests/unit/test_artifacts*.py",
}
PY312 = REPO_ROOT / "bench" / "run_compat_py312.sh"
WHEELS = sorted((REPO_ROOT / "bench" / "compat_py312").glob("wheels-*.txt"))


def compat_test_globs(makefile: str) -> set[str]:
    match = re.search(r"^COMPAT_TESTS = \$\(wildcard (.+?)\)$", makefile.replace("\\\n", " "), re.M)
    assert match, "Makefile has no COMPAT_TESTS"
    return set(match.group(1).split())


def test_the_py312_script_runs_the_same_tests() -> None:
    script = PY312.read_text()
    match = re.search(r"^COMPAT_TESTS=\((.+?)\)$", script, re.M | re.S)
    assert match, "run_compat_py312.sh has no COMPAT_TESTS"
    assert set(match.group(1).split()) == SERVING_TESTS


def test_the_py312_wheels_are_the_compat_pins() -> None:
    """What the GPU machine installs: one exact version per package, the image's exact
    pins and the Makefile's, less torch (the machine's own)."""
    carried = {}
    for path in WHEELS:
        for r in image.parse_requirements(path.read_text().splitlines()):
            assert str(r.specifier).startswith("=="), f"{path.name}: {r} is not exact"
            assert canonicalize_name(r.name) not in carried, f"{r.name} twice"
            carried[canonicalize_name(r.name)] = str(r.specifier)[2:]
    assert len(WHEELS) == 2 and "torch" not in carried
    pinned = image.parse_requirements(image.compat_constraints() + compat_pins())
    for r in pinned:
        name = canonicalize_name(r.name)
        if name in carried:
            assert r.specifier.contains(carried[name]), f"{name} {carried[name]} vs {r}"
    for name in ("transformers", "mistral-common", "xgrammar", "fastapi", "numpy", "starlette"):
        assert name in carried
