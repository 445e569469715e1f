"""What each kind serves: the tiny checkpoint, the tiny engine built from it by `build.py
engine`'s own code (or an --engine-dir), and the server settings for it."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from mistral_build.paths import CACHE_DIR, DEV_MODEL_DIR
from mistral_build.verify.config import (
    COMMON_SETTINGS,
    ENGINE_LIMITS,
    GPU_SETTINGS,
    MAX_NUM_TOKENS,
    TINY_DTYPE,
    TINY_SHAPE,
    Kind,
    VerifyOptions,
)


def build_checkpoint(out_dir: Path) -> Path:
    """The tiny Mistral-shaped checkpoint, by the dev model's code (rebuilt only when its
    shape changed)."""
    from mistral_build.dev_model import build_dev_model

    return build_dev_model(out_dir / "checkpoint", shape=TINY_SHAPE, dtype=TINY_DTYPE)


def pick_gpu_target(gpu_option: str | None) -> str:
    """The build target matching this machine's GPU (an engine runs only there)."""
    from mistral_build.gpu import TARGETS, detect_gpus, matches_target

    if gpu_option:
        return gpu_option
    gpus = detect_gpus()
    if not gpus:
        raise RuntimeError("no NVIDIA GPU found (nvidia-smi lists none)")
    for name in TARGETS:
        if matches_target(gpus[0], name):
            return name
    raise RuntimeError(
        f"{gpus[0].name} (sm {gpus[0].compute_capability}) is none of the build targets "
        f"({', '.join(TARGETS)}): pass --gpu, or --engine-dir, or use --kind trtllm_pytorch"
    )


def installed_trtllm_version() -> str | None:
    """The package's version; for a tree without metadata (a test double), its
    `__version__`, read in a subprocess so this process does not import it."""
    from mistral_build.engine import package_version

    version = package_version("tensorrt_llm", "tensorrt-llm")
    if version:
        return version
    probe = subprocess.run(
        [sys.executable, "-c", "import tensorrt_llm; print(tensorrt_llm.__version__)"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if probe.returncode != 0:
        return None
    return probe.stdout.strip() or None


def build_engine(
    checkpoint: Path, out_dir: Path, gpu: str | None, examples_dir: str
) -> dict[str, Any]:
    """`build.py engine --checkpoint-dir <tiny checkpoint>`, through the same functions."""
    from mistral_build import engine

    output_dir, workdir = out_dir / "engine", out_dir / "engine.work"
    opts = engine.EngineOptions(
        checkpoint_dir=checkpoint,
        output_dir=output_dir,
        workdir=workdir,
        dtype="float16",
        gpu=pick_gpu_target(gpu),
        examples_dir=examples_dir,
        **ENGINE_LIMITS,
    )
    for path in (output_dir, workdir):
        shutil.rmtree(path, ignore_errors=True)  # ours: a previous verify-gpu run
    model = engine.read_model_facts(opts, None)
    facts = engine.gather_facts(opts)
    if facts.trtllm_version == "unknown":
        facts.trtllm_version = installed_trtllm_version() or "unknown"
    problems = engine.check_options(opts, model) + engine.check_environment(
        opts, facts, model, download=False
    )
    if problems:
        raise RuntimeError("; ".join(problems))
    paths = engine.build_paths(opts)
    commands = [shlex.join(s.argv) for s in engine.plan_steps(opts, paths, sys.executable)]
    started = time.monotonic()
    artifact = engine.build_trtllm_engine(opts, facts, token=None)
    return {
        "status": "built",
        "artifact": str(artifact),
        "seconds": round(time.monotonic() - started, 1),
        "gpu_target": opts.gpu,
        "commands": commands,
        "logs": str(paths.logs_dir),
    }


def prepare_artifact(kind: Kind, opts: VerifyOptions) -> tuple[str, dict[str, Any]]:
    """(artifact path, build record). Prints one line saying what is built or skipped."""
    if kind == "pytorch":
        from mistral_build.dev_model import build_dev_model

        path = build_dev_model(DEV_MODEL_DIR)
        return str(path), {"status": "skipped", "reason": "the dev model serves as is"}
    checkpoint = build_checkpoint(opts.out)
    if kind == "trtllm_pytorch":
        reason = "trtllm_pytorch serves the checkpoint directly: no engine build"
        print(f"[{kind}] engine build skipped: {reason}", flush=True)
        return str(checkpoint), {"status": "skipped", "reason": reason}
    if opts.engine_dir is not None:
        reason = f"--engine-dir {opts.engine_dir} given"
        print(f"[{kind}] engine build skipped: {reason}", flush=True)
        return str(opts.engine_dir), {"status": "skipped", "reason": reason}
    print(f"[{kind}] building a tiny engine from {checkpoint} (minutes)", flush=True)
    record = build_engine(checkpoint, opts.out, opts.gpu, opts.examples_dir)
    return str(record["artifact"]), record


def server_settings(kind: Kind, artifact: str, overrides: dict[str, str]) -> dict[str, str]:
    from mistral_build.local_server import dev_settings

    if kind == "pytorch":
        base = dev_settings(Path(artifact))
    else:
        base = {"artifact": artifact, "engine": kind, "cache_dir": str(CACHE_DIR / "artifacts")}
        base |= GPU_SETTINGS
    if kind != "tensorrt_llm":  # a TensorRT engine has its own, from its build
        base["max_num_tokens"] = str(MAX_NUM_TOKENS[kind])
    return base | COMMON_SETTINGS | overrides


def max_num_tokens_of(kind: Kind, artifact: str, settings: dict[str, str]) -> int:
    """Prompt tokens per engine step for the long-prompt check: the setting, or for a
    TensorRT engine its config.json's build_config (an --engine-dir may differ from ours)."""
    if kind == "tensorrt_llm":
        try:
            config = json.loads((Path(artifact) / "config.json").read_text())
            return int(config["build_config"]["max_num_tokens"])
        except (OSError, ValueError, KeyError, TypeError):
            return MAX_NUM_TOKENS[kind]
    return int(settings.get("max_num_tokens", MAX_NUM_TOKENS[kind]))
