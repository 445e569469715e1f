"""The image build holds every install to the base image's packages.

The Dockerfile freezes the TensorRT-LLM release image's packages, turns the freeze into
constraints with `base_constraints.py` (the file copied into the build context) and
passes them to each install. Here the same script runs on a small base freeze, and pip's
own resolver (offline, against a local folder of tiny wheels) shows the effect: a server
requirement that would move a package TensorRT-LLM pins or caps fails the resolution;
one the base already satisfies keeps the base's version; a package TensorRT-LLM does not
pin may rise (never fall) where the server needs newer (Truss's certifi floor against the
base's older certifi); a Truss server exact pin outside TensorRT-LLM's requirements may
move. The whole base image against the real index: tests/unit/test_image_installs.py and
`make check-image-installs`.
"""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mistral_build import base_constraints, image

# A base image as `pip list --format=freeze` writes it (NGC's local version labels too).
FAKE_BASE_FREEZE = """\
transformers==4.57.3
tokenizers==0.22.1
torch==2.9.0a0+50eac811a6.nv25.12
Cython==3.1.2
certifi==2025.11.12
"""
# What the local index offers: newer versions of each, so a free resolver would move them.
INDEX = {
    "transformers": ["4.57.3", "4.58.0"],
    "tokenizers": ["0.22.1", "0.23.0"],
    "cython": ["3.0.5", "3.1.2"],
    "certifi": ["2024.8.30", "2025.11.12", "2026.10.19"],
}


def make_wheel(folder: Path, name: str, version: str, requires: list[str] = ()) -> None:
    """The smallest wheel pip installs: metadata only."""
    dist = f"{name}-{version}.dist-info"
    files = {
        f"{dist}/METADATA": "Metadata-Version: 2.1\n"
        f"Name: {name}\nVersion: {version}\n" + "".join(f"Requires-Dist: {r}\n" for r in requires),
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    files[f"{dist}/RECORD"] = "".join(f"{p},,\n" for p in files) + f"{dist}/RECORD,,\n"
    with zipfile.ZipFile(folder / f"{name}-{version}-py3-none-any.whl", "w") as z:
        for path, text in files.items():
            z.writestr(path, text)


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("index")
    for name, versions in INDEX.items():
        for v in versions:
            make_wheel(
                folder, name, v, ["tokenizers>=0.22,<=0.23.0"] if name == "transformers" else []
            )
    return folder


@pytest.fixture(scope="module")
def constraints(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What the Dockerfile's freeze step writes, by the script the build context carries."""
    context = image.render_image_context(tmp_path_factory.mktemp("image") / "context")
    work = tmp_path_factory.mktemp("freeze")
    (work / "base-freeze.txt").write_text(FAKE_BASE_FREEZE)
    out = subprocess.run(
        [sys.executable, str(context / image.CONSTRAINTS_SCRIPT), "freeze",
         str(work / "base-freeze.txt"), str(context / image.MAY_MOVE_FILE),
         str(context / image.HOLD_FILE)],
        capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    path = work / "base-constraints.txt"
    path.write_text(out.stdout)
    return path


def resolve(index: Path, constraints: Path, requirements: list[str], tmp: Path):
    """pip's resolver, offline, as the image's install would run it (a dry run)."""
    req = tmp / "requirements.txt"
    req.write_text("\n".join(requirements) + "\n")
    report = tmp / "report.json"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed",
         "--no-index", "--find-links", str(index), "--disable-pip-version-check",
         "--quiet", "--report", str(report), "-r", str(req), "-c", str(constraints)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    chosen = {}
    if proc.returncode == 0:
        for item in json.loads(report.read_text())["install"]:
            chosen[item["metadata"]["name"].lower()] = item["metadata"]["version"]
    return proc, chosen


def test_the_freeze_becomes_constraints_except_what_may_move(constraints: Path) -> None:
    lines = constraints.read_text().splitlines()
    assert "transformers==4.57.3" in lines  # TensorRT-LLM pins it
    assert "tokenizers==0.22.1" in lines  # capped (<=0.23.0)
    assert "torch==2.9.0a0+50eac811a6.nv25.12" in lines  # the torch family
    assert "certifi>=2025.11.12" in lines  # not TensorRT-LLM's: may rise, never fall
    assert not any(ln.lower().startswith("cython") for ln in lines)  # the server pins it


def test_the_truss_servers_certifi_floor_resolves_above_the_bases(
    index: Path, constraints: Path, tmp_path: Path
) -> None:
    # truss 0.18.36's server asks certifi>=2026.10.19; NGC PyTorch 25.12 has an older one.
    floor = next(r for r in image.truss_server_requirements() if r.lower().startswith("certifi"))
    proc, chosen = resolve(index, constraints, [floor], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert chosen["certifi"] == "2026.10.19"
    proc, _ = resolve(index, constraints, ["certifi<2025"], tmp_path)
    assert proc.returncode != 0  # never below the base's version


def test_a_server_requirement_that_moves_a_tensorrt_llm_dependency_fails_the_resolution(
    index: Path, constraints: Path, tmp_path: Path
) -> None:
    proc, _ = resolve(index, constraints, ["transformers>=4.58"], tmp_path)
    assert proc.returncode != 0
    assert "transformers" in proc.stderr and "conflict" in proc.stderr.lower()
    # Without the base constraints the same requirement resolves: the constraints did it.
    free = tmp_path / "none.txt"
    free.write_text("")
    proc, chosen = resolve(index, free, ["transformers>=4.58"], tmp_path)
    assert proc.returncode == 0 and chosen["transformers"] == "4.58.0"


def test_what_the_base_satisfies_keeps_the_bases_version(
    index: Path, constraints: Path, tmp_path: Path
) -> None:
    proc, chosen = resolve(index, constraints, ["transformers>=4.50", "cython==3.0.5"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert chosen == {"transformers": "4.57.3", "tokenizers": "0.22.1", "cython": "3.0.5"}


def test_pip_check_fails_only_on_problems_the_install_added(tmp_path: Path) -> None:
    script = Path(base_constraints.__file__)
    baseline = tmp_path / "base-pip-check.txt"
    baseline.write_text("torch 2.9.0a0 has requirement sympy>=1.13, but you have sympy 1.12.\n")

    def check(stdin: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, str(script), "check", str(baseline)],
            input=stdin, capture_output=True, text=True, timeout=60,
        )  # fmt: skip

    assert check("No broken requirements found.\n").returncode == 0
    assert check(baseline.read_text()).returncode == 0  # the base's own problem
    broken = "tensorrt-llm 1.2.1 has requirement transformers==4.57.3, but you have 4.58.0.\n"
    proc = check(baseline.read_text() + broken)
    assert proc.returncode == 1
    assert proc.stderr.strip() == f"error: the install broke a requirement: {broken.strip()}"


def test_unreadable_freeze_lines_are_refused() -> None:
    with pytest.raises(ValueError, match="not a `name==version`"):
        base_constraints.constraints_from_freeze(["torch @ file:///opt/torch.whl"])
    with pytest.raises(ValueError):
        base_constraints.constraints_from_freeze(["-e git+https://example/x#egg=x"])
    assert base_constraints.constraints_from_freeze(["a_b==1", "", "c.d==2"], may_move=["A-B"]) == [
        "c.d>=2"
    ]


def test_a_version_no_constraint_can_hold_is_named_not_dropped_silently() -> None:
    unheld: list[str] = []
    out = base_constraints.constraints_from_freeze(
        ["good==1.0", "odd==2020-weird", "nv==2.9.0a0+50eac811a6.nv25.12"],
        unheld=unheld,
        hold=["nv"],
    )
    assert out == ["good>=1.0", "nv==2.9.0a0+50eac811a6.nv25.12"]
    assert unheld == ["odd==2020-weird"]


@given(st.from_regex(r"[0-9a-zA-Z.+!_-]{1,16}", fullmatch=True))
def test_the_version_rule_is_packagings(text: str) -> None:
    from packaging.version import InvalidVersion, Version

    try:
        Version(text)
        valid = True
    except InvalidVersion:
        valid = False
    assert base_constraints.is_version(text) == valid, text


@given(st.lists(st.text(max_size=40), max_size=8))
def test_any_freeze_text_gives_constraints_or_one_clear_refusal(lines: list[str]) -> None:
    try:
        out = base_constraints.constraints_from_freeze(lines)
    except ValueError as exc:
        assert str(exc).startswith("not a `name==version` freeze line")
        return
    assert all("==" in c and c == c.strip() and "\n" not in c for c in out)


@given(
    st.from_regex(
        r"v?[0-9]{1,3}(\.[0-9]{1,3}){0,3}((a|b|rc)[0-9])?(\.post[0-9])?(\.dev[0-9])?"
        r"(\+[a-z0-9]{1,5}(\.[a-z0-9]{1,4})?)?",
        fullmatch=True,
    )
)
def test_well_formed_versions_are_held(text: str) -> None:
    from packaging.specifiers import SpecifierSet

    assert base_constraints.is_version(text), text
    assert base_constraints.constraints_from_freeze([f"pkg=={text}"], hold=["pkg"]) == [
        f"pkg=={text}"
    ]
    (floor,) = base_constraints.constraints_from_freeze([f"pkg=={text}"], hold=["other*"])
    assert floor == f"pkg>={text.split('+')[0]}"
    assert SpecifierSet(floor.removeprefix("pkg")).contains(text.split("+")[0], prereleases=True)


@given(st.text(min_size=1, max_size=20), st.lists(st.text(max_size=12), max_size=5))
def test_hold_entries_match_names_and_prefixes_only(name: str, hold: list[str]) -> None:
    name = base_constraints.canonical(name)
    found = base_constraints.held_exactly(name, hold)
    expected = any(
        (c := base_constraints.canonical(h.strip())) == name
        or (c.endswith("*") and name.startswith(c[:-1]))
        for h in hold
    )
    assert found == expected


def test_the_hold_list_is_tensorrt_llms_pins_and_caps_and_the_cuda_family() -> None:
    held = image.held_exactly()
    for name in ("transformers", "numpy", "fastapi", "tokenizers", "xgrammar", "mistral-common"):
        assert name in held
    assert {"torch*", "tensorrt*", "triton*", "nvidia-*", "cuda-*"} <= set(held)
    for name in ("certifi", "pydantic", "uvicorn", "starlette", "requests", "rich"):
        assert not base_constraints.held_exactly(name, held)
