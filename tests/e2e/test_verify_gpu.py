"""`python build.py verify-gpu` itself, end to end, without a GPU:

- `--kind pytorch`: the dev model on our PyTorch engine, on the real Truss server: every
  check and the report must pass;
- `--kind all` through the TensorRT-LLM test double (tests/doubles/fake_tensorrt_llm) on
  the server's PYTHONPATH, run the way the verify Job runs it (tests/job_layout.py: its
  uid 60000, the read-only root-owned working directory, HOME and the emptyDirs as
  k8s/verify/job.yaml and the Dockerfiles lay them out, the Job's env and command): the engine build runs `build.py engine`'s real commands against
  stand-in `convert_checkpoint.py` and `trtllm-build` scripts (they check our flags with
  argparse, as the real ones do, and write an engine directory; trtllm-build writes its
  timing cache where upstream does, `./model.cache` unless told), a stand-in `nvidia-smi`
  reports an H100, and a `sitecustomize` shows the server process the same GPU through
  torch.cuda and slows the double's steps so streams stay in flight while checks hold
  them. The double records penalties without applying them, so the penalties check must
  fail there, and the command must exit 1: that shows the check and the exit code can fail.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.job_layout import JobLayout, laid_out_job

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
FAKE_TRTLLM = REPO / "tests" / "doubles" / "fake_tensorrt_llm"
CHECKS = [
    "server_ready",
    "health_and_models",
    "streaming_equals_non_streaming",
    "stop_strings",
    "penalties",
    "concurrency",
    "long_prompt",
    "logprobs",
    "kv_gauge",
    "abort_on_disconnect",
    "abort_streamed_logprobs",
    "overload_503",
    "benchmark",
    "drain_on_sigterm",
]
# The checks that compare greedy answers (a near tie there is a WARN, not a FAIL).
NEAR_TIE_CHECKS = {
    "streaming_equals_non_streaming",
    "concurrency",
    "long_prompt",
    "drain_on_sigterm",
}
# Small enough for 2 CPU cores: the figures are not the point here.
CHEAP = ["--bench-prompts", "3", "--drain-tokens", "48", "--ready-timeout", "180"]

FAKE_NVIDIA_SMI = """\
import sys
values = {"name": "NVIDIA H100 80GB HBM3", "compute_cap": "9.0", "memory.total": "81559",
          "driver_version": "570.00"}
query = next(a for a in sys.argv if a.startswith("--query-gpu="))[len("--query-gpu="):]
print(", ".join(values[k] for k in query.split(",")))
"""
FAKE_CONVERT = """\
import argparse, json, pathlib
p = argparse.ArgumentParser()
for flag in ("--model_dir", "--output_dir", "--dtype"):
    p.add_argument(flag, required=True)
p.add_argument("--tp_size", type=int, default=1)
a = p.parse_args()  # an unknown flag exits 2, as the real script's argparse does
hf = json.loads((pathlib.Path(a.model_dir) / "config.json").read_text())
out = pathlib.Path(a.output_dir); out.mkdir(parents=True, exist_ok=True)
config = {"architecture": "LlamaForCausalLM", "dtype": a.dtype, "vocab_size": hf["vocab_size"],
          "max_position_embeddings": hf["max_position_embeddings"],
          "mapping": {"world_size": a.tp_size, "tp_size": a.tp_size, "pp_size": 1}}
(out / "config.json").write_text(json.dumps(config))
(out / "rank0.safetensors").write_bytes(b"weights")
print("converted")
"""
FAKE_TRTLLM_BUILD = """\
import argparse, json, os, pathlib
import tensorrt_llm  # the double: the engine records the version that built it
p = argparse.ArgumentParser()
for flag in ("--checkpoint_dir", "--output_dir", "--gemm_plugin", "--gpt_attention_plugin",
             "--kv_cache_type", "--remove_input_padding", "--context_fmha",
             "--use_paged_context_fmha", "--multiple_profiles", "--log_level",
             "--input_timing_cache"):
    p.add_argument(flag)
# Upstream's default: `model.cache` in the working directory (BuildConfig.output_timing_cache).
p.add_argument("--output_timing_cache", default="model.cache")
for flag in ("--max_batch_size", "--max_input_len", "--max_seq_len", "--max_num_tokens",
             "--max_beam_width", "--workers"):
    p.add_argument(flag, type=int)
a = p.parse_args()
if a.input_timing_cache and os.path.exists(a.input_timing_cache):
    pathlib.Path(a.input_timing_cache).read_bytes()
# builder.py `build`: save_timing_cache opens the path for writing, then `assert ok`.
with open(a.output_timing_cache, "wb") as f:
    f.write(b"timing cache")
pretrained = json.loads((pathlib.Path(a.checkpoint_dir) / "config.json").read_text())
build = {k: getattr(a, k) for k in ("max_batch_size", "max_input_len", "max_seq_len",
                                    "max_num_tokens", "max_beam_width")}
build["plugin_config"] = {"use_paged_context_fmha": a.use_paged_context_fmha == "enable"}
out = pathlib.Path(a.output_dir); out.mkdir(parents=True, exist_ok=True)
(out / "config.json").write_text(json.dumps(
    {"version": tensorrt_llm.__version__, "pretrained_config": pretrained, "build_config": build}))
(out / "rank0.engine").write_bytes(b"engine" * 100)
print("Total time of building all engines: 00:00:01")
"""
# Only in the server process (the one with INFERENCE_SERVER_PORT): torch.cuda shows the
# same H100 as the stand-in nvidia-smi, and each step of the double takes 10 ms.
SITECUSTOMIZE = """\
import os
if os.environ.get("INFERENCE_SERVER_PORT"):
    import torch
    torch.cuda.is_available = lambda: True
    torch.cuda.device_count = lambda: 1
    torch.cuda.get_device_capability = lambda device=None: (9, 0)
    torch.cuda.get_device_name = lambda device=None: "NVIDIA H100 80GB HBM3"
    import tensorrt_llm.llmapi.llm as fake
    _init = fake.BaseLLM.__init__
    def _slow_init(self, *args, **kwargs):
        _init(self, *args, **kwargs)
        self.step_delay = 0.01
    fake.BaseLLM.__init__ = _slow_init
"""


def script(path: Path, body: str, python: str = sys.executable) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!{python}\n" + textwrap.dedent(body))
    path.chmod(0o755)
    return path


def verify(args: list[str], env: dict[str, str], out: Path) -> tuple[int, str, dict]:
    proc = subprocess.run(
        [sys.executable, str(REPO / "build.py"), "verify-gpu", "--out", str(out), *CHEAP, *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    output = proc.stdout + proc.stderr
    report = out / "report.json"
    assert report.is_file(), output[-4000:]
    return proc.returncode, output, json.loads(report.read_text())


def checks_of(kind: dict) -> dict[str, dict]:
    return {c["name"]: c for c in kind["checks"]}


def test_pytorch_kind_passes_every_check_and_writes_the_report(dev_model, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    code, output, report = verify(["--kind", "pytorch"], env, tmp_path / "out")
    assert code == 0, output[-4000:]
    assert report["passed"] is True
    (kind,) = report["kinds"]
    checks = checks_of(kind)
    assert list(checks) == CHECKS
    # On the CPU the dev model is deterministic: every check passes outright; only the
    # greedy comparisons may show a near tie (WARN), never another verdict.
    verdicts = {n: c["verdict"] for n, c in checks.items()}
    assert {n for n, v in verdicts.items() if v != "PASS"} <= NEAR_TIE_CHECKS, checks
    assert all(c["passed"] for c in checks.values()), checks
    assert "engine pytorch" in checks["health_and_models"]["detail"]
    assert "(max_num_tokens 64) answered" in checks["long_prompt"]["detail"]
    assert "top_logprobs=2:" in checks["logprobs"]["detail"]
    assert "back to 0 after" in checks["kv_gauge"]["detail"]
    assert "may be turned on" in checks["abort_streamed_logprobs"]["detail"]
    assert "shutdown + exit" in checks["drain_on_sigterm"]["detail"]
    points = kind["bench"]["points"]
    assert [p["concurrency"] for p in points] == [1, 8]
    assert all(p["completed"] == 3 and p["output_throughput"] > 0 for p in points)
    assert report["versions"]["truss"] and report["versions"]["torch"]
    md = (tmp_path / "out" / "report.md").read_text()
    assert md.startswith("# verify-gpu: PASSED") and "| drain_on_sigterm | pass |" in md
    assert md in output  # the summary is printed too


@pytest.fixture
def job() -> Iterator[JobLayout]:
    """The verify Job's user, read-only working directory, HOME, emptyDirs and env."""
    with laid_out_job() as layout:
        yield layout


def test_the_job_layout_is_the_images_and_the_jobs(job: JobLayout):
    """What the run below relies on, so a layout that went soft fails here first."""
    assert job.env["HOME"] == str(job.home) and job.home == job.path("/home/app")
    if os.geteuid() == 0:
        assert (job.workdir.stat().st_uid, job.home.stat().st_uid) == (0, job.uid)
    probe = (
        "import os, pathlib; home = pathlib.Path.home(); "
        "print(os.access('.', os.W_OK), (home / '.cache').stat().st_uid == os.getuid()); "
        "(home / '.cache' / 'flashinfer').mkdir(); "  # FlashInfer's JIT cache, the Hub's
        "(home / '.cache' / 'huggingface').mkdir()"
    )
    proc = subprocess.run(
        [job.python, "-c", probe],
        cwd=job.workdir,
        env=job.env,
        capture_output=True,
        text=True,
        timeout=60,
        **job.as_user(),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["False", "True"]  # read-only cwd, a HOME cache of its own


def test_tensorrt_llm_kinds_through_the_double(dev_model, job: JobLayout):
    root = job.root
    bin_dir, examples = root / "test-bin", root / "examples"
    script(bin_dir / "nvidia-smi", FAKE_NVIDIA_SMI, job.python)
    script(bin_dir / "trtllm-build", FAKE_TRTLLM_BUILD, job.python)
    script(
        examples / "models" / "core" / "llama" / "convert_checkpoint.py", FAKE_CONVERT, job.python
    )
    script(root / "site" / "sitecustomize.py", SITECUSTOMIZE, job.python)
    for path in (bin_dir, examples, root / "site"):
        for dirpath, _dirs, _files in os.walk(path):
            Path(dirpath).chmod(0o755)
    env = {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": os.pathsep.join([str(FAKE_TRTLLM), str(root / "site")]),
        "CUDA_VERSION": "12.4.1",  # the stand-in nvidia-smi's driver 570.00 runs it
    }
    out = job.path("/tmp/verify-gpu")

    proc = job.run([*CHEAP, "--examples-dir", str(examples)], env=env)
    output = proc.stdout + proc.stderr
    assert (out / "report.json").is_file(), output[-4000:]
    report = json.loads((out / "report.json").read_text())

    assert proc.returncode == 1, output[-4000:]  # the penalties check fails on the double
    assert report["passed"] is False
    assert [k["kind"] for k in report["kinds"]] == ["tensorrt_llm", "trtllm_pytorch"]
    engine_kind, pytorch_kind = report["kinds"]
    assert not list(job.workdir.glob("model.cache"))
    # Served from the image's own server folders (the verify image's VERIFY_GPU_* ENV).
    assert (out / "image-server" / "app").resolve() == job.path("/app")
    assert not (out / "truss-context").exists()

    # The engine was built by build.py engine's own commands, from the tiny checkpoint.
    build = engine_kind["build"]
    assert build["status"] == "built", build
    assert build["gpu_target"] == "h100"
    assert "convert_checkpoint.py" in build["commands"][0]
    assert build["commands"][1].startswith("trtllm-build ")
    assert (out / "engine.work" / "timing.cache").read_bytes() == b"timing cache"
    engine_config = json.loads((out / "engine" / "config.json").read_text())
    assert engine_config["version"] == "1.2.1"
    assert engine_config["build_config"]["max_seq_len"] == 32768
    assert engine_config["pretrained_config"]["dtype"] == "float16"
    assert (out / "engine" / "build_manifest.json").is_file()
    checkpoint = json.loads((out / "checkpoint" / "config.json").read_text())
    assert checkpoint["hidden_size"] // checkpoint["num_attention_heads"] == 64
    assert "[trtllm_pytorch] engine build skipped: trtllm_pytorch serves the checkpoint" in output
    assert pytorch_kind["build"]["status"] == "skipped"

    for kind, name in ((engine_kind, "tensorrt_llm"), (pytorch_kind, "trtllm_pytorch")):
        checks = checks_of(kind)
        first = ["driver_vs_cuda", "tensorrt_llm_import"]
        first += ["build"] if name == "tensorrt_llm" else []
        assert list(checks) == first + CHECKS
        assert checks["driver_vs_cuda"]["verdict"] == "PASS"
        assert checks["tensorrt_llm_import"]["verdict"] == "PASS"
        assert "driver 570.00, image CUDA 12.4.1" in checks["driver_vs_cuda"]["detail"]
        assert kind["server"]["settings"]["trtllm_kv_block_reuse"] == "false"
        failed = {n for n, c in checks.items() if not c["passed"]}
        assert failed == {"penalties"}, {n: checks[n]["detail"] for n in failed}
        assert "left the greedy output unchanged" in checks["penalties"]["detail"]
        assert f"engine {name}" in checks["health_and_models"]["detail"]
        assert kind["server"]["settings"]["engine"] == name
    assert report["versions"]["tensorrt_llm"].startswith("1.2.1 (no package metadata")
    assert report["gpu"][0]["name"] == "NVIDIA H100 80GB HBM3"
    md = (out / "report.md").read_text()
    assert md.startswith("# verify-gpu: FAILED") and "| penalties | **FAIL** |" in md
