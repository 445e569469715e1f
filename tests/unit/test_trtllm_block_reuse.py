"""Setting `trtllm_kv_block_reuse` reaches TensorRT-LLM's KvCacheConfig.enable_block_reuse
on both TensorRT-LLM kinds (through the double, whose KvCacheConfig has upstream's field and
default: on). verify-gpu turns reuse off so equal greedy requests take the same kernels."""

from __future__ import annotations

from pathlib import Path

import pytest

from mistral_serving.settings import Settings, SettingsError
from tests.doubles.trtllm_helpers import load, load_pytorch_kind


@pytest.mark.parametrize("reuse", [True, False])
def test_block_reuse_reaches_the_engine_kvcacheconfig(fake_trtllm, tmp_path: Path, reuse: bool):
    engine = load(tmp_path, Settings(trtllm_kv_block_reuse=reuse))
    assert engine.llm.args.kv_cache_config.enable_block_reuse is reuse


@pytest.mark.parametrize("reuse", [True, False])
def test_block_reuse_reaches_the_pytorch_backend(fake_trtllm, tmp_path: Path, reuse: bool):
    engine = load_pytorch_kind(tmp_path, Settings(trtllm_kv_block_reuse=reuse))
    assert engine.llm.args.kv_cache_config.enable_block_reuse is reuse


def test_block_reuse_defaults_to_upstreams_on_and_reads_model_metadata():
    assert Settings().trtllm_kv_block_reuse is True
    assert Settings.load({"trtllm_kv_block_reuse": "false"}, {}).trtllm_kv_block_reuse is False
    with pytest.raises(SettingsError):
        Settings.load({"trtllm_kv_block_reuse": "sometimes"}, {})
