"""Do the image's installs resolve? Every `uv pip install` of the rendered Dockerfile and
Dockerfile.verify, resolved in order by pip against the package index for the image's
Python (CPython 3.12, manylinux x86_64), on top of the release image's packages.

The release image's packages are a committed freeze (`data/trtllm-<version>-release.freeze`),
reconstructed from published sources (`reconstruct`, below; the file's header names them),
because the image itself (many GB, NVIDIA's registry) is out of reach here. Each install
step is held by the constraints the build makes from that freeze (`base_constraints.py`,
the very script the Dockerfile runs, with the same may-move and hold lists), resolved
with `pip install --dry-run --ignore-installed --only-binary=:all: --python-version 3.12
--platform manylinux...`, and what it chose becomes the installed set of the next step.
Packages of the freeze that the index does not carry (NGC's own builds of torch and
friends) stand in as metadata-only wheels: installed already, their dependencies too.

`python -m mistral_build.image_installs check [--plant REQ]`: exit 0 when every step
resolves; `--plant` adds a requirement to our own install step (a moved TensorRT-LLM pin
such as `transformers>=4.58` must fail). `make check-image-installs` runs it (CI).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from mistral_build import base_constraints, image
from mistral_build.release import BASE_IMAGE_PYTHON_VERSION, TRTLLM_VERSION

FREEZE_FILE = Path(__file__).parent / "data" / f"trtllm-{TRTLLM_VERSION}-release.freeze"
# The image's platform, for pip's resolver (glibc 2.39 on Ubuntu 24.04: these tags and older).
PLATFORMS = (
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "linux_x86_64",
)
MARKERS = {
    "python_version": BASE_IMAGE_PYTHON_VERSION,
    "python_full_version": BASE_IMAGE_PYTHON_VERSION + ".3",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "os_name": "posix",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "extra": "",
}
_FREEZE_LINE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)")


# --- the freeze -----------------------------------------------------------------------


def read_freeze(text: str) -> dict[str, str]:
    """{name: version} of `name==version` lines; comments and blank lines skipped, anything
    else refused (a line we cannot read is a package we would silently drop)."""
    found: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        match = _FREEZE_LINE.fullmatch(line)
        if match is None:
            raise ValueError(f"not a `name==version` line: {raw!r}")
        found[match.group(1)] = match.group(2)
    return found


def write_freeze(packages: dict[str, str]) -> str:
    return "".join(f"{n}=={v}\n" for n, v in sorted(packages.items(), key=lambda kv: kv[0].lower()))


def stub_wheel(folder: Path, name: str, version: str) -> None:
    """A metadata-only wheel: `name` installed at `version`, its dependencies already met."""
    dist = f"{re.sub(r'[-.]+', '_', name)}-{version}.dist-info"
    files = {
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: mistral_build\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    files[f"{dist}/RECORD"] = "".join(f"{p},,\n" for p in files) + f"{dist}/RECORD,,\n"
    wheel = folder / f"{re.sub(r'[-.]+', '_', name)}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for path, text in files.items():
            z.writestr(path, text)


# --- one pip resolution ----------------------------------------------------------------


@dataclass
class Resolution:
    ok: bool
    chosen: dict[str, str] = field(default_factory=dict)  # name -> version
    requires: dict[str, list[str]] = field(default_factory=dict)  # name -> Requires-Dist
    error: str = ""


def pip_resolve(
    requirements: list[str],
    constraints: list[str],
    stubs: Path,
    work: Path,
    extra_args: Iterable[str] = (),
    env: dict[str, str] | None = None,
) -> Resolution:
    """pip's resolver, no install, for the image's Python and platform."""
    req, con, report = work / "requirements.txt", work / "constraints.txt", work / "report.json"
    req.write_text("".join(f"{r}\n" for r in requirements))
    con.write_text("".join(f"{c}\n" for c in constraints))
    report.unlink(missing_ok=True)
    argv = [
        sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed",
        "--only-binary=:all:", "--python-version", BASE_IMAGE_PYTHON_VERSION,
        "--implementation", "cp", *(f"--platform={p}" for p in PLATFORMS),
        "--target", str(work / "target"), "--find-links", str(stubs),
        "--disable-pip-version-check", "--progress-bar", "off", "--report", str(report),
        "-r", str(req), "-c", str(con), *extra_args,
    ]  # fmt: skip
    proc = subprocess.run(
        argv, capture_output=True, text=True, timeout=900, env=env or dict(os.environ)
    )
    if proc.returncode != 0 or not report.is_file():
        return Resolution(False, error=_pip_error(proc.stdout + "\n" + proc.stderr))
    chosen: dict[str, str] = {}
    requires: dict[str, list[str]] = {}
    for item in json.loads(report.read_text())["install"]:
        meta = item["metadata"]
        chosen[meta["name"]] = meta["version"]
        requires[meta["name"]] = list(meta.get("requires_dist") or [])
    return Resolution(True, chosen, requires)


_PIP_PROGRESS = ("Collecting", "Looking in", "Processing", "Downloading", "Using cached",
                 "Obtaining", "INFO:", "Would install", "WARNING: Location", "Requirement already")  # fmt: skip


def _pip_error(text: str) -> str:
    """pip's own lines that say why (its ERROR lines and the conflict explanation)."""
    keep = [
        ln for ln in text.splitlines() if ln.strip() and not ln.strip().startswith(_PIP_PROGRESS)
    ]
    return "\n".join(keep[-25:])


# --- the image's install steps ---------------------------------------------------------


@dataclass
class InstallStep:
    where: str  # the Dockerfile and its line
    requirements: list[str]
    constraints: list[str]  # from the context's files (the base constraints added later)


def _install_args(line: str) -> list[str]:
    command = line[line.index("uv pip install") :].split("&&", 1)[0]
    return shlex.split(command.replace("\\\n", " "))[3:]


def parse_install(line: str, context: Path, where: str) -> InstallStep:
    """One `uv pip install` line: its -r files and requirement arguments, its -c files (the
    base image's constraints, BASE_CONSTRAINTS, are left to the caller). Unknown options
    are refused: the resolution would silently differ from the build's."""
    args = _install_args(line)
    requirements: list[str] = []
    constraints: list[str] = []
    flags_with_value = {"--python", "--index-strategy"}
    i = 0
    while i < len(args):
        arg = args[i]
        if arg in ("-r", "-c", *flags_with_value) and i + 1 == len(args):
            raise ValueError(f"{where}: uv option {arg!r} needs a value")
        if arg in ("-r", "-c"):
            path = args[i + 1]
            if arg == "-c" and path == image.BASE_CONSTRAINTS:
                pass
            else:
                lines = (context / path).read_text().splitlines()
                (requirements if arg == "-r" else constraints).extend(lines)
            i += 2
        elif arg in flags_with_value:
            i += 2
        elif arg in ("--system", "--break-system-packages", "--no-cache-dir"):
            i += 1
        elif arg.startswith("-"):
            raise ValueError(f"{where}: uv option {arg!r} is not understood here")
        else:
            requirements.append(arg)
            i += 1
    return InstallStep(where, _pip_lines(requirements), _pip_lines(constraints))


def _pip_lines(lines: Iterable[str]) -> list[str]:
    """Requirement lines without comments, blanks and `-i` / `--index-url` lines (another
    index: this machine reaches the package index through its own configuration)."""
    out = []
    for raw in lines:
        line = raw.split(" #", 1)[0].split("#", 1)[0].strip() if not raw.startswith("#") else ""
        if line and not line.startswith(("-i", "--index-url", "--extra-index-url")):
            out.append(line)
    return out


def install_steps(context: Path) -> list[InstallStep]:
    steps = []
    for name in ("Dockerfile", image.VERIFY_DOCKERFILE):
        text = (context / name).read_text().replace("\\\n", " ")
        for number, line in enumerate(text.splitlines(), 1):
            if "uv pip install" in line and line.startswith("RUN"):
                steps.append(parse_install(line, context, f"{name}:{number}"))
    return steps


# --- the check -------------------------------------------------------------------------


def base_hold_lists(context: Path) -> tuple[list[str], list[str]]:
    """(may-move, hold) as the build context carries them for base_constraints.py."""

    def names(file: str) -> list[str]:
        return [
            n
            for n in (
                ln.split("#", 1)[0].strip() for ln in (context / file).read_text().splitlines()
            )
            if n
        ]

    return names(image.MAY_MOVE_FILE), names(image.HOLD_FILE)


def check(plant: list[str], hold_all: bool = False) -> int:
    """Resolve every install step on top of the committed freeze; 0 when all resolve.
    `hold_all`: hold every base package at its version (the rule before the build held only
    TensorRT-LLM's pins and caps that way), to show what it did."""
    base = read_freeze(FREEZE_FILE.read_text())
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        context = image.render_image_context(work / "context")
        may_move, hold = base_hold_lists(context)
        hold = ["*"] if hold_all else hold
        steps = install_steps(context)
        stubs = work / "stubs"
        stubs.mkdir()
        for name, version in base.items():
            stub_wheel(stubs, name, version)
        installed = dict(base)
        for n, step in enumerate(steps):
            if n == 1:  # ours (config.yaml requirements) with the server's
                step.requirements += plant
            held = base_constraints.constraints_from_freeze(
                write_freeze(installed).splitlines(), may_move, None, hold
            )
            result = pip_resolve(step.requirements, step.constraints + held, stubs, work)
            if not result.ok:
                print(f"FAIL {step.where}: the install does not resolve:\n{result.error}")
                return 1
            print(f"ok   {step.where}: {len(result.chosen)} packages resolve")
            installed |= result.chosen
    return 0


# --- the reconstruction of the freeze (network; run by hand, output committed) ---------

# NVIDIA's PyTorch 25.12 release notes (docs.nvidia.com/deeplearning/frameworks/
# pytorch-release-notes/rel-25-12.html): released 2025-12-22, PyTorch 2.10.0a0+b4e4ee81d3.
NGC_DATE = "2025-12-22T00:00:00Z"
# tensorrt_llm 1.2.1 on the package index (its sdist's upload time): when the release image
# installed TensorRT-LLM's requirements on top of the NGC base.
TRTLLM_DATE = "2026-04-20T09:20:03Z"
# What public records of the 25.12 image print, installed as they are (NGC's own builds,
# and nvidia-cutlass-dsl 4.3.5, which TensorRT-LLM's constraints.txt for that base names).
NGC_BUILDS = {
    "torch": "2.10.0a0+b4e4ee81d3.nv25.12",
    "transformer_engine": "2.10.0+769ed778",
    "flash_attn": "2.7.4.post1+25.12",
    "torchao": "0.15.0+git01374eb5",
    "nvidia-cutlass-dsl": "4.3.5",
}
# What the NGC base is known to hold, resolved as of NGC_DATE: torch's own requirements
# (filelock, typing-extensions, sympy, networkx, jinja2, fsspec, setuptools), Triton 3.5.1
# (public records of the image), and what TensorRT-LLM's constraints.txt for the 25.12
# base names as inherited from it (numba 0.63.1, and mistune, notebook, jupyter_server
# below their fixed versions).
NGC_BASE = [
    "filelock", "typing-extensions", "sympy", "networkx", "jinja2", "fsspec", "setuptools",
    "triton==3.5.1", "numba==0.63.1", "mistune<3.2.1",
    "notebook<7.5.6", "jupyter_server<2.20.0",
]  # fmt: skip
# Recorded, not resolvable here: the TensorRT release the image is built with.
RECORDED = {"tensorrt": "10.14.1", "tensorrt_llm": TRTLLM_VERSION}


def keep_installed(base: dict[str, str], later: Resolution, top_level: list[str]) -> dict[str, str]:
    """pip installing `later` on top of `base`: a package `base` has at a version every
    requirement on it accepts stays; the others take `later`'s version."""
    wants: dict[str, list[Requirement]] = {}
    for line in top_level + [r for reqs in later.requires.values() for r in reqs]:
        req = Requirement(line)
        if req.marker is None or req.marker.evaluate(MARKERS):
            wants.setdefault(canonicalize_name(req.name), []).append(req)
    merged = {canonicalize_name(n): (n, v) for n, v in base.items()}
    for name, version in later.chosen.items():
        key = canonicalize_name(name)
        if key in merged and _accepts(wants.get(key, []), merged[key][1]):
            continue
        merged[key] = (name, version)
    return dict(merged.values())


def _accepts(reqs: list[Requirement], version: str) -> bool:
    try:
        v = Version(version)
    except InvalidVersion:
        return False
    return all(r.specifier.contains(v, prereleases=True) for r in reqs)


def reconstruct() -> str:
    """The freeze text: the NGC base as of its release, TensorRT-LLM's requirements as of
    its release installed on top (what the base already satisfies stays)."""
    env = dict(os.environ, PIP_CONFIG_FILE=os.devnull)  # the index alone: it has upload times
    with tempfile.TemporaryDirectory() as tmp:
        work, stubs = Path(tmp), Path(tmp) / "stubs"
        stubs.mkdir()
        for name, version in NGC_BUILDS.items():
            stub_wheel(stubs, name, version)
        pinned = [f"{n}=={v}" for n, v in NGC_BUILDS.items()]
        ngc = pip_resolve(
            NGC_BASE + pinned, [], stubs, work, ["--uploaded-prior-to", NGC_DATE], env
        )
        if not ngc.ok:
            raise RuntimeError(f"the NGC base does not resolve:\n{ngc.error}")
        trtllm = [r for r in image.trtllm_requirements() if r and not r.startswith("#")]
        trtllm = [r for r in trtllm if canonicalize_name(Requirement(r).name) != "tensorrt"]
        # NGC's builds stand in as installed (stubs), not as requirements: a pin of
        # TensorRT-LLM's replaces one (nvidia-cutlass-dsl 4.3.4 over 4.3.5).
        later = pip_resolve(trtllm, [], stubs, work, ["--uploaded-prior-to", TRTLLM_DATE], env)
        if not later.ok:
            raise RuntimeError(f"TensorRT-LLM's requirements do not resolve:\n{later.error}")
    packages = keep_installed(ngc.chosen, later, trtllm) | RECORDED
    return FREEZE_HEADER + write_freeze(packages)


FREEZE_HEADER = """\
# The TensorRT-LLM 1.2.1 release image's Python packages (nvcr.io/nvidia/tensorrt-llm/release:
# 1.2.1 on NGC PyTorch 25.12, CPython 3.12), as `pip list --format=freeze` would print them,
# reconstructed from published sources by `python -m mistral_build.image_installs
# reconstruct` (the image itself is out of reach here). Do not edit: regenerate.
# - NGC PyTorch 25.12 release notes (docs.nvidia.com/deeplearning/frameworks/
#   pytorch-release-notes/rel-25-12.html, 2025-12-22): torch 2.10.0a0+b4e4ee81d3;
# - public records of that image printing its versions: torch ...nv25.12, Triton 3.5.1,
#   Transformer Engine 2.10.0+769ed778, FlashAttention 2.7.4.post1+25.12, TorchAO
#   0.15.0+git01374eb5, Python 3.12.3;
# - NVIDIA/TensorRT-LLM constraints.txt (commit 051b661a) on what the pytorch:25.12-py3 base
#   holds: numba 0.63.1, nvidia-cutlass-dsl 4.3.5, mistune < 3.2.1, notebook < 7.5.6,
#   jupyter_server < 2.20.0;
# - torch's own requirements, and the above, resolved against the package index for CPython
#   3.12 manylinux x86_64 as of 2025-12-22 (pip --uploaded-prior-to): the base;
# - TensorRT-LLM 1.2.1's requirements (data/trtllm-1.2.1-requirements.txt, which names its
#   sources) resolved the same way as of 2026-04-20 (tensorrt_llm 1.2.1's upload to the
#   index), installed on top of the base: a base version every requirement accepts stays;
# - recorded, not on the index: tensorrt 10.14.1 (the release's TensorRT), tensorrt_llm.
# Not known, so not here: the rest of the NGC image (Jupyter's other packages, DALI, ...).
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mistral_build.image_installs")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("check", help="Resolve the image's installs (network: the index).")
    p.add_argument("--plant", action="append", default=[], metavar="REQ")
    sub.add_parser("reconstruct", help=f"Rewrite {FREEZE_FILE.name} (network: the index).")
    args = parser.parse_args(argv)
    if args.command == "reconstruct":
        FREEZE_FILE.write_text(reconstruct())
        print(f"wrote {FREEZE_FILE}")
        return 0
    return check(args.plant)


if __name__ == "__main__":
    sys.exit(main())
