"""TensorRT-LLM's release lines and what the adapter does on each (through the double,
whose gates are tests/doubles/fake_tensorrt_llm/tensorrt_llm/_lines.py): 1.2.x is the last
line with the TensorRT-engine backend, so an engine artifact on 1.3+ is refused with one
line naming engine=trtllm_pytorch; TRTLLMSampler is gone from 1.3.0rc26."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mistral_serving.engines.trtllm.checks import EngineCheckError, release_line
from mistral_serving.engines.trtllm.pytorch_backend import trtllm_sampler_exists
from mistral_serving.settings import Settings
from tests.doubles.trtllm_helpers import load, load_pytorch_kind

# -- the release lines ------------------------------------------------------------------


@pytest.mark.parametrize("version", ["1.3.0rc14", "1.3.0", "1.4.0rc1"])
def test_an_engine_on_a_line_without_the_engine_backend_is_refused_naming_the_kind(
    fake_trtllm, tmp_path, version
):
    fake_trtllm.__version__ = version
    with pytest.raises(EngineCheckError) as refused:
        load(tmp_path / version, version="1.2.1")
    message = str(refused.value)
    assert "engine=trtllm_pytorch" in message and "\n" not in message
    assert f"TensorRT-LLM {version} serves no TensorRT engines" in message


def test_the_doubles_engine_backend_exists_up_to_1_2_only(fake_trtllm):
    import importlib

    fake_trtllm.__version__ = "1.3.0rc0"
    with pytest.raises(ModuleNotFoundError, match="_tensorrt_engine"):
        importlib.import_module("tensorrt_llm._tensorrt_engine")
    fake_trtllm.__version__ = "1.2.1"
    assert importlib.import_module("tensorrt_llm._tensorrt_engine").LLM is not None


@pytest.mark.parametrize(
    ("version", "exists"),
    [
        ("1.2.1", True),
        ("1.3.0rc25", True),
        ("1.3.0rc26", False),
        ("1.3.0", False),
        ("1.4.0rc0", False),
    ],
)
def test_trtllm_sampler_gate_on_both_sides(fake_trtllm, tmp_path, version, exists):
    fake_trtllm.__version__ = version
    assert trtllm_sampler_exists(version) is exists
    if exists:
        engine = load_pytorch_kind(tmp_path, Settings(trtllm_sampler="trtllm"))
        assert engine.info.details["sampler"] == "trtllm"
    else:
        with pytest.raises(EngineCheckError, match="set trtllm_sampler=torch"):
            load_pytorch_kind(tmp_path, Settings(trtllm_sampler="trtllm"))
    # The torch sampler is on every line.
    load_pytorch_kind(tmp_path / "torch", Settings(trtllm_sampler="torch"))


@given(st.text(max_size=30))
def test_version_reading_takes_any_text(text: str):
    line = release_line(text)
    assert line is None or all(n >= 0 for n in line)
    assert trtllm_sampler_exists(text) in (True, False)
