"""The exact commands `build.py engine` runs, held against golden files.

Regenerate after an intended change with:
    UPDATE_GOLDEN=1 python -m pytest tests/unit/test_build_engine_commands.py
and review the diff of tests/golden/engine_commands/ before committing it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mistral_build.engine import (
    EngineOptions,
    build_paths,
    plan_steps,
    render_plan,
)

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "engine_commands"
REPO = Path(__file__).resolve().parents[2]
FIXED = dict(output_dir=Path("/artifacts/engine"), workdir=Path("/scratch/engine-build"))

CASES: dict[str, dict] = {
    "default_bf16_a100": {},
    "bf16_tp2_h100": dict(dtype="bfloat16", tp_size=2, gpu="h100"),
    "int8_wo_a100": dict(quantization="int8_wo"),
    "int8_sq_int8_kv_a100": dict(
        quantization="int8_sq", kv_cache_dtype="int8", calib_dataset="/data/calib"
    ),
    "fp16_80gb_a100": dict(dtype="float16", max_batch_size=256),
    "int4_wo_a100": dict(quantization="int4_wo", max_batch_size=128),
    "int4_awq_a100": dict(quantization="int4_awq", calib_size=64),
    "fp8_h100": dict(quantization="fp8", gpu="h100", calib_dataset="/data/calib"),
    "local_checkpoint_short_context": dict(
        checkpoint_dir=Path("/models/mistral-7b"),
        max_input_len=4096,
        max_seq_len=8192,
        max_num_tokens=4096,
        push="acme/mistral-7b-trt",
        push_revision="a100-fp16",
    ),
}

# Flags each TensorRT-LLM 1.2.x tool accepts (read from its argparse definitions), so a typo
# in our commands fails here instead of 10 minutes into a GPU build.
# tensorrt_llm/commands/build.py (parse_arguments) + tensorrt_llm/plugin/plugin.py
# (cli_plugin_args, exposed by add_plugin_argument):
TRTLLM_BUILD_FLAGS = {
    "checkpoint_dir",
    "model_config",
    "build_config",
    "output_dir",
    "max_batch_size",
    "max_input_len",
    "max_seq_len",
    "max_beam_width",
    "max_num_tokens",
    "opt_num_tokens",
    "kv_cache_type",
    "workers",
    "log_level",
    "gemm_plugin",
    "gpt_attention_plugin",
    "context_fmha",
    "remove_input_padding",
    "use_paged_context_fmha",
    "tokens_per_block",
    "multiple_profiles",
    "use_fp8_context_fmha",
    "nccl_plugin",
    # parse_arguments: the timing cache (BuildConfig.input_timing_cache / output_timing_cache).
    "input_timing_cache",
    "output_timing_cache",
}
# examples/models/core/llama/convert_checkpoint.py (parse_arguments):
CONVERT_FLAGS = {
    "model_dir",
    "output_dir",
    "dtype",
    "tp_size",
    "pp_size",
    "use_weight_only",
    "weight_only_precision",
    "int8_kv_cache",
    "fp8_kv_cache",
    "smoothquant",
    "per_channel",
    "per_token",
    "calib_dataset",
    "calib_size",
    "workers",
    "load_model_on_cpu",
}
# examples/quantization/quantize.py:
QUANTIZE_FLAGS = {
    "model_dir", "output_dir", "dtype", "qformat", "calib_size", "calib_dataset",
    "kv_cache_dtype", "tp_size", "pp_size", "awq_block_size", "batch_size",
}  # fmt: skip


def plan_text(case: dict) -> str:
    opts = EngineOptions(**FIXED, **case)
    paths = build_paths(opts)
    return render_plan(opts, paths, plan_steps(opts, paths))


@pytest.mark.parametrize("name", sorted(CASES))
def test_commands_match_golden(name: str) -> None:
    text = plan_text(CASES[name])
    path = GOLDEN / f"{name}.sh"
    if os.environ.get("UPDATE_GOLDEN") == "1":
        path.write_text(text)
    assert path.exists(), f"{path} missing: run with UPDATE_GOLDEN=1 to create it"
    assert text == path.read_text(), (
        f"commands changed for {name}; see the diff, then UPDATE_GOLDEN=1"
    )


def test_every_golden_file_has_a_case() -> None:
    assert {p.stem for p in GOLDEN.glob("*.sh")} == set(CASES)


def flags(argv: list[str]) -> set[str]:
    return {a[2:] for a in argv if a.startswith("--")}


@pytest.mark.parametrize("name", sorted(CASES))
def test_flags_exist_in_the_tools(name: str) -> None:
    opts = EngineOptions(**FIXED, **CASES[name])
    convert, build = plan_steps(opts, build_paths(opts))
    assert build.argv[0] == "trtllm-build"
    assert flags(build.argv) <= TRTLLM_BUILD_FLAGS, flags(build.argv) - TRTLLM_BUILD_FLAGS
    known = QUANTIZE_FLAGS if convert.argv[1].endswith("quantize.py") else CONVERT_FLAGS
    assert flags(convert.argv) <= known, flags(convert.argv) - known


def test_quantization_picks_the_right_tool() -> None:
    def convert(**kw: object) -> list[str]:
        opts = EngineOptions(**FIXED, **kw)
        return plan_steps(opts, build_paths(opts))[0].argv

    assert convert()[1].endswith("models/core/llama/convert_checkpoint.py")
    assert "--use_weight_only" not in convert()
    argv = convert(quantization="int4_wo")
    assert argv[argv.index("--weight_only_precision") + 1] == "int4"
    argv = convert(quantization="int8_wo")
    assert argv[argv.index("--weight_only_precision") + 1] == "int8"
    argv = convert(quantization="int4_awq")
    assert argv[1].endswith("quantization/quantize.py")
    assert argv[argv.index("--qformat") + 1] == "int4_awq"
    argv = convert(quantization="fp8", gpu="h100")
    assert argv[argv.index("--kv_cache_dtype") + 1] == "fp8"


def test_int8_smoothquant_and_kv_cache_use_convert_checkpoints_flags() -> None:
    opts = EngineOptions(**FIXED, quantization="int8_sq", kv_cache_dtype="int8")
    argv = plan_steps(opts, build_paths(opts))[0].argv
    assert argv[1].endswith("models/core/llama/convert_checkpoint.py")
    assert argv[argv.index("--smoothquant") + 1] == "0.5"
    assert {"--per_channel", "--per_token", "--int8_kv_cache"} <= set(argv)
    assert argv[argv.index("--calib_size") + 1] == "512"
    awq = EngineOptions(**FIXED, quantization="int4_awq", kv_cache_dtype="int8")
    argv = plan_steps(awq, build_paths(awq))[0].argv
    assert argv[argv.index("--kv_cache_dtype") + 1] == "int8"
    plain = EngineOptions(**FIXED)
    argv = plan_steps(plain, build_paths(plain))[0].argv
    assert "--int8_kv_cache" not in argv and "--smoothquant" not in argv


def test_every_build_has_multiple_profiles() -> None:
    for case in CASES.values():
        opts = EngineOptions(**FIXED, **case)
        argv = plan_steps(opts, build_paths(opts))[1].argv
        assert argv[argv.index("--multiple_profiles") + 1] == "enable"


def test_limits_reach_trtllm_build() -> None:
    opts = EngineOptions(**FIXED, max_batch_size=8, max_input_len=1000, max_seq_len=2000,
                         max_num_tokens=512, tp_size=2)  # fmt: skip
    argv = plan_steps(opts, build_paths(opts))[1].argv
    pairs = dict(zip(argv[1::2], argv[2::2], strict=False))
    assert pairs["--max_batch_size"] == "8"
    assert pairs["--max_input_len"] == "1000"
    assert pairs["--max_seq_len"] == "2000"
    assert pairs["--max_num_tokens"] == "512"
    assert pairs["--workers"] == "2"
    assert pairs["--output_dir"] == "/artifacts/engine"


def test_dry_run_prints_the_golden_commands() -> None:
    """The CLI's --dry-run shows exactly the planned commands (plus notes on this machine)."""
    out = subprocess.run(
        [sys.executable, "build.py", "engine", "--dry-run",
         "--output-dir", "/artifacts/engine", "--workdir", "/scratch/engine-build"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
        env=os.environ | {"HF_HUB_OFFLINE": "1"},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    plan = "".join(ln for ln in out.stdout.splitlines(True) if not ln.startswith("# note:"))
    assert plan == (GOLDEN / "default_bf16_a100.sh").read_text()


def test_the_timing_cache_is_an_absolute_path_in_the_workdir_not_the_working_directory() -> None:
    # trtllm-build's default is `model.cache` in its working directory, then `assert ok`:
    # a read-only working directory (the verify Job's) fails the build.
    opts = EngineOptions(**FIXED, **CASES["default_bf16_a100"]).model_copy(
        update={"workdir": Path("relative/work")}
    )
    build = plan_steps(opts, build_paths(opts))[1].argv
    out = Path(build[build.index("--output_timing_cache") + 1])
    assert out.is_absolute() and out.parent == Path.cwd() / "relative" / "work"
    assert build[build.index("--input_timing_cache") + 1] == str(out)
