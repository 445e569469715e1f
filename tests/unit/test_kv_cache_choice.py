"""`pytorch_kv_cache: auto` (the default): the static fast path on a CUDA GPU for the
checkpoints it runs, the dynamic cache otherwise with the reason logged. The GPU is faked
(`runs_on_cuda`), the engines are real and run on the CPU with the dev model."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest

from mistral_gpu_fallback.static.engine import StaticTorchEngine, static_path_problem
from mistral_serving.engines import factory
from mistral_serving.engines.base import EngineError
from mistral_serving.engines.factory import kv_cache_choice, start_torch_engine
from mistral_serving.engines.pytorch.dynamic import TorchEngine
from mistral_serving.settings import Settings

MISTRAL = {
    "architectures": ["MistralForCausalLM"],
    "sliding_window": None,
    "rope_parameters": {"rope_theta": 1e6, "rope_type": "default"},
}


def test_auto_is_static_on_cuda_for_llama_and_mistral():
    assert kv_cache_choice("auto", True, MISTRAL) == ("static", None)
    llama = {"architectures": ["LlamaForCausalLM"], "rope_scaling": {"rope_type": "llama3"}}
    assert kv_cache_choice("auto", True, llama) == ("static", None)


def test_auto_is_dynamic_on_a_cpu():
    assert kv_cache_choice("auto", False, MISTRAL) == ("dynamic", "no CUDA GPU")


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"architectures": ["Qwen2ForCausalLM"]}, "architecture Qwen2ForCausalLM"),
        ({"architectures": []}, "architecture unknown"),
        ({"sliding_window": 4096}, "sliding-window"),
        ({"attention_bias": True}, "biases"),
        ({"mlp_bias": True}, "biases"),
        ({"hidden_act": "gelu"}, "activation gelu"),
        ({"rope_parameters": {"rope_type": "yarn"}}, "rope type yarn"),
        ({"rope_parameters": None, "rope_scaling": {"type": "dynamic"}}, "rope type dynamic"),
    ],
)
def test_auto_falls_back_to_dynamic_with_the_reason(change, reason):
    kind, why = kv_cache_choice("auto", True, MISTRAL | change)
    assert kind == "dynamic" and reason in why
    assert static_path_problem(MISTRAL | change) == why


@pytest.mark.parametrize("setting", ["static", "dynamic"])
def test_an_explicit_setting_is_kept(setting):
    assert kv_cache_choice(setting, False, {"architectures": ["X"]}) == (setting, None)
    assert kv_cache_choice(setting, True, MISTRAL) == (setting, None)


@pytest.fixture
def fake_cuda(monkeypatch):
    """The factory believes it runs on a GPU; the engine itself stays on the CPU."""
    monkeypatch.setattr(factory, "runs_on_cuda", lambda settings: True)


def start(model_dir: Path, **values):
    settings = Settings(artifact=str(model_dir), device="cpu", max_seq_len=256, **values)
    return start_torch_engine(model_dir, settings, 2)


def sliding_window_copy(dev_model: Path, tmp_path: Path) -> Path:
    model = tmp_path / "sliding"
    shutil.copytree(dev_model, model)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps(config | {"sliding_window": 64}))
    return model


def test_the_factory_starts_the_static_engine_on_cuda(dev_model, fake_cuda, caplog):
    caplog.set_level(logging.INFO, logger="mistral_gpu_fallback.plugin")
    engine = start(dev_model)
    try:
        assert type(engine) is StaticTorchEngine
        assert "pytorch_kv_cache=auto: the static KV cache" in caplog.text
    finally:
        engine.shutdown()


def test_the_factory_starts_the_dynamic_engine_on_a_cpu(dev_model, caplog):
    caplog.set_level(logging.INFO, logger="mistral_serving.engines.factory")
    engine = start(dev_model)
    try:
        assert type(engine) is TorchEngine
        assert "the dynamic KV cache, because no CUDA GPU" in caplog.text
    finally:
        engine.shutdown()


def test_an_unsupported_checkpoint_on_cuda_falls_back_with_a_warning(
    dev_model, tmp_path, fake_cuda, caplog
):
    model = sliding_window_copy(dev_model, tmp_path)
    engine = start(model)
    try:
        assert type(engine) is TorchEngine
        warned = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert any("because sliding-window attention" in r.getMessage() for r in warned)
    finally:
        engine.shutdown()
    with pytest.raises(EngineError, match="sliding-window"):  # explicit static: refused
        start(model, pytorch_kv_cache="static")


def test_modules_the_fast_path_cannot_run_fall_back_after_loading(
    dev_model, fake_cuda, monkeypatch, caplog
):
    """config.json looks right but the loaded modules do not: dynamic, same weights."""
    import mistral_gpu_fallback.static.engine as static

    monkeypatch.setattr(static, "supports_static_path", lambda model: "attention is odd")
    engine = start(dev_model)
    try:
        assert type(engine) is TorchEngine
        assert "the dynamic KV cache, because attention is odd" in caplog.text
    finally:
        engine.shutdown()
