"""Every shell command that README.md and docs/*.md show is accounted for: run here as a
reader would (a fresh shell, the venv activated as the README says, the stated time as
the limit) and checked for what the text promises, or covered by a named test, or named
as something that cannot run on this machine with the reason. A new command in the docs
fails `test_every_command_is_accounted_for` until it is given one of the three."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from mistral_build.local_server import free_port
from tests.doc_commands import ROOT, all_commands

pytestmark = pytest.mark.e2e

SERVED_NAME = "smollm2-135m-instruct"  # what `make serve` names it


@dataclass(frozen=True)
class Run:
    """Run it against `make serve`'s model within `timeout_s` (the time the docs state,
    with room for a busy machine); `expect` must match its output."""

    timeout_s: float
    expect: str = ""
    returncode: int = 0


@dataclass(frozen=True)
class Covered:
    """Run, in the form the docs show, by this test file."""

    test: str


@dataclass(frozen=True)
class NotHere:
    """Cannot run on this machine, for this reason."""

    reason: str


GPU = NotHere("needs an NVIDIA GPU with TensorRT-LLM (docs/verify-on-gpu.md: the verify image)")
CLUSTER = NotHere("needs a Kubernetes cluster; the manifests are strict-validated offline")
DOCKER = NotHere("needs a Docker engine (none here); the build context is rendered by tests")
WEIGHTS = NotHere("needs a real 7B checkpoint or engine; no weights can be downloaded here")

# The bound on a command that generates with SmolLM2 (up to 256 tokens): on this 2-core
# machine at a load average of 12, "What is a mistral?" had streamed ~70 tokens after 60 s.
GENERATES_S = 600

# First match wins. Each pattern is searched in the command, or in "DOCUMENT: COMMAND"
# when it starts by naming a document.
RULES: list[tuple[str, Run | Covered | NotHere]] = [
    # -- the two set-up commands
    (r"^make test$", NotHere("it is the command that runs this test")),
    (r"^make serve$", Run(300, r"Truss server on http://127\.0\.0\.1")),
    (r"^make serve MODEL=dev-mistral$", Run(300, r"Truss server on http://127\.0\.0\.1")),
    (r"^make clean venv", NotHere("it deletes the venv this test runs in")),
    (r"make serve$", GPU),  # MTT_ENGINE=trtllm_pytorch ... make serve
    (r"^make verify-gpu", GPU),
    (r"^make soak|soak\.py", NotHere("a ~6-minute soak, a benchmark (docs/reliability.md)")),
    (r"^make test-stress", NotHere("the end-to-end suite three times under CPU hogs: ~30 min")),
    # -- calling the server: the README's `$` examples
    (r"^README\.md: curl ", Covered("tests/e2e/test_readme.py")),  # its `$` examples
    (
        r"^python -m client \"What is the capital of France\?\" --chat --stream$",
        Run(GENERATES_S, r"Paris"),
    ),  # fmt: skip
    (
        r"^python -m client bench --concurrency 1,4 --num-prompts 8 ",
        Run(300, r"wrote .*results\.json"),
    ),
    (r"^python -m client \"What is a mistral\?\" --chat --stream$", Run(GENERATES_S, r"\w")),
    (
        r"^python -m client \"What is a mistral\?\" --chat --max-new-tokens 64 .*--json$",
        Run(GENERATES_S, r'"finish_reason"'),
    ),  # fmt: skip
    (r"^python -m client \"Hello\" --chat --system", Run(GENERATES_S, r"\w")),
    (r"^echo \"long prompt\" \| python -m client - --chat --stream$", Run(GENERATES_S, r"\w")),
    (r"^python -m client \"Hi\" --api openai --url http://127\.0\.0\.1:8000", Run(300, r"\w")),
    (r"^python -m client bench .*\.\.\.$", NotHere("options elided (`...`) in the docs")),
    (
        r"^python -m client bench .*--num-prompts (200|512)",
        NotHere("a GPU-sized sweep: hours on a CPU (the options exist: test_readme_commands)"),
    ),  # fmt: skip
    (r"^python -m client bench --dataset prompts\.jsonl", NotHere("your own prompt file")),
    (
        r"^python -m client bench .*--extra-body ",
        NotHere("a structured-output load at 16 streams (GPU-sized); --extra-body is unit-tested"),
    ),
    (
        r"^python -m client bench --one-at-a-time --num-prompts 20",
        NotHere("20 x 128 tokens one after another: minutes on a CPU; the mode is unit-tested"),
    ),  # fmt: skip
    (
        r"^python -m client bench plot bench/results/ours",
        NotHere("plots results of two earlier runs"),
    ),
    (
        r"^python -m client bench --url http://127\.0\.0\.1:8931",
        Covered("tests/e2e/test_bench_e2e.py"),
    ),
    (r"^python -m pytest tests/unit -k client$", Run(600, r"passed")),
    (r"^python -m pytest tests/e2e/test_client_e2e\.py", Covered("tests/e2e/test_client_e2e.py")),
    # -- build, image, manifests
    (r"^python build\.py engine --help$", Run(60, r"--dry-run")),
    (
        r"^python build\.py engine --gpu a100 --push you/",
        Covered("tests/unit/test_first_hour.py"),  # its refusal outside the container
    ),
    (r"^python3? build\.py engine", WEIGHTS),
    (r"^python build\.py serve --artifact", WEIGHTS),
    (r"^python build\.py truss-config --check$", Run(120, r"", 0)),
    (r"^cp k8s/values\.yaml\.example my\.yaml$", Covered("tests/unit/test_k8s.py")),
    (
        r"^cp k8s/values-(gcsfuse|volume)\.yaml\.example my\.yaml$",
        Covered("tests/unit/test_k8s_sources.py"),
    ),
    (
        r"^python build\.py copy-to-bucket --artifact-dir ENGINE_DIR ",
        Covered("tests/unit/test_k8s_bucket.py"),
    ),
    (r"^python build\.py (--values|image|manifests)", Covered("tests/unit/test_k8s.py")),
    (
        r"^kubernetes-validate --strict k8s/\*\.yaml k8s/\*/\*\.yaml$",
        Covered("tests/unit/test_first_hour.py"),  # after the README's steps, in a copy
    ),
    (r"^kubectl ", CLUSTER),
    (r"^gcloud ", NotHere("needs a Google Cloud project and credentials; never run here")),
    (r"^docs/(deploy|verify-on-gpu)\.md: curl ", CLUSTER),  # against the deployed Service
    (r"^docs/tensorrt-llm\.md: curl ", GPU),
    (r"^docker ", DOCKER),
    # -- GPU machine and TensorRT-LLM container steps
    (r"^python3? bench/(guided_bench|replay_bench)\.py", NotHere("GPU-machine benchmarks")),
    (r"^bash bench/run_gpu\.sh prepare$", NotHere("downloads wheels for a GPU machine")),
    (r"^bash bench/run_gpu", NotHere("needs an NVIDIA GPU with 80 GB (docs/performance.md)")),
    (r"^python bench/plots\.py", NotHere("rewrites docs/perf/engine-variants.png")),
    (r"^python3? -m pip (download|install)", NotHere("packing wheels for the GPU machine")),
    (r"^pip (freeze|install)", NotHere("inside the TensorRT-LLM release container")),
    (r"^echo /\.whl/", NotHere("sets up the GPU machine's carry folder")),
    (r"^source \.venv/bin/activate$", Covered("tests/e2e/test_doc_commands.py")),
    (r"^python3? -c \"import (tensorrt_llm|truss|json)", GPU),
    (r"^python /app/tensorrt_llm/", GPU),
    # docs/verify-on-gpu.md shows build.py engine's golden commands (generated into it).
    (r"^python3 /app/tensorrt_llm/examples/", Covered("tests/unit/test_build_engine_commands.py")),
    (r"^cp /models/", GPU),
    (
        r"^python -m pytest tests/unit/test_trtllm_engine\.py",
        Covered("tests/unit/test_trtllm_engine.py"),
    ),
]


def verdict(command: str, doc: str = "") -> Run | Covered | NotHere | None:
    for pattern, what in RULES:
        names_doc = re.match(r"\^?(README|docs/)", pattern) is not None
        if re.search(pattern, f"{doc}: {command}" if names_doc else command):
            return what
    return None


COMMANDS = all_commands()


def test_every_command_is_accounted_for() -> None:
    missing = [f"{doc}: {cmd}" for doc, cmd in COMMANDS if verdict(cmd, doc) is None]
    assert not missing, "commands without a rule (add one to RULES):\n" + "\n".join(missing)
    for _, what in RULES:
        if isinstance(what, Covered):
            assert (ROOT / what.test).is_file(), what.test


def test_the_rules_can_fail() -> None:
    assert verdict("rm -rf /") is None
    assert isinstance(verdict("make test"), NotHere)


def fresh_shell_env() -> dict[str, str]:
    """A new terminal's environment: nothing of this test's venv or Python path."""
    drop = ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "MTT_", "PYTEST_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    venv_bin = str(ROOT / ".venv" / "bin")
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p != venv_bin)
    return env


def in_fresh_shell(command: str) -> list[str]:
    """What the README says to do in a new shell: activate the venv, then the command."""
    return ["bash", "-c", f"source .venv/bin/activate && {command}"]


def pointed_at(command: str, url: str, tmp: Path) -> str:
    """The command with the server's address (and a scratch output folder) in place of the
    docs' (port and paths aside, it is the same command)."""
    host = url.removeprefix("http://")
    command = re.sub(r"(localhost|127\.0\.0\.1):(8080|8000)", host, command)
    command = re.sub(r"--out \S+", f"--out {shlex.quote(str(tmp / 'out'))}", command)
    if "python -m client" in command and "--url" not in command:
        command += f" --url {url}"
    return command


RUNS = [(doc, cmd) for doc, cmd in COMMANDS if isinstance(verdict(cmd, doc), Run)]
CLIENT_RUNS = [(d, c) for d, c in RUNS if not c.startswith("make serve")]
SERVE_RUNS = [(d, c) for d, c in RUNS if c.startswith("make serve")]


@pytest.mark.parametrize(("doc", "command"), CLIENT_RUNS, ids=[c[:60] for _, c in CLIENT_RUNS])
def test_command_runs_as_the_docs_say(
    doc: str, command: str, smollm2_url: str, tmp_path: Path
) -> None:
    rule = verdict(command, doc)
    assert isinstance(rule, Run)
    line = pointed_at(command, smollm2_url, tmp_path)
    # Its own process group: past the limit the command and all it started are killed
    # (subprocess.run's timeout kills only the shell; its children would run on).
    run = subprocess.Popen(
        in_fresh_shell(line),
        cwd=ROOT,
        env=fresh_shell_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = run.communicate(timeout=rule.timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(run.pid, signal.SIGKILL)
        stdout, stderr = run.communicate(timeout=60)
        pytest.fail(
            f"{line} did not finish within {rule.timeout_s} s:\n{(stdout + stderr)[-3000:]}"
        )
    finally:
        if run.poll() is None:  # interrupted otherwise (the test's own limit)
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
    out = stdout + stderr
    assert run.returncode == rule.returncode, (doc, line, out[-3000:])
    assert re.search(rule.expect, out), (doc, line, out[-3000:])


@pytest.mark.parametrize(("doc", "command"), SERVE_RUNS, ids=[c for _, c in SERVE_RUNS])
def test_make_serve_starts_as_the_readme_says(doc: str, command: str) -> None:
    """`make serve` from a fresh shell: it prints where it listens, becomes ready on
    127.0.0.1 within the stated time, answers, and stops on Ctrl-C."""
    rule = verdict(command, doc)
    assert isinstance(rule, Run)
    port = free_port()
    env = fresh_shell_env() | {"PORT": str(port)}
    proc = subprocess.Popen(
        shlex.split(command),
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + rule.timeout_s
        ready = False
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                ready = requests.get(f"http://127.0.0.1:{port}/v1/models/model", timeout=5).ok
            except requests.RequestException:  # not up yet, or too busy loading to answer
                ready = False
            if ready:
                break
            time.sleep(1)
        assert ready, f"not ready within {rule.timeout_s} s"
        answer = requests.post(
            f"http://127.0.0.1:{port}/v1/models/model:predict",
            json={"prompt": "Hello", "max_new_tokens": 2},
            timeout=60,
        )
        assert answer.status_code == 200, answer.text
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            out, _ = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
    assert re.search(rule.expect, out), out[-3000:]
    assert "listening on 127.0.0.1" in out
    assert f'"message": "ready on http://127.0.0.1:{port}"' in out  # JSON lines: no terminal
    assert "Traceback" not in out and "nanobind" not in out, out[-3000:]  # Ctrl-C is quiet


def python_blocks(path: Path) -> list[str]:
    blocks, current = [], None
    for line in path.read_text(encoding="utf-8").splitlines():
        if current is None and line.strip() == "```python":
            current = []
        elif current is not None and line.startswith("```"):
            blocks.append("\n".join(current))
            current = None
        elif current is not None:
            current.append(line)
    return blocks


def test_the_client_library_snippet_answers_from_outside_the_checkout(
    smollm2_url: str, tmp_path: Path
) -> None:
    """docs/client.md's library example, as written (the server's address aside), run from
    a directory outside the checkout with the venv active: `from client import ...` needs
    the installed package, and its first call must answer `make serve`'s chat model."""
    snippet = python_blocks(ROOT / "docs" / "client.md")[0]
    assert "http://127.0.0.1:8080" in snippet
    script = tmp_path / "snippet.py"
    script.write_text(snippet.replace("http://127.0.0.1:8080", smollm2_url))
    run = subprocess.run(
        [
            "bash",
            "-c",
            f"source {shlex.quote(str(ROOT / '.venv/bin/activate'))} && python snippet.py",
        ],
        cwd=tmp_path,
        env=fresh_shell_env(),
        capture_output=True,
        text=True,
        timeout=GENERATES_S,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    # The chat answer, its finish reason and usage; the streamed answer, then its own.
    printed = re.fullmatch(
        r"(?s)(.*?) \w+ Usage\(.*?\)\n(.*?)\n\w+ (None|Usage\(.*?\))\n(.*)", run.stdout
    )
    assert printed, run.stdout
    assert "Paris" in printed[1], run.stdout
    assert printed[2].strip() and "\ufffd" not in printed[2], run.stdout
    assert "error:" not in printed[4], run.stdout
