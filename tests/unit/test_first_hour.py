"""What a newcomer runs first does what the README says: a dry run needs no network,
`make serve` honours (or refuses) settings from the environment, the dev server binds
loopback."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from mistral_build import local_server
from tests.doc_commands import shell_commands

ROOT = Path(__file__).resolve().parents[2]


class CountingListener:
    """A loopback TCP listener that counts connections (a stand-in Hub that never answers)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.accepted = 0
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self.sock.close()


def test_engine_dry_run_never_contacts_the_hub() -> None:
    hub = CountingListener()
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith("HF_HUB_OFFLINE")}
        run = subprocess.run(
            [sys.executable, "build.py", "engine", "--dry-run"],
            cwd=ROOT,
            env=env | {"HF_ENDPOINT": hub.url, "HF_HOME": str(ROOT / ".cache" / "no-hub-home")},
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        hub.close()
    assert run.returncode == 0, run.stderr
    assert "trtllm-build" in run.stdout
    assert hub.accepted == 0


def test_build_py_serve_refuses_environment_settings_it_would_override(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("MTT_ENGINE", "trtllm_pytorch")
    problem = local_server.environment_conflicts({"engine": "pytorch", "device": "cpu"})
    assert problem is not None and "MTT_ENGINE=trtllm_pytorch" in problem
    assert "MTT_ARTIFACT" in problem  # says how to serve another artifact
    monkeypatch.setenv("MTT_ENGINE", "pytorch")
    assert local_server.environment_conflicts({"engine": "pytorch"}) is None


def test_make_serve_takes_the_artifact_from_the_environment() -> None:
    """`MTT_ARTIFACT=... make serve` serves that artifact: make passes no dev-model arguments."""
    run = subprocess.run(
        ["make", "-n", "serve"],
        cwd=ROOT,
        env=os.environ | {"MTT_ARTIFACT": "/models/x", "MTT_ENGINE": "trtllm_pytorch"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    line = next(ln for ln in run.stdout.splitlines() if "build.py serve" in ln)
    assert "--artifact" not in line and "engine=" not in line and "smollm2" not in line


def test_the_dev_server_binds_loopback_by_default() -> None:
    assert local_server.serve_settings(None, host=None)["host"] == "127.0.0.1"
    assert local_server.serve_settings(None, host="0.0.0.0")["host"] == "0.0.0.0"


def run_build_py(args: list[str], env: dict[str, str], timeout: float = 300) -> tuple[int, str]:
    """`python build.py ARGS` in its own process group (all of it is killed past `timeout`:
    a command that should have refused at once may be serving instead)."""
    proc = subprocess.Popen(
        [sys.executable, "build.py", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"build.py {' '.join(args)} still running after {timeout} s:\n{out[-2000:]}")
    return proc.returncode, out


def environ_without_settings() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("MTT_")}


@pytest.mark.parametrize(
    ("args", "env", "line"),
    [
        (
            ["--set", "bogus_key=1"],
            {},
            "cannot serve: --set bogus_key is not a setting (every setting: docs/settings.md)",
        ),
        (
            ["--set", "max_inflite=3"],
            {},
            "cannot serve: --set max_inflite is not a setting (did you mean max_inflight?)",
        ),
        (
            [],
            {"MTT_MAX_INFLITE": "3"},
            "cannot serve: MTT_MAX_INFLITE is not a setting (did you mean MTT_MAX_INFLIGHT?)",
        ),
        (
            ["--set", "max_inflight=zero"],
            {},
            "cannot serve: invalid settings: max_inflight: Input should be a valid integer, "
            "unable to parse string as an integer",
        ),
        (
            ["--set", "max_inflight"],
            {},
            "cannot serve: --set expects KEY=VALUE, got 'max_inflight'",
        ),
    ],
)
def test_build_py_serve_refuses_what_the_server_would_not_take_before_building(
    args: list[str], env: dict[str, str], line: str
) -> None:
    """A typo in a setting's name was served without a word: `build.py serve` (and so
    `make serve`) refuses it, as the server itself does, in one line and at once."""
    port = local_server.free_port()
    rc, out = run_build_py(["serve", "--port", str(port), *args], environ_without_settings() | env)
    assert rc == 2, out
    assert out.strip() == line


# The README's deploy steps that run offline, in its order.
DEPLOY_STEPS = ("cp k8s/values.yaml.example ", "python build.py manifests ", "kubernetes-validate ")


def test_the_readmes_deploy_steps_render_yours_with_a_warning_and_validate_them_all(
    tmp_path: Path,
) -> None:
    """Run as the README writes them, in a copy of the checkout: your rendering goes into
    k8s/ marked as yours (its header names my.yaml, so `make test`'s drift check reads the
    committed example rendering instead: test_k8s), with a warning while the values are
    still the example's placeholders, and the validation command covers every rendered
    file (subfolders too)."""
    readme = ROOT / "README.md"
    # The validation command is in the README's text, the others in its deploy block.
    documented = shell_commands(readme) + re.findall(
        r"`(kubernetes-validate [^`]*\.yaml)`", readme.read_text()
    )
    lines = [line for step in DEPLOY_STEPS for line in documented if line.startswith(step)]
    assert [line.split()[0] for line in lines] == ["cp", "python", "kubernetes-validate"], lines
    repo = tmp_path / "clone"
    repo.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", ".cache")
    for part in ("build.py", "mistral_build", "mistral-trt-truss", "k8s"):
        source = ROOT / part
        if source.is_dir():
            shutil.copytree(source, repo / part, ignore=ignore)
        else:
            shutil.copy2(source, repo / part)
    env = environ_without_settings() | {
        "PATH": os.pathsep.join([str(ROOT / ".venv" / "bin"), os.environ.get("PATH", "")])
    }
    outputs = []
    for line in lines:
        run = subprocess.run(
            ["bash", "-c", line], cwd=repo, env=env, capture_output=True, text=True, timeout=300
        )
        assert run.returncode == 0, (line, run.stdout[-2000:], run.stderr[-2000:])
        outputs.append(run.stdout + run.stderr)
    rendered = repo / "k8s"
    generated = [p for p in rendered.rglob("*.yaml") if p.read_text().startswith("# Generated")]
    assert generated and all("values: my.yaml" in p.read_text() for p in generated)
    assert (rendered / "deployment.yaml").is_file() and (rendered / "verify" / "job.yaml").is_file()
    warning = next(ln for ln in outputs[1].splitlines() if ln.startswith("warning:"))
    assert "still the example's placeholders: image us-docker.pkg.dev/example-project" in warning
    assert "artifact_revision 0123456789abcdef" in warning and "my.yaml" in warning
    validated = {
        Path(ln.split()[1]).relative_to("k8s").as_posix()
        for ln in outputs[2].splitlines()
        if ln.startswith(("INFO", "WARN"))
    }
    written = {p.relative_to(rendered).as_posix() for p in rendered.rglob("*.yaml")}
    assert validated == written  # k8s/*.yaml alone skipped verify/job.yaml and the rest


ENGINE_LINE = "python build.py engine --gpu a100 --push you/mistral-7b-trt-a100"


def test_building_an_engine_outside_the_container_is_refused_without_the_hub() -> None:
    """The README's engine line, on a machine without TensorRT-LLM: it asked the Hub for
    the checkpoint's config first (24 s of retries without a network) before refusing."""
    assert ENGINE_LINE in shell_commands(ROOT / "README.md")
    hub = CountingListener()
    try:
        env = environ_without_settings() | {
            "HF_ENDPOINT": hub.url,
            "HF_HOME": str(ROOT / ".cache" / "no-hub-home"),
        }
        rc, out = run_build_py(ENGINE_LINE.split()[2:], env, timeout=120)
    finally:
        hub.close()
    assert rc == 2, out
    lines = out.strip().splitlines()
    assert lines[0].startswith("NVIDIA driver: "), out
    assert lines[1].startswith("refused: tensorrt_llm is not importable here"), out
    assert all(line.startswith("refused: ") for line in lines[1:]), out
    assert hub.accepted == 0


def test_a_push_without_the_hub_is_one_line(dev_model: Path, tmp_path: Path) -> None:
    """An unreachable Hub (no network) printed a 77-line traceback."""
    hub = CountingListener()  # accepts and closes: no answer ever comes
    url = hub.url
    try:
        env = environ_without_settings() | {"HF_ENDPOINT": hub.url, "HF_TOKEN": "hf_not_a_token"}
        args = ["engine", "--backend", "pytorch", "--checkpoint-dir", str(dev_model)]
        args += ["--max-seq-len", "1024", "--max-input-len", "512"]
        args += ["--output-dir", str(tmp_path / "artifact"), "--push", "you/dev-model"]
        rc, out = run_build_py(args, env, timeout=300)
    finally:
        hub.close()
    assert rc == 1, out
    assert "Traceback" not in out, out
    last = out.strip().splitlines()[-1]
    assert last.startswith(f"failed: the Hugging Face Hub at {url}: "), last
