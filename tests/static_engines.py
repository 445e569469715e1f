"""The static PyTorch engine on the dev model's CPU, as the engine tests start it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mistral_gpu_fallback.static.engine import StaticTorchEngine
from mistral_serving.engines.factory import start_torch_engine
from mistral_serving.settings import Settings

EOS = 2  # the dev model's end-of-sequence id


def cpu_static_engine(dev_model: Path, **settings: Any) -> StaticTorchEngine:
    """`settings` over the tests' base: static KV cache on the CPU, 512 columns."""
    base = {"artifact": str(dev_model), "device": "cpu", "pytorch_kv_cache": "static"}
    eng = start_torch_engine(dev_model, Settings(**{**base, "max_seq_len": 512, **settings}), EOS)
    assert isinstance(eng, StaticTorchEngine)
    return eng
