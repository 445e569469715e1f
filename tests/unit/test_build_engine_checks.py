"""Option validation and the pre-build checks: pure functions over the facts, plus the CLI
refusing on this machine (no GPU, no TensorRT-LLM) with one line per reason and exit 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mistral_build.engine import (
    KNOWN_MODELS,
    SOURCE_IGNORE,
    SOURCE_PATTERNS,
    BuildFacts,
    EngineOptions,
    check_environment,
    check_options,
    estimate_disk_bytes,
    model_facts_from_config,
)
from mistral_build.gpu import BuildGpu, matches_target, parse_nvidia_smi, supports_fp8

REPO = Path(__file__).resolve().parents[2]
MISTRAL = KNOWN_MODELS["mistralai/Mistral-7B-Instruct-v0.2"]
# config.json of mistralai/Mistral-7B-Instruct-v0.2 (the fields the checks read).
MISTRAL_CONFIG = {
    "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32000,
    "max_position_embeddings": 32768, "tie_word_embeddings": False, "sliding_window": None,
}  # fmt: skip
A100 = BuildGpu(name="NVIDIA A100-SXM4-80GB", compute_capability="8.0", memory_mib=81920)
H100 = BuildGpu(name="NVIDIA H100 80GB HBM3", compute_capability="9.0", memory_mib=81559)
TB = 10**12


def good_facts(**kw: object) -> BuildFacts:
    values = dict(gpus=[A100], free_disk_bytes=TB, trtllm_version="1.2.1", tensorrt_version="10.13")
    return BuildFacts(**(values | kw))


def test_parameter_count_from_config_matches_mistral_7b() -> None:
    facts = model_facts_from_config(MISTRAL_CONFIG)
    assert facts.num_parameters == 7_241_732_096  # the published count of Mistral-7B
    assert facts == MISTRAL


def test_defaults_pass_all_checks() -> None:
    opts = EngineOptions()
    assert check_options(opts, MISTRAL) == []
    assert check_environment(opts, good_facts(), MISTRAL, download=True) == []


def test_defaults_reproduce_the_article_but_in_bf16() -> None:
    opts = EngineOptions()
    assert (opts.model, opts.tp_size) == ("mistralai/Mistral-7B-Instruct-v0.2", 1)
    assert (opts.max_input_len, opts.max_seq_len, opts.gpu) == (32256, 32768, "a100")
    # bf16 on sm80+ (every target); the article's fp16 on request.
    assert {EngineOptions(gpu=g).dtype for g in ("a100", "h100", "h200", "l4")} == {"bfloat16"}
    assert EngineOptions(dtype="float16").dtype == "float16"


def test_max_batch_size_follows_the_gpus_memory_unless_given() -> None:
    from mistral_build.engine import default_max_batch_size

    assert default_max_batch_size("a100", 81920) == 256  # A100 80 GB
    assert default_max_batch_size("a100", 40960) == 128  # A100 40 GB
    assert default_max_batch_size("l4", 23034) == 64
    # No GPU seen (a dry run): the target's GKE GPU (nvidia-tesla-a100 is the 40 GB one).
    assert EngineOptions().max_batch_size == 128
    assert EngineOptions(gpu="h100").max_batch_size == 256
    assert "max_batch_size" not in EngineOptions().model_fields_set
    assert EngineOptions(max_batch_size=32).max_batch_size == 32
    assert "max_batch_size" in EngineOptions(max_batch_size=32).model_fields_set


def test_int8_kv_cache_is_refused_where_it_cannot_apply() -> None:
    problems = check_options(
        EngineOptions(quantization="fp8", gpu="h100", kv_cache_dtype="int8"), MISTRAL
    )
    assert problems == [
        "--kv-cache-dtype int8 with --quantization fp8: FP8 builds keep an FP8 KV cache"
    ]
    problems = check_options(EngineOptions(backend="pytorch", kv_cache_dtype="int8"), MISTRAL)
    assert any("not --backend pytorch" in p for p in problems)


def test_an_old_driver_refuses_the_build_in_one_line() -> None:
    facts = good_facts(driver_version="550.90.07", image_cuda="13.0")
    problems = check_environment(EngineOptions(), facts, MISTRAL, download=True)
    assert len(problems) == 1
    assert problems[0].startswith("NVIDIA driver 550.90.07 is too old for this image's CUDA 13.0")
    ok = good_facts(driver_version="580.95.05", image_cuda="13.0")
    assert check_environment(EngineOptions(), ok, MISTRAL, download=True) == []
    assert ok.driver_report().line() == (
        "NVIDIA driver 580.95.05, image CUDA 13.0, needs >= 580.65.06: ok"
    )


@pytest.mark.parametrize(
    ("kw", "needle"),
    [
        (dict(max_input_len=32768, max_seq_len=32768), "must be below --max-seq-len"),
        (dict(max_input_len=1000, max_seq_len=40000), "max_position_embeddings 32768"),
        (dict(quantization="fp8"), "fp8 needs compute capability 8.9+"),
        (dict(tp_size=3), "must divide the model's 8 KV heads"),
        (dict(dev=True), "--dev builds the tiny PyTorch dev model"),
        (dict(backend="pytorch", quantization="int8_wo"), "not --backend pytorch"),
    ],
)
def test_option_refusals(kw: dict, needle: str) -> None:
    problems = check_options(EngineOptions(**kw), MISTRAL)
    assert len(problems) == 1 and needle in problems[0], problems


def test_fp8_is_fine_on_hopper_and_ada() -> None:
    assert check_options(EngineOptions(quantization="fp8", gpu="h100"), MISTRAL) == []
    assert check_options(EngineOptions(quantization="fp8", gpu="l4"), MISTRAL) == []


def test_revision_with_checkpoint_dir_and_missing_config(tmp_path: Path) -> None:
    problems = check_options(EngineOptions(checkpoint_dir=tmp_path, revision="abc"), None)
    assert any("--revision applies to --model" in p for p in problems)
    assert any("no config.json" in p for p in problems)


@pytest.mark.parametrize(
    ("opts", "facts", "needle"),
    [
        (
            EngineOptions(),
            good_facts(trtllm_version=None),
            "nvcr.io/nvidia/tensorrt-llm/release:1.2",
        ),
        (EngineOptions(), good_facts(trtllm_version="1.3.0"), "targets 1.2.x"),
        (EngineOptions(), good_facts(trtllm_version="1.3.0rc14"), "engine=trtllm_pytorch"),
        (EngineOptions(), good_facts(gpus=[]), "no NVIDIA GPU found"),
        (EngineOptions(tp_size=2), good_facts(), "needs 2 GPUs; this machine has 1"),
        (EngineOptions(), good_facts(gpus=[H100]), "runs only on the GPU kind it was built on"),
        (EngineOptions(quantization="fp8", gpu="h100"), good_facts(gpus=[A100]), "8.9+"),
        (EngineOptions(), good_facts(free_disk_bytes=20 * 10**9), "not enough disk"),
    ],
)
def test_environment_refusals(opts: EngineOptions, facts: BuildFacts, needle: str) -> None:
    problems = check_environment(opts, facts, MISTRAL, download=True)
    assert any(needle in p for p in problems), problems
    assert all("\n" not in p for p in problems)


def test_pytorch_backend_needs_no_gpu_or_tensorrt_llm() -> None:
    facts = good_facts(gpus=[], trtllm_version=None)
    assert check_environment(EngineOptions(backend="pytorch"), facts, MISTRAL, True) == []


def test_disk_estimate_scales_with_precision() -> None:
    fp16 = estimate_disk_bytes(EngineOptions(), MISTRAL, download=True)
    int4 = estimate_disk_bytes(EngineOptions(quantization="int4_awq"), MISTRAL, download=True)
    local = estimate_disk_bytes(EngineOptions(), MISTRAL, download=False)
    assert 45e9 < fp16 < 55e9  # 14.5 GB each: source, converted checkpoint, engine (+margin)
    assert int4 < fp16 and local < fp16


# The file list of mistralai/Mistral-7B-Instruct-v0.2: HF safetensors shards, plus the same
# weights as .bin files and in Mistral's own format (consolidated.safetensors).
MISTRAL_REPO_FILES = [
    ".gitattributes", "README.md", "config.json", "generation_config.json",
    "model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
    "model-00003-of-00003.safetensors", "model.safetensors.index.json",
    "pytorch_model-00001-of-00003.bin", "pytorch_model-00002-of-00003.bin",
    "pytorch_model-00003-of-00003.bin", "pytorch_model.bin.index.json",
    "consolidated.safetensors", "params.json", "tokenizer.json", "tokenizer.model",
    "tokenizer.model.v3", "tokenizer_config.json", "special_tokens_map.json",
]  # fmt: skip


def test_download_takes_one_copy_of_the_weights() -> None:
    # The same filter snapshot_download applies to the repo's file list.
    from huggingface_hub.utils import filter_repo_objects

    fetched = set(
        filter_repo_objects(
            MISTRAL_REPO_FILES, allow_patterns=SOURCE_PATTERNS, ignore_patterns=SOURCE_IGNORE
        )
    )
    weights = {f for f in fetched if f.endswith((".safetensors", ".bin"))}
    assert weights == {f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)}
    assert {"config.json", "tokenizer.model", "tokenizer.json"} <= fetched


def test_disk_estimate_for_the_default_build_is_about_50_gb() -> None:
    # Source + converted checkpoint + engine, 14.5 GB each, + 15%: the runbook's figure.
    need = estimate_disk_bytes(EngineOptions(), MISTRAL, download=True)
    assert round(need / 1e9) == 50


def test_gpu_helpers() -> None:
    smi = "NVIDIA A100-SXM4-80GB, 8.0, 81920\nNVIDIA A100-SXM4-80GB, 8.0, 81920\n"
    gpus = parse_nvidia_smi(smi)
    assert len(gpus) == 2 and gpus[0] == A100
    assert parse_nvidia_smi("") == []
    assert matches_target(A100, "a100") and not matches_target(A100, "h100")
    assert matches_target(H100, "h100") and not matches_target(H100, "h200")
    assert not supports_fp8("8.0") and supports_fp8("8.9") and supports_fp8("9.0")


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "build.py", "engine", *args], cwd=REPO, capture_output=True, text=True,
        timeout=120, env=os.environ | {"HF_HUB_OFFLINE": "1"},
    )  # fmt: skip


def test_cli_refuses_on_this_machine() -> None:
    """No GPU and no tensorrt_llm here: refused before any download, exit 2, one line each."""
    out = run_cli("--output-dir", "/tmp/never-created-engine")
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert any("tensorrt_llm is not importable" in ln for ln in lines)
    assert any("release:1.2" in ln and "docker run" in ln for ln in lines)
    assert any("no NVIDIA GPU found" in ln for ln in lines)
    assert all(ln.startswith("refused: ") for ln in lines)
    assert not Path("/tmp/never-created-engine").exists()
    # The driver against the image's CUDA is said first (here: no driver, no toolkit).
    assert out.stdout.splitlines()[0].startswith("NVIDIA driver: none found")


def test_cli_refuses_bad_options(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(MISTRAL_CONFIG))
    out = run_cli("--checkpoint-dir", str(tmp_path), "--quantization", "fp8",
                  "--max-input-len", "5000", "--max-seq-len", "4000")  # fmt: skip
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 2, lines
    assert "fp8 needs compute capability 8.9+" in out.stderr
    assert "must be below --max-seq-len" in out.stderr


def test_cli_rejects_invalid_values() -> None:
    out = run_cli("--tp-size", "0")
    assert out.returncode == 2 and "refused: --tp-size" in out.stderr
    out = run_cli("--quantization", "int3")
    assert out.returncode == 2 and "invalid choice" in out.stderr


def test_help_documents_every_option() -> None:
    out = subprocess.run([sys.executable, "build.py", "engine", "--help"], cwd=REPO,
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode == 0
    for flag in ["--model", "--revision", "--checkpoint-dir", "--dtype", "--quantization",
                 "--tp-size", "--max-batch-size", "--max-input-len", "--max-seq-len",
                 "--max-num-tokens", "--gpu", "--output-dir", "--push", "--push-revision",
                 "--private", "--dry-run", "--workdir", "--backend", "--dev"]:  # fmt: skip
        assert flag in out.stdout, flag
