"""The two commands docs/verify-on-gpu.md gives for the images, run as far as this machine
allows (no Docker, no GPU, no TensorRT-LLM): each image's own ENTRYPOINT (tini aside) on
the images' layout (tests/job_layout.py: uid 60000, `/app`, `/packages`, HOME and the
tooling laid out from the rendered Dockerfiles), with the environment `docker run` gives
it (the image's ENV and the documented `-e` flags), and the TensorRT-LLM test double on
the image's Python path in place of the real package.

- serve: `docker run ... -e MTT_ENGINE=trtllm_pytorch -e MTT_ARTIFACT=... IMAGE:TAG`: the
  server starts from /app as uid 60000, answers, and drains on SIGTERM;
- verify: `docker run ... IMAGE:TAG-verify --kind trtllm_pytorch`: the report is written
  to the tooling's default folder, served from the image's own /app (the double ignores
  penalties: that check fails, so the command exits 1)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from mistral_build.local_server import free_port, wait_ready
from mistral_build.verify.artifact import build_checkpoint
from tests.e2e.test_verify_gpu import CHEAP, FAKE_NVIDIA_SMI, FAKE_TRTLLM, SITECUSTOMIZE, script
from tests.job_layout import JobLayout, image_entrypoint, laid_out_job

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def image() -> Iterator[JobLayout]:
    with laid_out_job() as layout:
        root = layout.root
        script(root / "test-bin" / "nvidia-smi", FAKE_NVIDIA_SMI, layout.python)
        script(root / "site" / "sitecustomize.py", SITECUSTOMIZE, layout.python)
        checkpoint = build_checkpoint(root / "models")
        for folder in (root / "test-bin", root / "site", root / "models"):
            for dirpath, _dirs, files in os.walk(folder):
                Path(dirpath).chmod(0o755)
                for name in files:  # a volume the container reads (the writer's umask varies)
                    if not (Path(dirpath) / name).is_symlink():
                        (Path(dirpath) / name).chmod(0o755 if folder.name == "test-bin" else 0o644)
        layout.env["ARTIFACT"] = str(checkpoint)
        yield layout


def docker_run_env(image: JobLayout, **flags: str) -> dict[str, str]:
    """What `docker run -e ...` gives the process: the image's ENV (HOME, PYTHONPATH with
    /packages, the verify image's folders), this machine's PATH with the stand-in
    nvidia-smi, the double on the Python path, and the flags."""
    root = image.root
    path = os.pathsep.join(
        [str(root / "packages"), str(FAKE_TRTLLM), str(root / "site")]
    )  # the serving image's ENV PYTHONPATH="/packages..."; then the double
    env = {
        "HOME": str(image.home),
        "PATH": f"{root / 'test-bin'}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": path,
        "PYTHONUNBUFFERED": "True",
        "CUDA_VERSION": "12.4.1",
        "TMPDIR": str(root / "tmp"),
    }
    env |= {k: v for k, v in image.env.items() if k.startswith("VERIFY_GPU_")}
    return env | flags


def test_the_serve_command_serves_from_app_as_the_non_root_user(image: JobLayout, tmp_path):
    serving, _verify = image.dockerfiles
    port = free_port()
    env = docker_run_env(
        image,
        MTT_ENGINE="trtllm_pytorch",
        MTT_ARTIFACT=image.env["ARTIFACT"],
        INFERENCE_SERVER_PORT=str(port),  # -p HOST:8080 maps it; here a free port
    )
    log_path = tmp_path / "server.log"
    with log_path.open("w") as log:
        process = subprocess.Popen(
            image_entrypoint(serving, image.python),
            cwd=image.path("/app"),  # WORKDIR $APP_HOME
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            **image.as_user(),
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, process, 300, log_path)
        answer = requests.post(
            url + "/v1/models/model:predict",
            json={"prompt": "Hello", "max_new_tokens": 4, "top_k": 1},
            timeout=120,
        )
        assert answer.status_code == 200, answer.text
        assert answer.json()["usage"]["completion_tokens"] >= 1
        engine = requests.get(url + "/version", timeout=30).json()["engine"]
        assert engine == "trtllm_pytorch"
        process.send_signal(signal.SIGTERM)
        assert process.wait(120) in (0, -signal.SIGTERM), log_path.read_text()[-3000:]
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(30)


def test_the_verify_command_writes_its_report_from_the_images_own_server(image: JobLayout):
    _serving, verify = image.dockerfiles
    proc = subprocess.run(
        [*image_entrypoint(verify, image.python), "--kind", "trtllm_pytorch", *CHEAP],
        cwd=image.workdir,  # WORKDIR of the verify image
        env=docker_run_env(image),
        capture_output=True,
        text=True,
        timeout=600,
        **image.as_user(),
    )
    output = proc.stdout + proc.stderr
    out = image.workdir / ".cache" / "verify-gpu"  # the default --out, the image's own
    assert (out / "report.json").is_file(), output[-4000:]
    report = json.loads((out / "report.json").read_text())
    assert proc.returncode == 1, output[-4000:]  # penalties: the double ignores them
    (kind,) = report["kinds"]
    failed = {c["name"] for c in kind["checks"] if not c["passed"]}
    assert kind["kind"] == "trtllm_pytorch" and failed == {"penalties"}, kind["checks"]
    assert (out / "image-server" / "app").resolve() == image.path("/app")
