"""One place picks the engine: `engines/factory.py` (replay, TensorRT-LLM, PyTorch static
or dynamic), and the engine modules import each other without cycles."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mistral_gpu_fallback.replay import ReplayEngine
from mistral_gpu_fallback.static.engine import StaticTorchEngine
from mistral_serving.artifacts.artifact import open_artifact
from mistral_serving.engines.factory import (
    keep_compiled_kernels,
    start_engine,
    start_torch_engine,
)
from mistral_serving.engines.pytorch.dynamic import TorchEngine
from mistral_serving.engines.pytorch.guided import GuidedDecoder
from mistral_serving.settings import Settings
from mistral_serving.text.tokenizer import load_tokenizer


def settings_for(dev_model: Path, **values) -> Settings:
    return Settings(artifact=str(dev_model), device="cpu", **values)


@pytest.mark.parametrize(
    ("kv_cache", "cls"), [("dynamic", TorchEngine), ("static", StaticTorchEngine)]
)
def test_the_kv_cache_setting_picks_the_pytorch_engine(dev_model, kv_cache, cls):
    settings = settings_for(dev_model, pytorch_kv_cache=kv_cache, max_seq_len=256)
    eng = start_torch_engine(dev_model, settings, 2)
    try:
        assert type(eng) is cls and eng.limits.max_seq_len == 256
    finally:
        eng.shutdown()


def test_start_engine_for_a_checkpoint_and_for_replay(dev_model):
    tokenizer = load_tokenizer(dev_model)
    settings = settings_for(dev_model)
    eng = start_engine(open_artifact(dev_model, settings), settings, tokenizer)
    try:
        assert type(eng) is TorchEngine and eng.eos_token_id == tokenizer.eos_id
        assert isinstance(eng.guided, GuidedDecoder)  # response_format on PyTorch engines
    finally:
        eng.shutdown()
    settings = settings_for(dev_model, engine="replay", gil_switch_interval_ms=0.25)
    before = sys.getswitchinterval()
    replay = start_engine(open_artifact(dev_model, settings), settings, tokenizer)
    try:
        assert isinstance(replay, ReplayEngine)
        # It stands in for a GPU engine's step thread: the same GIL switch interval.
        assert sys.getswitchinterval() == pytest.approx(0.00025)
    finally:
        replay.shutdown()
        sys.setswitchinterval(before)


def test_compiled_kernels_are_kept_in_the_service_cache(dev_model, tmp_path, monkeypatch):
    """Triton's cache under cache_dir (the pod's engine-cache volume) unless one is set."""
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    tokenizer = load_tokenizer(dev_model)
    settings = settings_for(dev_model, cache_dir=str(tmp_path / "cache"))
    eng = start_engine(open_artifact(dev_model, settings), settings, tokenizer)
    eng.shutdown()
    assert os.environ["TRITON_CACHE_DIR"] == str(tmp_path / "cache" / "triton")
    monkeypatch.setenv("TRITON_CACHE_DIR", "/srv/kernels")
    keep_compiled_kernels(tmp_path / "elsewhere")
    assert os.environ["TRITON_CACHE_DIR"] == "/srv/kernels"


def test_the_dynamic_engine_module_does_not_import_the_static_one():
    code = (
        "import sys\n"
        "import mistral_serving.engines.pytorch.dynamic\n"
        "assert 'mistral_gpu_fallback.static.engine' not in sys.modules\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": ":".join(sys.path)},
        check=False,
    )
    assert result.returncode == 0, result.stderr
