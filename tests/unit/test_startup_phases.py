"""GenerationService.start times each phase of its start and keeps the figures."""

from __future__ import annotations

from pathlib import Path

import pytest

from mistral_serving.service import GenerationService
from mistral_serving.settings import Settings


def test_start_records_each_phase(dev_model: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO")
    service = GenerationService.start(Settings(artifact=str(dev_model), engine="pytorch"), None)
    try:
        assert set(service.startup) == {"artifact", "tokenizer", "engine"}
        assert all(seconds >= 0 for seconds in service.startup.values())
        logged = caplog.text
        for phase in ("artifact", "tokenizer", "engine start"):
            assert f"startup phase {phase}" in logged
    finally:
        service.shutdown()
