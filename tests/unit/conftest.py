"""Fixtures shared by the unit tests (those of the e2e tests too: tests/conftest.py, with
the dev model and its tokenizer, `tok`)."""

from __future__ import annotations

import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

FAKE_TRTLLM_ROOT = Path(__file__).resolve().parents[1] / "doubles" / "fake_tensorrt_llm"


def _drop_tensorrt_llm_modules() -> None:
    for name in list(sys.modules):
        if name == "tensorrt_llm" or name.startswith("tensorrt_llm."):
            del sys.modules[name]


@pytest.fixture
def fake_trtllm(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """Import `tensorrt_llm` from the test double (tests/doubles/fake_tensorrt_llm), fresh
    for this test."""
    for name in list(sys.modules):
        if name == "tensorrt_llm" or name.startswith("tensorrt_llm."):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.syspath_prepend(str(FAKE_TRTLLM_ROOT))
    import tensorrt_llm

    assert Path(tensorrt_llm.__file__).is_relative_to(FAKE_TRTLLM_ROOT)
    yield tensorrt_llm
    _drop_tensorrt_llm_modules()


@pytest.fixture(scope="module")
def hf_model(dev_model: Path):
    """The dev model in plain transformers (fp32, eval): the reference the engines'
    logits and logprobs are held against."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(dev_model)).eval()


@pytest.fixture
def restore_sigterm() -> Iterator[None]:
    """Puts back the SIGTERM handler a test installed (the drain's, the watchdog's)."""
    previous = signal.getsignal(signal.SIGTERM)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
