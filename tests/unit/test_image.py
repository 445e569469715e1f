"""The image's Docker build context, rendered by truss's own code, and `build.py image`.

Checks the Dockerfile's base image (NVIDIA's TensorRT-LLM release container of the version
our engines are built with) and Python, what it installs, the copied model code and
packages, its entry point (our launcher of the real Truss server), the config.yaml it
carries (from the deploy settings), the non-root user, and what `build.py` does with and
without a Docker engine.
"""

from __future__ import annotations

import filecmp
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from mistral_build import image, k8s, paths
from mistral_build.cli import main as build_main
from mistral_build.deploy_settings import APP_HOME_DIR, DeploySettings
from mistral_build.paths import TRUSS_DIR
from mistral_build.truss_config import truss_config

REGISTRY = "registry.example/llm/mtt"


@pytest.fixture(scope="module")
def context(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return image.render_image_context(tmp_path_factory.mktemp("image") / "context")


@pytest.fixture(scope="module")
def dockerfile(context: Path) -> str:
    return (context / "Dockerfile").read_text()


def instructions(dockerfile: str) -> list[str]:
    """Dockerfile instructions with line continuations joined."""
    return [
        line
        for line in dockerfile.replace("\\\n", " ").splitlines()
        if line.strip() and not line.startswith("#")
    ]


def test_base_image_is_the_tensorrt_llm_release_our_engines_are_built_with(dockerfile: str) -> None:
    froms = [i for i in instructions(dockerfile) if i.startswith("FROM ")]
    assert froms == [f"FROM {image.BASE_IMAGE} AS truss_server"]
    assert image.BASE_IMAGE.endswith(f"/tensorrt-llm/release:{image.TRTLLM_VERSION}")
    cfg = truss_config()
    assert cfg["base_image"]["image"] == image.BASE_IMAGE
    assert cfg["base_image"]["python_executable_path"] == image.BASE_IMAGE_PYTHON
    assert cfg["python_version"] == "py" + image.BASE_IMAGE_PYTHON_VERSION.replace(".", "")


def test_installs_with_and_runs_the_base_images_python(dockerfile: str) -> None:
    installs = [i for i in instructions(dockerfile) if "uv pip install" in i]
    assert len(installs) == 2  # Truss server requirements, then ours + the server's
    for cmd in installs:
        assert f"--python {image.BASE_IMAGE_PYTHON} " in cmd
        # Every install is held to the base image's own packages.
        assert f" -c {image.BASE_CONSTRAINTS} " in cmd
    assert any("-r requirements.txt -c constraints.txt" in cmd for cmd in installs)
    assert 'ENV INFERENCE_SERVER_PORT="8080"' in dockerfile


def test_the_build_freezes_the_base_then_installs_then_checks_in_that_order(
    context: Path, dockerfile: str
) -> None:
    lines = instructions(dockerfile)

    def first(fragment: str) -> int:
        return next(i for i, line in enumerate(lines) if fragment in line)

    py = image.BASE_IMAGE_PYTHON
    freeze = first(f"{py} -m pip list --format=freeze > {image.BASE_FREEZE}")
    assert f"{py} -m pip check > {image.BASE_PIP_CHECK}" in lines[freeze]
    assert f"base_constraints.py freeze {image.BASE_FREEZE}" in lines[freeze]
    assert lines[freeze].endswith(f"> {image.BASE_CONSTRAINTS}")
    installs = [i for i, line in enumerate(lines) if "uv pip install" in line]
    last_copy = max(i for i, line in enumerate(lines) if line.startswith("COPY "))
    pip_check = first(f"RUN {py} -m pip check | {py} ")
    assert f"base_constraints.py check {image.BASE_PIP_CHECK}" in lines[pip_check]
    smoke = first(f'{py} -c "import importlib.metadata, importlib.util, truss_server, ')
    compat = f'RUN LD_LIBRARY_PATH="${{LD_LIBRARY_PATH}}:{image.CUDA_COMPAT_LIB}" '
    assert lines[smoke].startswith(compat)
    entry = first("ENTRYPOINT")
    assert freeze < installs[0] < installs[1] < last_copy < pip_check < smoke < entry
    assert "torch.cuda" in lines[smoke] and "'1.2.1'" in lines[smoke]
    assert "import tensorrt_llm" not in lines[smoke]  # no GPU at build time: verify-gpu imports it
    # The smoke test runs where the server's modules and packages are importable.
    assert lines.index('ENV PYTHONPATH="/packages${PYTHONPATH:+:${PYTHONPATH}}"') < smoke
    assert [ln for ln in lines[:smoke] if ln.startswith("WORKDIR")][-1] == "WORKDIR $APP_HOME"
    # The script the build runs is the one the tests exercise, and the may-move list is
    # what image.server_may_move() says.
    assert filecmp.cmp(
        context / "base_constraints.py", Path(image.base_constraints.__file__), shallow=False
    )
    listed = [
        ln for ln in (context / "server_may_move.txt").read_text().splitlines() if ln[:1] != "#"
    ]
    assert listed == image.server_may_move()


def test_only_the_servers_exact_pins_outside_tensorrt_llm_may_move() -> None:
    may_move = image.server_may_move()
    trtllm = {r.name.lower().replace("_", "-") for r in image.parse_requirements(image.TRTLLM_PINS)}
    assert not set(may_move) & trtllm
    assert "cython" in may_move  # the Truss server pins cython==3.0.5
    assert "transformers" not in may_move and "torch" not in may_move


def smoke_site(tmp_path: Path, trtllm: str | None, cuda: str) -> Path:
    """A Python path laid out as the image's at build time, no GPU: tensorrt_llm installed
    at `trtllm` (its dist-info) with an import that fails as CUDA's initialisation does
    without a driver; torch built for CUDA `cuda`; the server's modules as stand-ins."""
    site = tmp_path / "site"
    site.mkdir(parents=True)
    if trtllm is not None:
        (site / "tensorrt_llm").mkdir()
        (site / "tensorrt_llm" / "__init__.py").write_text(
            "raise RuntimeError('CUDA initialization failed: no CUDA-capable device')\n"
        )
        dist = site / f"tensorrt_llm-{trtllm}.dist-info"
        dist.mkdir()
        (dist / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: tensorrt_llm\nVersion: {trtllm}\n"
        )
    (site / "torch" / "cuda").mkdir(parents=True)
    (site / "torch" / "__init__.py").write_text(
        "from . import cuda, version\n__version__ = '2.10.0a0'\n"
    )
    (site / "torch" / "version.py").write_text(f"cuda = {cuda!r}\n")
    (site / "torch" / "cuda" / "__init__.py").write_text("")
    (site / "truss_server.py").write_text("")
    *packages, module = image.SERVER_MODULE.split(".")
    folder = site.joinpath(*packages)
    folder.mkdir(parents=True)
    for i in range(len(packages)):
        (site.joinpath(*packages[: i + 1]) / "__init__.py").write_text("")
    (folder / f"{module}.py").write_text("")
    return site


def run_smoke(site: Path) -> subprocess.CompletedProcess[str]:
    cmd = image.smoke_test_command("python3")
    code = cmd.split(' python3 -c "', 1)[1].removesuffix('"')
    assert code == image.smoke_test_code()
    return subprocess.run(
        [sys.executable, "-S", "-c", code],  # -S: only the stand-ins are importable
        env={"PYTHONPATH": str(site), "PATH": os.environ["PATH"]},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_smoke_test_passes_without_a_gpu_and_fails_on_wrong_versions(tmp_path: Path) -> None:
    # Importing tensorrt_llm fails without a driver; the build must not depend on it.
    ok = run_smoke(smoke_site(tmp_path / "ok", image.TRTLLM_VERSION, "13.0"))
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.startswith(f"imports ok: tensorrt_llm {image.TRTLLM_VERSION} (not imported")
    old = run_smoke(smoke_site(tmp_path / "old", "1.1.0", "13.0"))
    assert old.returncode != 0 and "tensorrt_llm 1.1.0, expected 1.2.1" in old.stderr
    cuda = run_smoke(smoke_site(tmp_path / "cuda", image.TRTLLM_VERSION, "12.8"))
    assert cuda.returncode != 0 and "torch built for CUDA '12.8'" in cuda.stderr
    none = run_smoke(smoke_site(tmp_path / "none", None, "13.0"))
    assert none.returncode != 0 and "tensorrt_llm is not installed" in none.stderr


def test_the_container_runs_our_launcher_of_the_truss_server(
    context: Path, dockerfile: str
) -> None:
    lines = instructions(dockerfile)
    entry = [i for i in lines if i.startswith(("ENTRYPOINT", "CMD"))]
    # tini is PID 1: it reaps orphaned MPI helpers and forwards SIGTERM to the server; a
    # shell between them raises the open-file limit and execs the launcher.
    (argv,) = [json.loads(e.removeprefix("ENTRYPOINT ")) for e in entry]
    assert argv == image.server_entrypoint(image.BASE_IMAGE_PYTHON)
    assert argv[:4] == [image.TINI, "--", "/bin/sh", "-c"]
    assert argv[4].endswith(f'; exec {image.BASE_IMAGE_PYTHON} -m mistral_serving.http.server "$@"')
    tini = next(i for i in lines if "apt-get install" in i and " tini " in i)
    assert lines.index(tini) < lines.index("USER 60000")
    assert "/app/main.py" not in entry[0]
    # Run from /app (the Truss server's modules: `-m` puts the working dir on sys.path)...
    workdirs = [i for i in lines[: lines.index(entry[0])] if i.startswith("WORKDIR")]
    assert workdirs[-1] == "WORKDIR $APP_HOME" and "ENV APP_HOME=/app" in lines
    assert "COPY --chown=root:root ./server ${APP_HOME}" in lines
    # ...with the bundled packages importable before truss adds them itself.
    assert 'ENV PYTHONPATH="/packages${PYTHONPATH:+:${PYTHONPATH}}"' in lines
    assert lines.index('ENV PYTHONPATH="/packages${PYTHONPATH:+:${PYTHONPATH}}"') < lines.index(
        entry[0]
    )
    assert "COPY --chown=root:root ./packages /packages" in lines
    assert (context / "packages" / "mistral_serving" / "http" / "server.py").is_file()
    assert (context / "server" / "truss_server.py").is_file()


def test_a_changed_truss_template_is_refused_not_silently_kept() -> None:
    with pytest.raises(RuntimeError, match="truss changed"):
        image.patch_dockerfile(
            'ENTRYPOINT ["/usr/bin/python3", "/app/server.py"]\n', "/usr/bin/python3"
        )


def test_the_image_carries_the_config_its_settings_render(tmp_path: Path) -> None:
    s = DeploySettings(
        image=REGISTRY, gpu_type="h100", gpu_count=2, serving={"max_inflight": "128"}
    )
    cfg = yaml.safe_load(
        (image.render_image_context(tmp_path / "c", s) / "config.yaml").read_text()
    )
    assert cfg["resources"]["accelerator"] == "H100:2"
    assert cfg["model_metadata"] == {"max_inflight": 128}
    assert cfg["base_image"]["image"] == image.BASE_IMAGE
    # The repository's Truss is left as it is.
    assert truss_config()["resources"]["accelerator"] == "A100"


def test_installed_requirements_are_the_servers_and_ours(context: Path) -> None:
    installed = image.parse_requirements((context / "requirements.txt").read_text().splitlines())
    by_name = {r.name.lower().replace("_", "-"): str(r) for r in installed}
    for line in image.config_requirements():
        name = image.parse_requirements([line])[0].name.lower().replace("_", "-")
        assert by_name[name] == str(image.parse_requirements([line])[0])
    server = image.parse_requirements(image.truss_server_requirements())
    assert {r.name for r in server} <= {r.name for r in installed}
    assert (context / "constraints.txt").read_text().splitlines() == [
        line for line in image.truss_server_constraints()
    ]
    base = image.parse_requirements(
        (context / "base_server_requirements.txt").read_text().splitlines()
    )
    assert [str(r) for r in base] == [str(r) for r in server]


def test_model_code_and_packages_are_copied(context: Path, dockerfile: str) -> None:
    assert filecmp.cmp(
        context / "model" / "model.py", TRUSS_DIR / "model" / "model.py", shallow=False
    )
    src = TRUSS_DIR / "packages" / "mistral_serving"
    for f in src.rglob("*.py"):
        copied = context / "packages" / "mistral_serving" / f.relative_to(src)
        assert copied.is_file() and filecmp.cmp(f, copied, shallow=False), copied
    # Build tooling stays out of the image: only what serving needs is copied.
    assert not (context / "packages" / "mistral_build").exists()
    lines = instructions(dockerfile)
    assert "COPY --chown=root:root ./server ${APP_HOME}" in lines
    assert "COPY --chown=root:root ./model ${APP_HOME}/model" in lines
    assert "COPY --chown=root:root ./packages /packages" in lines
    assert any(i.startswith("COPY") and "./config.yaml ${APP_HOME}/config.yaml" in i for i in lines)
    assert (context / "server" / "main.py").is_file()
    assert (context / "server" / "truss_server.py").is_file()


def test_image_runs_as_the_non_root_user_the_manifests_expect(dockerfile: str) -> None:
    uid = k8s.NON_ROOT_UID
    lines = instructions(dockerfile)
    assert f"RUN useradd -u {uid} -ms /bin/bash app" in lines
    users = [i for i in lines if i.startswith("USER ")]
    assert users[-1] == f"USER {uid}"
    (chown,) = [i for i in lines if "chown -R" in i]
    # Only what the server writes: HOME (caches), /workspace and Truss's data folder; not
    # /app itself (it holds /app/tensorrt_llm from the base image) nor the code.
    targets = chown.split(f"chown -R {uid}:{uid} ", 1)[1].split()
    assert targets == ["${HOME}", "/workspace", "${APP_HOME}/data"]
    assert lines.index(chown) < lines.index(users[-1]) < len(lines) - 1
    assert f"ENV HOME=${{HOME:-{APP_HOME_DIR}}}" in lines


def test_home_cache_exists_before_the_chown(dockerfile: str) -> None:
    # The emptyDir at $HOME/.cache/mistral-trt-truss would otherwise make the kubelet create
    # $HOME/.cache root-owned, and FlashInfer's JIT cache or the Hub's could not go there.
    (chown,) = [i for i in instructions(dockerfile) if "chown -R" in i]
    made, handed = chown.split(" && chown -R ", 1)
    assert "${HOME}/.cache" in made.removeprefix("RUN mkdir -p ").split()
    assert "${HOME}" in handed.split()


def test_rendering_without_the_flag_would_run_as_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What the non-root setting changes: truss's default Dockerfile never switches user.
    from mistral_build.local_server import render_build_context

    monkeypatch.delenv("BT_USE_NON_ROOT_USER", raising=False)
    plain = (render_build_context(tmp_path / "c") / "Dockerfile").read_text()
    assert not re.search(r"^USER 60000", plain, re.M)


# --- build.py image / build.py -------------------------------------------------------------


class FakeDocker:
    def __init__(self, info_rc: int = 0, build_rc: int = 0) -> None:
        self.calls: list[list[str]] = []
        self.info_rc, self.build_rc = info_rc, build_rc

    def __call__(self, cmd: list[str], **kwargs: object) -> subprocess.CompletedProcess:
        self.calls.append(cmd)
        rc = {"info": self.info_rc, "build": self.build_rc}.get(cmd[1], 0)
        err = "Cannot connect to the Docker daemon" if rc and cmd[1] == "info" else ""
        return subprocess.CompletedProcess(cmd, rc, "", err)


@pytest.fixture
def docker_client(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(image.shutil, "which", lambda name: f"/usr/bin/{name}")


def test_without_a_docker_engine_it_renders_and_prints_the_exact_commands(
    tmp_path: Path, docker_client: None, capsys: pytest.CaptureFixture[str]
) -> None:
    docker = FakeDocker(info_rc=1)
    s = DeploySettings(image=REGISTRY, image_tag="t1")
    assert image.build_image(s, tmp_path / "ctx", runner=docker) == 0
    assert [c[1] for c in docker.calls] == ["info"]
    assert (tmp_path / "ctx" / "Dockerfile").is_file()
    out = capsys.readouterr().out
    assert "Cannot connect to the Docker daemon" in out
    assert (
        f"docker build --platform linux/amd64 -t registry.example/llm/mtt:t1 {tmp_path / 'ctx'}"
    ) in out
    assert "docker push registry.example/llm/mtt:t1" in out


def test_with_a_docker_engine_it_builds_tags_and_pushes(
    tmp_path: Path, docker_client: None
) -> None:
    docker = FakeDocker()
    s = DeploySettings(image=REGISTRY, image_tag="t2")
    assert image.build_image(s, tmp_path / "ctx", runner=docker) == 0
    ctx = str(tmp_path / "ctx")
    assert docker.calls[1:] == [
        ["docker", "build", "--platform", "linux/amd64", "-t", f"{REGISTRY}:t2", ctx],
        ["docker", "build", "--platform", "linux/amd64", "-f", f"{ctx}/Dockerfile.verify",
         "--build-arg", f"SERVING_IMAGE={REGISTRY}:t2", "-t", f"{REGISTRY}:t2-verify", ctx],
        ["docker", "push", f"{REGISTRY}:t2"],
        ["docker", "push", f"{REGISTRY}:t2-verify"],
    ]  # fmt: skip
    failing = FakeDocker(build_rc=3)
    assert image.build_image(s, tmp_path / "ctx", runner=failing) == 3
    assert [c[1] for c in failing.calls] == ["info", "build"]  # no push after a failed build


def test_the_verify_image_is_the_serving_image_plus_the_tooling(context: Path) -> None:
    text = (context / image.VERIFY_DOCKERFILE).read_text()
    lines = instructions(text)
    assert lines[:2] == ["ARG SERVING_IMAGE", "FROM ${SERVING_IMAGE}"]
    # Nothing installed on top: verify-gpu serves from the image's own /app and /packages
    # (truss's own caps, rich<14 among them, do not fit the release image's packages).
    assert not [i for i in lines if "pip install" in i]
    assert (
        f"ENV {image.VERIFY_APP_ENV}={image.APP_DIR} {image.VERIFY_PACKAGES_ENV}={image.PACKAGES_DIR}"
        in lines
    )
    assert lines[-1] == (
        f'ENTRYPOINT ["{image.TINI}", "--", "{image.BASE_IMAGE_PYTHON}", "build.py", "verify-gpu"]'
    )
    assert f"USER {k8s.NON_ROOT_UID}" in lines
    for name in image.TOOLS:
        assert (context / image.TOOLS_DIR / name).exists(), name
    assert (context / image.TOOLS_DIR / "mistral_build" / "verify" / "cli.py").is_file()
    assert not list((context / image.TOOLS_DIR).rglob("__pycache__"))


def test_no_docker_client_at_all(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(image.shutil, "which", lambda name: None)
    assert image.docker_unavailable() == "the docker client is not installed"


def test_conflicting_requirements_stop_the_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(image, "TRTLLM_PINS", (*image.TRTLLM_PINS, "pydantic<2"))
    docker = FakeDocker()
    assert image.build_image(DeploySettings(image=REGISTRY), tmp_path / "ctx", runner=docker) == 1
    assert docker.calls == [] and not (tmp_path / "ctx").exists()
    assert "pydantic" in capsys.readouterr().err


def test_no_image_repository_no_build(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    docker = FakeDocker()
    assert build_main(["image", "--context-dir", str(tmp_path / "ctx")]) == 2
    assert image.build_image(DeploySettings(), tmp_path / "ctx", runner=docker) == 2
    assert docker.calls == [] and not (tmp_path / "ctx").exists()
    assert "--image" in capsys.readouterr().err


def test_build_py_with_values_renders_context_and_manifests(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(image, "DEFAULT_CONTEXT_DIR", tmp_path / "ctx")
    monkeypatch.setattr(paths, "K8S_DIR", tmp_path / "k8s")
    monkeypatch.setattr(image, "docker_unavailable", lambda runner=None: "no engine here")
    values = k8s.EXAMPLE_VALUES_FILE
    assert build_main(["--values", str(values)]) == 0
    assert (tmp_path / "ctx" / "Dockerfile").is_file()
    s = DeploySettings(**yaml.safe_load(values.read_text()))
    assert k8s.drift(s, tmp_path / "k8s", values) == []
    out = capsys.readouterr().out
    assert "Not building the image here: no engine here" in out
    assert "docker build" in out and "kubectl apply -f" in out
    # Without values nothing is rendered.
    assert build_main([]) == 2
    assert not (tmp_path / "k8s2").exists()


def test_engines_are_built_in_the_tensorrt_llm_line_the_image_runs() -> None:
    from mistral_build import engine

    assert image.TRTLLM_VERSION.startswith(engine.TRTLLM_SERIES)


def test_the_freeze_and_pip_check_steps_run_as_written(
    context: Path, dockerfile: str, tmp_path: Path
) -> None:
    """The Dockerfile's own freeze and check lines, run in this venv (paths moved under
    tmp_path): they are valid shell, the freeze holds what is installed, and `pip check`
    passes on an environment the install did not change."""
    import importlib.metadata
    import shutil
    import sys

    lines = instructions(dockerfile)
    py = image.BASE_IMAGE_PYTHON
    freeze = next(ln for ln in lines if "--format=freeze" in ln)
    check = next(ln for ln in lines if ln.startswith(f"RUN {py} -m pip check | "))

    def here(line: str) -> str:
        return (
            line.removeprefix("RUN ")
            .replace(image.BUILD_DIR, str(tmp_path))
            .replace(py, sys.executable)
        )

    # What the COPY before them puts in place.
    copied = next(ln for ln in lines if ln.startswith("COPY") and image.BUILD_DIR in ln)
    for name in (image.CONSTRAINTS_SCRIPT, image.MAY_MOVE_FILE, image.HOLD_FILE):
        assert f"./{name}" in copied.split()
        shutil.copyfile(context / name, tmp_path / name)
    subprocess.run(["/bin/sh", "-c", here(freeze)], check=True, timeout=300)
    held = (tmp_path / "base-constraints.txt").read_text().splitlines()
    assert f"pydantic>={importlib.metadata.version('pydantic')}" in held
    assert f"transformers=={importlib.metadata.version('transformers')}" in held
    assert (tmp_path / "base-pip-check.txt").is_file()
    proc = subprocess.run(
        ["/bin/sh", "-c", here(check)], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr


def shell(script: str, *args: str) -> list[str]:
    out = subprocess.run(
        ["/bin/sh", "-c", script, "sh", *args], capture_output=True, text=True, check=True,
        timeout=30,
    )  # fmt: skip
    return out.stdout.splitlines()


def test_the_entry_point_raises_the_open_file_limit_and_passes_its_args() -> None:
    from mistral_build.release import NOFILE, RAISE_NOFILE

    argv = image.server_entrypoint(image.BASE_IMAGE_PYTHON)
    assert argv[4].startswith(RAISE_NOFILE + "; exec ")
    # The launcher gets the container's arguments (python replaced by echo: no image here).
    script = argv[4].replace(image.BASE_IMAGE_PYTHON, "echo")
    assert shell(script, "--extra", "arg") == ["-m mistral_serving.http.server --extra arg"]
    hard = int(shell("ulimit -H -n")[0])
    # containerd 2.x gives soft 1024 under a high hard limit: raised to NOFILE (or to the
    # hard limit where that is lower).
    assert shell(f"ulimit -S -n 256; {RAISE_NOFILE}; ulimit -S -n") == [str(min(hard, NOFILE))]
    low = min(hard, 4096)
    lowered = f"ulimit -S -n 256; ulimit -H -n {low}; {RAISE_NOFILE}; ulimit -S -n"
    assert shell(lowered) == [str(low)]


def test_the_image_leaves_the_gpu_fallback_out_unless_asked(context: Path, tmp_path: Path) -> None:
    """A TensorRT-LLM image carries the serving core only; `gpu_fallback: true` adds the
    package (the server refuses the settings that need it otherwise: test_fallback_absent)."""
    packages = context / "packages"
    assert (packages / "mistral_serving" / "engines" / "fallback.py").is_file()
    assert not (packages / image.FALLBACK_PACKAGE).exists()
    with_it = image.render_image_context(tmp_path / "ctx", DeploySettings(gpu_fallback=True))
    assert (with_it / "packages" / image.FALLBACK_PACKAGE / "plugin.py").is_file()
