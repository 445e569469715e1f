"""The build run end to end with TensorRT-LLM's two tools replaced by stand-in scripts
(TensorRT-LLM cannot run here): steps, progress, logs, tokenizer copy and the manifest."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from mistral_build import engine
from mistral_build.engine import BuildFacts, EngineOptions, Step, build_trtllm_engine
from mistral_build.gpu import BuildGpu
from mistral_serving.artifacts.manifest import describe, read_manifest, sha256_file, verify_files

A100 = BuildGpu(name="NVIDIA A100-SXM4-80GB", compute_capability="8.0", memory_mib=81920)
FACTS = BuildFacts(gpus=[A100], free_disk_bytes=10**12, trtllm_version="1.2.1",
                   tensorrt_version="10.13.2.6")  # fmt: skip
SECRET = "hf_test_secret_token_value"

FAKE_CONVERT = """
import pathlib, sys, time
out = pathlib.Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True)
for i in range(3):
    print(f"converting layer {i}", flush=True); time.sleep(0.1)
(out / "config.json").write_text("{}")
"""
FAKE_BUILD = """
import json, pathlib, sys
out = pathlib.Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True)
(out / "config.json").write_text(json.dumps({"version": "1.2.1", "build_config": {}}))
(out / "rank0.engine").write_bytes(bytes(range(256)) * 64)
print("Total time of building all engines: 00:00:01")
"""


@pytest.fixture
def fake_tools(monkeypatch: pytest.MonkeyPatch) -> None:
    def plan(opts: EngineOptions, paths: engine.BuildPaths, python: str = "python3") -> list[Step]:
        return [
            Step(
                name="convert",
                argv=[sys.executable, "-c", FAKE_CONVERT, str(paths.trtllm_checkpoint_dir)],
            ),
            Step(name="build", argv=[sys.executable, "-c", FAKE_BUILD, str(paths.output_dir)]),
        ]

    monkeypatch.setattr(engine, "plan_steps", plan)
    monkeypatch.setattr(engine, "HEARTBEAT_S", 0.05)
    monkeypatch.setenv("HF_TOKEN", SECRET)


def test_build_writes_engine_tokenizer_and_manifest(
    fake_tools: None, dev_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    opts = EngineOptions(checkpoint_dir=dev_model, output_dir=tmp_path / "engine",
                         workdir=tmp_path / "work", max_input_len=2048, max_seq_len=4096)  # fmt: skip
    out = build_trtllm_engine(opts, FACTS, token=SECRET)

    printed = capsys.readouterr().out
    assert "[1/2] convert" in printed and "[2/2] build" in printed
    assert re.search(r"convert: done in \dm\d\ds", printed)
    assert "converting layer" in printed  # heartbeat shows the latest log line
    assert "manifest:" in printed and "trtllm_engine" in printed
    assert SECRET not in printed

    logs = tmp_path / "work" / "logs"
    assert "converting layer 2" in (logs / "convert.log").read_text()
    assert "Total time of building all engines" in (logs / "build.log").read_text()

    for name in ["rank0.engine", "config.json", "tokenizer.model", "tokenizer.json",
                 "tokenizer_config.json", "generation_config.json"]:  # fmt: skip
        assert (out / name).is_file(), name
    assert sha256_file(out / "tokenizer.model") == sha256_file(dev_model / "tokenizer.model")

    manifest = read_manifest(out)
    assert manifest is not None and manifest.kind == "trtllm_engine"
    assert manifest.source_model == str(dev_model) and manifest.source_revision is None
    assert manifest.versions == {"tensorrt_llm": "1.2.1", "tensorrt": "10.13.2.6"}
    assert manifest.gpu.name == A100.name and manifest.gpu.compute_capability == "8.0"
    options = manifest.build_options
    assert options["max_input_len"] == 2048 and options["max_seq_len"] == 4096
    assert options["dtype"] == "bfloat16" and options["quantization"] == "none"
    assert options["max_batch_size"] == 128 and options["kv_cache_dtype"] == "auto"
    assert options["gpu"] == "a100" and options["kv_cache_type"] == "paged"
    assert len(options["commands"]) == 2
    assert set(manifest.files) >= {"rank0.engine", "config.json", "tokenizer.model"}
    assert manifest.files["rank0.engine"].sha256 == sha256_file(out / "rank0.engine")
    verify_files(out, manifest)  # every recorded size and hash matches
    text = (out / "build_manifest.json").read_text()
    assert SECRET not in text and SECRET not in (logs / "build.log").read_text()
    json.loads(text)


def test_failed_step_names_its_log(fake_tools: None, dev_model: Path, tmp_path: Path,
                                   monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    def plan(opts: EngineOptions, paths: engine.BuildPaths, python: str = "python3") -> list[Step]:
        code = "print('[TRT] out of memory', flush=True); raise SystemExit(3)"
        return [Step(name="build", argv=[sys.executable, "-c", code])]

    monkeypatch.setattr(engine, "plan_steps", plan)
    opts = EngineOptions(
        checkpoint_dir=dev_model, output_dir=tmp_path / "e", workdir=tmp_path / "w"
    )
    with pytest.raises(RuntimeError, match=r"step build failed \(exit 3\).*build\.log"):
        build_trtllm_engine(opts, FACTS, token=None)
    assert "out of memory" in (tmp_path / "w" / "logs" / "build.log").read_text()
    assert read_manifest(tmp_path / "e") is None  # no manifest for a failed build


def test_refuses_to_overwrite_an_existing_artifact(fake_tools: None, dev_model: Path,
                                                   tmp_path: Path) -> None:  # fmt: skip
    (tmp_path / "e").mkdir()
    (tmp_path / "e" / "rank0.engine").write_bytes(b"old")
    opts = EngineOptions(
        checkpoint_dir=dev_model, output_dir=tmp_path / "e", workdir=tmp_path / "w"
    )
    with pytest.raises(engine.ArtifactError, match="not empty"):
        build_trtllm_engine(opts, FACTS, token=None)


def test_describe_is_one_line(fake_tools: None, dev_model: Path, tmp_path: Path) -> None:
    opts = EngineOptions(checkpoint_dir=dev_model, output_dir=tmp_path / "e", workdir=tmp_path / "w",
                         quantization="int8_wo", max_input_len=2048, max_seq_len=4096)  # fmt: skip
    line = describe(read_manifest(build_trtllm_engine(opts, FACTS, token=None)))
    assert "\n" not in line
    for part in ["trtllm_engine", "float16+int8_wo", "tp1", "max_input_len=2048",
                 "NVIDIA A100-SXM4-80GB (sm 8.0)", "tensorrt_llm 1.2.1"]:  # fmt: skip
        assert part in line, (part, line)


def test_dev_model_goes_through_the_same_finishing_code(dev_model: Path) -> None:
    manifest = read_manifest(dev_model)
    assert manifest is not None and manifest.kind == "hf_checkpoint"
    assert {"tokenizer.model", "tokenizer.json", "model.safetensors"} <= set(manifest.files)
    verify_files(dev_model, manifest)


def test_pytorch_artifact_from_a_local_checkpoint(dev_model: Path, tmp_path: Path) -> None:
    opts = EngineOptions(backend="pytorch", checkpoint_dir=dev_model, output_dir=tmp_path / "pt")
    out = engine.build_pytorch_artifact(opts, token=None)
    manifest = read_manifest(out)
    assert manifest.kind == "hf_checkpoint" and manifest.gpu is None
    assert {"config.json", "model.safetensors", "tokenizer.model"} <= set(manifest.files)
    assert (
        manifest.files["model.safetensors"] == read_manifest(dev_model).files["model.safetensors"]
    )
    assert manifest.build_options["backend"] == "pytorch"
    verify_files(out, manifest)
