"""`python build.py image`: the serving image.

1. Checks that what the image installs cannot conflict: the Truss server's requirements
   and constraints (from the installed truss package), ours (config.yaml `requirements`
   and pyproject's dependencies) and what the TensorRT-LLM release base image pins.
2. Renders the Docker build context with truss's own code (`render_build_context`) from
   a copy of the Truss whose config.yaml carries these deploy settings, with the non-root
   `app` user (uid 60000) that the Truss Dockerfile template creates when
   `BT_USE_NON_ROOT_USER` is set, and our launcher (`python3 -m mistral_serving.http.server`,
   the real Truss server plus our routes) as the container's entry point.
   The rendered Dockerfile is then made production-safe (`patch_dockerfile`): tini as
   PID 1, every install held to the base image's frozen packages (`base_constraints.py`),
   `pip check` and an import smoke test after the last install, `chown` of only what the
   server writes. `Dockerfile.verify` beside it builds the verify image (the serving image
   plus the build tooling) that k8s/verify/job.yaml runs.
3. Builds, tags and pushes both with `docker build` / `docker push` when a Docker engine
   answers `docker info`; otherwise prints why and the exact commands to run elsewhere.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from mistral_build import base_constraints
from mistral_build.deploy_settings import (
    DeploySettings,
    DeploySettingsError,
    add_settings_arguments,
    settings_from_args,
)
from mistral_build.k8s_objects import NON_ROOT_UID
from mistral_build.local_server import SERVER_MODULE, render_build_context
from mistral_build.paths import CACHE_DIR, REPO_ROOT, TRUSS_DIR
from mistral_build.release import (
    BASE_IMAGE,
    BASE_IMAGE_CUDA,
    BASE_IMAGE_PYTHON,
    BASE_IMAGE_PYTHON_VERSION,
    RAISE_NOFILE,
    TINI,
    TRTLLM_VERSION,
)
from mistral_build.truss_config import truss_config, write_config
from mistral_serving.engines import fallback

# What the base image has installed that our code and the Truss server also touch:
# TensorRT-LLM v1.2.1's requirements.txt (tag commit 376f7e1b), plus the bounds that
# transformers 4.57.3 itself declares. `uv pip install` in the Truss Dockerfile keeps an
# installed version that satisfies a requirement, so these are the versions we run on.
TRTLLM_PINS: tuple[str, ...] = (
    "transformers==4.57.3",
    "numpy<2",
    "fastapi>=0.120.1,<=0.121.3",
    "starlette>=0.49.1",
    "uvicorn",
    "torch>=2.9.1,<=2.10.0a0",
    "tensorrt~=10.14.1",
    "triton==3.5.1",
    "pydantic>=2.9.1",
    "pydantic-settings",  # unpinned there ([yaml] extra)
    "sentencepiece>=0.1.99",
    "prometheus_client",
    "mistral-common==1.8.6",
    "openai",
    "psutil",
    "datasets==3.1.0",
    "h5py==3.12.1",
    "setuptools<80",
    # transformers 4.57.3's own requirements.
    "huggingface-hub>=0.34.0,<1.0",
    "tokenizers>=0.22.0,<=0.23.0",
    "safetensors>=0.4.3",
)

# TensorRT-LLM's whole requirements.txt (what its wheel installed into the release image;
# the file names its sources). With the families below, the image build holds what it pins
# or caps at the base image's version (base_constraints.py); every other package may rise.
TRTLLM_REQUIREMENTS_FILE = (
    Path(__file__).parent / "data" / f"trtllm-{TRTLLM_VERSION}-requirements.txt"
)


def trtllm_requirements() -> list[str]:
    return TRTLLM_REQUIREMENTS_FILE.read_text().splitlines()


# The torch / TensorRT / Triton / CUDA family: built and tested together in the base image
# (NGC's own builds, CUDA 13); never replaced by an install, whoever asks.
HOLD_FAMILIES: tuple[str, ...] = (
    "torch*",
    "triton*",
    "pytorch-triton*",
    "tensorrt*",
    "nvidia-*",
    "cuda-*",
    "cupy-cuda*",
)

# Where `make test-compat` cannot run what the image runs, and why. Every other pin above
# is a constraint of that venv (`compat_constraints`).
COMPAT_DEVIATIONS: dict[str, str] = {
    "torch": "the image's torch 2.9.x exists here only as a multi-GB CUDA build; the "
    "tokenizer, chat and streaming tests do not depend on torch's version",
}

# The container's command: the real Truss server with our routes (mistral_serving.http.server),
# from /app (the Truss server's modules) with the bundled packages importable at start.
PACKAGES_DIR = "/packages"
# The serving core names the optional package in one place (engines/fallback.py).
FALLBACK_PACKAGE = fallback.PACKAGE

DOCKER_PLATFORM = "linux/amd64"


# --- requirements: do the three sources agree? ---------------------------------------


def parse_requirements(lines: Iterable[str]) -> list[Requirement]:
    """PEP 508 lines; comments, blank lines and pip options (-i, -c, ...) are skipped."""
    reqs = []
    for raw in lines:
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith(("#", "-")):
            continue
        try:
            reqs.append(Requirement(line))
        except InvalidRequirement as exc:
            raise ValueError(f"not a requirement: {raw.strip()!r} ({exc})") from None
    return reqs


def truss_server_dir() -> Path:
    import truss

    return Path(truss.__file__).parent / "templates" / "server"


def truss_server_requirements() -> list[str]:
    return (truss_server_dir() / "requirements.txt").read_text().splitlines()


def truss_server_constraints() -> list[str]:
    return (truss_server_dir() / "constraints.txt").read_text().splitlines()


def config_requirements(truss_dir: Path = TRUSS_DIR) -> list[str]:
    return list(truss_config(truss_dir).get("requirements") or [])


def pyproject_dependencies(repo_root: Path = REPO_ROOT) -> list[str]:
    data = tomllib.loads((repo_root / "pyproject.toml").read_text())
    return list(data["project"]["dependencies"])


def requirement_sources() -> dict[str, list[str]]:
    return {
        "truss server requirements.txt": truss_server_requirements(),
        "truss server constraints.txt": truss_server_constraints(),
        "config.yaml requirements": config_requirements(),
        "pyproject.toml dependencies": pyproject_dependencies(),
        f"TensorRT-LLM {TRTLLM_VERSION} image": list(TRTLLM_PINS),
    }


def _candidates(specs: Iterable[SpecifierSet]) -> set[Version]:
    """Versions worth trying: every version any specifier names (not wildcards)."""
    found = set()
    for spec_set in specs:
        for spec in spec_set:
            if spec.version.endswith(".*"):
                continue
            try:
                found.add(Version(spec.version))
            except InvalidVersion:
                continue
    return found


@dataclass(frozen=True)
class Conflict:
    package: str
    detail: str

    def __str__(self) -> str:
        return f"{self.package}: {self.detail}"


def find_conflicts(
    sources: dict[str, list[str]], python_version: str = BASE_IMAGE_PYTHON_VERSION
) -> list[Conflict]:
    """Packages whose specifiers across `sources` admit no common version.

    A version named by one of the specifiers must satisfy all of them (a witness; bounds
    such as `>=0.120.1,<=0.121.3` always name one, and an exact pin such as the base
    image's `transformers==4.57.3` must itself satisfy every other source, or the image
    build would replace the version TensorRT-LLM was built and tested with).
    """
    env = {
        "python_version": python_version,
        "python_full_version": python_version + ".0",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "platform_machine": "x86_64",
        "os_name": "posix",
        "implementation_name": "cpython",
    }
    by_name: dict[str, list[tuple[str, Requirement]]] = {}
    for source, lines in sources.items():
        for req in parse_requirements(lines):
            if req.marker is not None and not req.marker.evaluate(env):
                continue
            by_name.setdefault(canonicalize_name(req.name), []).append((source, req))

    conflicts = []
    for name, entries in sorted(by_name.items()):
        if len({src for src, _ in entries}) < 2:
            continue  # one source alone cannot conflict with the others
        specs = [req.specifier for _, req in entries]
        combined = SpecifierSet()
        for spec in specs:
            combined &= spec
        candidates = _candidates(specs)
        if not any(s.operator in (">=", ">", "==", "===", "~=") for s in combined):
            candidates.add(Version("0"))  # only upper bounds: anything low enough fits
        if not any(combined.contains(v, prereleases=True) for v in candidates):
            described = "; ".join(f"{src}: {req}" for src, req in entries)
            conflicts.append(Conflict(name, f"no version satisfies all of {described}"))
    return conflicts


def check_requirements() -> list[Conflict]:
    return find_conflicts(requirement_sources())


def compat_constraints() -> list[str]:
    """pip constraints for `make test-compat`: the image's pins, less the deviations."""
    return [
        pin
        for pin in TRTLLM_PINS
        if canonicalize_name(Requirement(pin).name) not in COMPAT_DEVIATIONS
    ]


# --- the build context ----------------------------------------------------------------


@contextmanager
def _env(name: str, value: str) -> Iterator[None]:
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


def _replace_once(dockerfile: str, old: str, new: str) -> str:
    """`old` replaced by `new`; refused unless `old` is there exactly once (truss's
    template changed under us, and the build would silently lose a step)."""
    if dockerfile.count(old) != 1:
        raise RuntimeError(f"rendered Dockerfile has no single {old!r}: truss changed")
    return dockerfile.replace(old, new)


# Where the build keeps the base image's freeze and the constraints made from it.
BUILD_DIR = "/opt/mtt-build"
CONSTRAINTS_SCRIPT = "base_constraints.py"  # mistral_build/base_constraints.py
MAY_MOVE_FILE = "server_may_move.txt"
HOLD_FILE = "base_hold_exact.txt"
BASE_FREEZE = f"{BUILD_DIR}/base-freeze.txt"
BASE_PIP_CHECK = f"{BUILD_DIR}/base-pip-check.txt"
BASE_CONSTRAINTS = f"{BUILD_DIR}/base-constraints.txt"
CUDA_COMPAT_LIB = "/usr/local/cuda/compat/lib.real"  # NGC images: libcuda.so.1 for forward compat
# What the server must import, checked in the image at build time. No GPU and no driver
# there: tensorrt_llm is not imported (its import loads its CUDA bindings and may initialise
# CUDA, which fails without a driver); its installed version is read from its metadata
# instead, and the verify Job imports it on a GPU (verify-gpu's tensorrt_llm_import check).
SMOKE_IMPORTS = (
    "importlib.metadata",
    "importlib.util",
    "truss_server",
    SERVER_MODULE,
    "torch.cuda",
)
# Files and folders under APP_HOME the Truss server writes at run time (model_wrapper.py
# creates `data` in its working directory); everything else stays root's.
APP_WRITABLE = ("data",)
# Caches under HOME (FlashInfer's JIT kernels, the Hugging Face Hub's files) go to
# $HOME/.cache. The Deployment and the verify Job mount an emptyDir at a folder inside it
# (.cache/mistral-trt-truss); where the image has no $HOME/.cache the kubelet creates it,
# root-owned, and uid 60000 can then write nothing else there. So the image makes it, and
# hands it over with HOME.
HOME_WRITABLE = (".cache",)


def server_entrypoint(python: str) -> list[str]:
    """tini as PID 1, a shell that raises the open-file limit and execs (so tini's child
    is the server itself, and SIGTERM reaches it), then our launcher."""
    shell = f'{RAISE_NOFILE}; exec {python} -m {SERVER_MODULE} "$@"'
    return [TINI, "--", "/bin/sh", "-c", shell, SERVER_MODULE]


def smoke_test_code() -> str:
    """Python that fails the build unless the server's modules import, tensorrt_llm is
    installed at TRTLLM_VERSION and torch is built for the image's CUDA major."""
    imports = ", ".join(SMOKE_IMPORTS)
    return (
        f"import {imports}; "
        f"assert importlib.util.find_spec('tensorrt_llm'), 'tensorrt_llm is not installed'; "
        f"v = importlib.metadata.version('tensorrt_llm'); "
        f"assert v == {TRTLLM_VERSION!r}, f'tensorrt_llm {{v}}, expected {TRTLLM_VERSION}'; "
        f"c = torch.version.cuda or ''; "
        f"assert c.split('.')[0] == {BASE_IMAGE_CUDA.split('.')[0]!r}, "
        f"f'torch built for CUDA {{c!r}}, the image is CUDA {BASE_IMAGE_CUDA}'; "
        f"print('imports ok: tensorrt_llm', v, '(not imported: no GPU here)', 'torch', "
        f"torch.__version__, 'CUDA', c)"
    )


def smoke_test_command(python: str) -> str:
    # No GPU and no driver during `docker build`: should a library need libcuda.so.1 just
    # to load, the CUDA forward-compatibility copy the NGC image ships stands in (after
    # any real one on the path; this RUN only, the server never sees it).
    return f'RUN LD_LIBRARY_PATH="${{LD_LIBRARY_PATH}}:{CUDA_COMPAT_LIB}" {python} -c "{smoke_test_code()}"'


def patch_dockerfile(dockerfile: str, python: str) -> str:
    """truss's Dockerfile made production-safe, in build order:

    1. tini, so PID 1 reaps orphans (MPI helpers) and forwards signals;
    2. the base image's packages frozen (and its own `pip check` recorded) before any
       install, and every `uv pip install` held to them as constraints;
    3. `chown` only what the server writes (not /app/tensorrt_llm, not the code);
    4. after the last install: `pip check` (no problem the base did not have) and an
       import smoke test of what the server runs;
    5. our launcher as the entry point, under tini, with /packages on the path.
    """
    first_install = "COPY --chown=root:root ./base_server_requirements.txt"
    b = BUILD_DIR
    freeze = (
        f"RUN apt-get update && apt-get install -y --no-install-recommends tini "
        f"&& rm -rf /var/lib/apt/lists/*\n"
        f"COPY --chown=root:root ./{CONSTRAINTS_SCRIPT} ./{MAY_MOVE_FILE} ./{HOLD_FILE} {b}/\n"
        f"RUN {python} -m pip list --format=freeze > {BASE_FREEZE} \\\n"
        f"    && ({python} -m pip check > {BASE_PIP_CHECK} || true) \\\n"
        f"    && {python} {b}/{CONSTRAINTS_SCRIPT} freeze {BASE_FREEZE} {b}/{MAY_MOVE_FILE} "
        f"{b}/{HOLD_FILE} > {BASE_CONSTRAINTS}\n"
    )
    dockerfile = _replace_once(dockerfile, first_install, freeze + first_install)
    installs = [ln for ln in dockerfile.splitlines() if "uv pip install" in ln]
    if len(installs) != 2:
        raise RuntimeError(
            f"rendered Dockerfile has {len(installs)} uv installs, not 2: truss changed"
        )
    for line in installs:
        dockerfile = _replace_once(
            dockerfile,
            line,
            line.replace(" --no-cache-dir", f" -c {BASE_CONSTRAINTS} --no-cache-dir"),
        )
    writable = " ".join(f"${{APP_HOME}}/{d}" for d in APP_WRITABLE)
    in_home = " ".join(f"${{HOME}}/{d}" for d in HOME_WRITABLE)
    dockerfile = _replace_once(
        dockerfile,
        f"RUN chown -R {NON_ROOT_UID}:{NON_ROOT_UID} ${{HOME}} ${{APP_HOME}} {PACKAGES_DIR} /workspace \n",
        f"RUN mkdir -p {in_home} {writable} "
        f"&& chown -R {NON_ROOT_UID}:{NON_ROOT_UID} ${{HOME}} /workspace {writable}\n",
    )
    truss_cmd = json.dumps([python, "/app/main.py"], separators=(", ", ": "))
    ours = json.dumps(server_entrypoint(python), separators=(", ", ": "))
    return _replace_once(
        dockerfile,
        f"ENTRYPOINT {truss_cmd}",
        f'ENV PYTHONPATH="{PACKAGES_DIR}${{PYTHONPATH:+:${{PYTHONPATH}}}}"\n'
        f'ENV SERVER_START_CMD="{python} -m {SERVER_MODULE}"\n'
        f"RUN {python} -m pip check | {python} {b}/{CONSTRAINTS_SCRIPT} check {BASE_PIP_CHECK}\n"
        f"{smoke_test_command(python)}\n"
        f"ENTRYPOINT {ours}",
    )


# --- the verify image: the serving image plus the build tooling ----------------------

VERIFY_DOCKERFILE = "Dockerfile.verify"
TOOLS_DIR = "tools"  # in the build context; only Dockerfile.verify copies it
TOOLS_HOME = "/opt/mistral-trt-truss"
# What `build.py verify-gpu` needs of the repository (mistral_build imports client for the
# benchmark; the Truss folder is what it renders a server from).
TOOLS = ("build.py", "pyproject.toml", "mistral_build", "client", TRUSS_DIR.name)


# verify-gpu serves from the image's own server folders (not from a build context rendered
# by truss): what the Deployment runs, and no truss to install (its caps, rich<14 among
# them, cannot be met on the release image's packages without moving them down).
VERIFY_APP_ENV = "VERIFY_GPU_APP_DIR"
VERIFY_PACKAGES_ENV = "VERIFY_GPU_PACKAGES_DIR"
APP_DIR = "/app"


def verify_dockerfile(python: str = BASE_IMAGE_PYTHON) -> str:
    uid = NON_ROOT_UID
    return (
        "# The verify image: the serving image plus the repository's build tooling, so that\n"
        "# `build.py verify-gpu` runs inside what the Deployment runs (k8s/verify/job.yaml).\n"
        "ARG SERVING_IMAGE\n"
        "FROM ${SERVING_IMAGE}\n"
        "USER root\n"
        f"COPY --chown=root:root ./{TOOLS_DIR} {TOOLS_HOME}\n"
        f"RUN mkdir -p {TOOLS_HOME}/.cache && chown -R {uid}:{uid} {TOOLS_HOME}/.cache\n"
        f"ENV {VERIFY_APP_ENV}={APP_DIR} {VERIFY_PACKAGES_ENV}={PACKAGES_DIR}\n"
        f"USER {uid}\n"
        f"WORKDIR {TOOLS_HOME}\n"
        f"RUN {python} build.py verify-gpu --help > /dev/null\n"
        + "ENTRYPOINT "
        + json.dumps([TINI, "--", python, "build.py", "verify-gpu"], separators=(", ", ": "))
        + "\n"
    )


def copy_tools(dest: Path, repo_root: Path = REPO_ROOT) -> None:
    """What Dockerfile.verify copies into TOOLS_HOME (the tests lay the Job out from it)."""
    ignore = shutil.ignore_patterns("__pycache__", ".cache", "*.pyc")
    dest.mkdir(parents=True)
    for name in TOOLS:
        src = repo_root / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=ignore)
        else:
            shutil.copyfile(src, dest / name)


def add_verify_image(build_dir: Path, repo_root: Path = REPO_ROOT) -> None:
    copy_tools(build_dir / TOOLS_DIR, repo_root)
    (build_dir / VERIFY_DOCKERFILE).write_text(verify_dockerfile())


def server_may_move() -> list[str]:
    """Packages the base image's versions do not hold: what the Truss server pins exactly
    (it must install that version) and TensorRT-LLM does not require. Everything else the
    base has stays as it is, or the build fails."""
    trtllm = {canonicalize_name(r.name) for r in parse_requirements(TRTLLM_PINS)}
    server = parse_requirements(truss_server_requirements() + truss_server_constraints())
    exact = {
        canonicalize_name(r.name)
        for r in server
        if any(s.operator in ("==", "===") for s in r.specifier)
    }
    return sorted(exact - trtllm)


def held_exactly() -> list[str]:
    """What the build holds at the base image's version (`==`): every package TensorRT-LLM's
    requirements pin or cap (==, ~=, <, <=), and the torch / TensorRT / Triton / CUDA
    families. Every other base package is held at `>=` its version."""
    capped = {
        canonicalize_name(r.name)
        for r in parse_requirements([*TRTLLM_PINS, *trtllm_requirements()])
        if any(s.operator in ("==", "===", "~=", "<", "<=") for s in r.specifier)
    }
    return sorted(capped) + list(HOLD_FAMILIES)


def render_image_context(
    build_dir: Path, settings: DeploySettings | None = None, truss_dir: Path = TRUSS_DIR
) -> Path:
    """The Docker build context by truss's own code, from a copy of the Truss whose
    config.yaml carries `settings` (defaults: DeploySettings()), running as the non-root
    `app` user, with our launcher as the entry point. The GPU fallback package is left
    out unless `settings.gpu_fallback` asks for it: a TensorRT-LLM deployment never runs
    it, and the server refuses the settings that need it in one line."""
    settings = settings or DeploySettings()
    with tempfile.TemporaryDirectory() as tmp:
        staged = Path(tmp) / truss_dir.name
        shutil.copytree(truss_dir, staged, ignore=shutil.ignore_patterns("__pycache__"))
        if not settings.gpu_fallback:
            shutil.rmtree(staged / "packages" / FALLBACK_PACKAGE)
        write_config(settings, staged)
        with _env("BT_USE_NON_ROOT_USER", "1"):
            render_build_context(build_dir, staged)
    dockerfile_path = build_dir / "Dockerfile"
    dockerfile = dockerfile_path.read_text()
    if f"FROM {BASE_IMAGE} " not in dockerfile:
        raise RuntimeError(f"rendered Dockerfile does not build FROM {BASE_IMAGE}")
    dockerfile_path.write_text(patch_dockerfile(dockerfile, BASE_IMAGE_PYTHON))
    shutil.copyfile(Path(base_constraints.__file__), build_dir / CONSTRAINTS_SCRIPT)
    (build_dir / MAY_MOVE_FILE).write_text(
        "# Truss server pins the base image's versions do not hold (image.server_may_move)\n"
        + "".join(f"{name}\n" for name in server_may_move())
    )
    (build_dir / HOLD_FILE).write_text(
        "# Held at the base image's version (image.held_exactly); the rest only rises\n"
        + "".join(f"{name}\n" for name in held_exactly())
    )
    add_verify_image(build_dir)
    return build_dir


# --- docker ---------------------------------------------------------------------------


Runner = Callable[..., subprocess.CompletedProcess]


def docker_unavailable(runner: Runner = subprocess.run) -> str | None:
    """None when a Docker engine answers; otherwise why not."""
    if shutil.which("docker") is None:
        return "the docker client is not installed"
    try:
        proc = runner(
            ["docker", "info", "--format", "{{.ServerVersion}}"],
            capture_output=True,
            text=True,
            timeout=20,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"`docker info` failed: {exc}"
    if proc.returncode != 0:
        reason = (proc.stderr or proc.stdout or "").strip().splitlines()
        return "no Docker engine answers `docker info`" + (f" ({reason[-1]})" if reason else "")
    return None


def docker_commands(
    context_dir: Path, image_ref: str, push: bool = True, verify_ref: str | None = None
) -> list[list[str]]:
    """Build (and push) the serving image, then the verify image on top of it."""
    cmds = [["docker", "build", "--platform", DOCKER_PLATFORM, "-t", image_ref, str(context_dir)]]
    if verify_ref is not None:
        cmds.append(
            ["docker", "build", "--platform", DOCKER_PLATFORM,
             "-f", str(context_dir / VERIFY_DOCKERFILE), "--build-arg", f"SERVING_IMAGE={image_ref}",
             "-t", verify_ref, str(context_dir)]
        )  # fmt: skip
    if push:
        cmds.append(["docker", "push", image_ref])
        if verify_ref is not None:
            cmds.append(["docker", "push", verify_ref])
    return cmds


def build_image(
    settings: DeploySettings,
    context_dir: Path,
    push: bool = True,
    runner: Runner = subprocess.run,
) -> int:
    """Render the context; build and push when Docker is reachable. Exit code 0 when it
    did what this machine allows (a missing Docker engine is reported, not an error)."""
    if settings.image is None:
        print(
            "error: no image repository to build and push: give --image "
            "REGION-docker.pkg.dev/PROJECT/REPO/NAME or `image:` in --values FILE",
            file=sys.stderr,
        )
        return 2
    conflicts = check_requirements()
    if conflicts:
        print("error: the image's requirements conflict:", file=sys.stderr)
        for c in conflicts:
            print(f"  {c}", file=sys.stderr)
        return 1
    render_image_context(context_dir, settings)
    print(
        f"Rendered the Docker build context into {context_dir} "
        f"(FROM {BASE_IMAGE}, runs `python3 -m {SERVER_MODULE}` as uid 60000; "
        f"{VERIFY_DOCKERFILE}: the verify image {settings.verify_image_ref})."
    )
    cmds = docker_commands(context_dir, settings.image_ref, push, settings.verify_image_ref)
    shown = "\n".join("  " + " ".join(c) for c in cmds)
    why = docker_unavailable(runner)
    if why is not None:
        print(
            f"Not building the image here: {why}.\n"
            f"On a machine with Docker (and `gcloud auth configure-docker` for the registry) run:\n"
            f"{shown}"
        )
        return 0
    for cmd in cmds:
        print("+ " + " ".join(cmd), flush=True)
        proc = runner(cmd)
        if proc.returncode != 0:
            print(
                f"error: {' '.join(cmd[:2])} failed with exit code {proc.returncode}",
                file=sys.stderr,
            )
            return proc.returncode
    print(f"Built{' and pushed' if push else ''} {settings.image_ref}.")
    return 0


DEFAULT_CONTEXT_DIR = CACHE_DIR / "image-context"


def image_command(args: argparse.Namespace) -> int:
    try:
        settings = settings_from_args(args)
    except DeploySettingsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return build_image(settings, Path(args.context_dir), push=not args.no_push)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "image", help="Render the Truss image build context; build and push it with Docker."
    )
    add_settings_arguments(p)
    p.add_argument(
        "--context-dir",
        default=str(DEFAULT_CONTEXT_DIR),
        help="Where to render the build context (default: .cache/image-context).",
    )
    p.add_argument("--no-push", action="store_true", help="Build and tag only.")
    p.set_defaults(func=image_command)
