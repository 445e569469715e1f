"""The offline parts of the image-install check (mistral_build/image_installs.py): the
committed freeze of the release image's packages, the install steps read from the rendered
Dockerfiles, and how an install on top of installed packages keeps what they satisfy. The
resolution against the package index: tests/network/ (`make check-image-installs`)."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from packaging.specifiers import SpecifierSet

from mistral_build import image, image_installs
from mistral_build.image_installs import (
    FREEZE_FILE,
    Resolution,
    install_steps,
    keep_installed,
    parse_install,
    read_freeze,
    stub_wheel,
)


@pytest.fixture(scope="module")
def context(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return image.render_image_context(tmp_path_factory.mktemp("image") / "context")


def test_the_committed_freeze_is_the_release_image_and_names_its_sources():
    text = FREEZE_FILE.read_text()
    freeze = read_freeze(text)
    assert freeze["tensorrt_llm"] == image.TRTLLM_VERSION
    assert freeze["torch"].endswith(".nv25.12")  # NGC PyTorch 25.12's own build
    assert freeze["transformers"] == "4.57.3"  # TensorRT-LLM 1.2.1's pin
    header = [ln for ln in text.splitlines() if ln.startswith("#")]
    for source in ("rel-25-12", "051b661a", "trtllm-1.2.1-requirements.txt", "--uploaded-prior-to"):
        assert any(source in ln for ln in header), source
    # Why the build's constraints must let it rise: the Truss server asks a newer certifi.
    floor = next(r for r in image.truss_server_requirements() if r.startswith("certifi"))
    assert not SpecifierSet(floor.removeprefix("certifi")).contains(freeze["certifi"])


@given(st.text(max_size=200))
def test_any_freeze_text_is_read_or_refused_with_its_line(text: str):
    try:
        found = read_freeze(text)
    except ValueError as exc:
        assert str(exc).startswith("not a `name==version` line")
        return
    assert all(name and version and "=" not in version for name, version in found.items())


def test_the_install_steps_are_the_dockerfiles_with_their_files(context: Path):
    steps = install_steps(context)
    assert [s.where.split(":")[0] for s in steps] == ["Dockerfile", "Dockerfile"]
    server, ours = steps
    assert "certifi>=2026.10.19" in server.requirements
    assert not [r for r in server.requirements + ours.requirements if r.startswith("-")]
    assert "xgrammar>=0.1.21" in ours.requirements  # config.yaml's requirements
    assert any(c.startswith("fastapi") for c in ours.constraints)  # the server's constraints.txt
    assert not [c for c in ours.constraints if image.BASE_CONSTRAINTS in c]


def test_an_install_option_the_check_does_not_know_is_refused(context: Path):
    line = "RUN uv pip install --system --upgrade -r requirements.txt"
    with pytest.raises(ValueError, match="'--upgrade' is not understood"):
        parse_install(line, context, "Dockerfile:1")


def test_installing_on_top_keeps_what_the_base_satisfies():
    base = {"certifi": "2025.11.12", "numpy": "2.3.5", "rich": "15.0.0"}
    later = Resolution(
        True,
        chosen={"certifi": "2026.4.22", "numpy": "1.26.4", "tensorrt_llm": "1.2.1"},
        requires={
            "tensorrt_llm": ["numpy<2", "certifi", "rich; extra == 'cli'"],
            "certifi": [],
            "numpy": [],
        },
    )
    merged = keep_installed(base, later, ["tensorrt_llm==1.2.1"])
    assert merged == {
        "certifi": "2025.11.12",  # any certifi will do: the installed one stays
        "numpy": "1.26.4",  # numpy<2 moves it down
        "rich": "15.0.0",  # only an extra asks for it
        "tensorrt_llm": "1.2.1",
    }


def test_a_stub_wheel_is_metadata_only(tmp_path: Path):
    stub_wheel(tmp_path, "torch", "2.10.0a0+b4e4ee81d3.nv25.12")
    (wheel,) = tmp_path.glob("*.whl")
    assert wheel.name == "torch-2.10.0a0+b4e4ee81d3.nv25.12-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        meta = z.read(next(n for n in names if n.endswith("METADATA"))).decode()
    assert "Version: 2.10.0a0+b4e4ee81d3.nv25.12" in meta and "Requires-Dist" not in meta
    assert all(n.split("/")[0].endswith(".dist-info") for n in names)


def test_the_check_is_a_make_target_ci_runs():
    root = Path(image_installs.__file__).resolve().parents[1]
    makefile = (root / "Makefile").read_text()
    assert "check-image-installs:" in makefile and "tests/network" in makefile
    assert "make check-image-installs" in (root / ".ci" / "run").read_text()


@given(st.lists(st.from_regex(r"-{0,2}[a-z=.<>0-9_-]{1,12}", fullmatch=True), max_size=6))
def test_any_install_line_is_read_or_refused_by_name(tokens: list[str]):
    context = Path(__file__).parent  # no -r/-c files are read: those tokens are filtered
    tokens = [t for t in tokens if t not in ("-r", "-c")]
    line = "RUN uv pip install " + " ".join(tokens)
    try:
        step = parse_install(line, context, "Dockerfile:1")
    except ValueError as exc:
        assert "is not understood here" in str(exc) or "needs a value" in str(exc)
        return
    assert all(not r.startswith("-") for r in step.requirements)
