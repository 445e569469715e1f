"""The GPU fallback package, `mistral_gpu_fallback`, reached only through this module.

That package holds what a TensorRT-LLM deployment never runs: the PyTorch engine's
static KV cache (its own Llama forward, fused kernels, CUDA graphs), the engine process
and several front-end processes over it, and the replay engine of the benchmarks. The
serving core never imports it; this module loads its `plugin` module on first use, when
a setting asks for one of its parts, and an image built without it refuses that setting
in one line. The package imports the core, never the other way round
(tests/unit/test_architecture.py).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Protocol, cast

from mistral_serving.settings import SettingsError

if TYPE_CHECKING:
    from pathlib import Path

    from mistral_serving.artifacts.artifact import Artifact
    from mistral_serving.engines.base import Engine
    from mistral_serving.engines.pytorch.dynamic import TorchEngine
    from mistral_serving.settings import Settings, TorchEngineSettings
    from mistral_serving.text.tokenizer import Tokenizer

PACKAGE = "mistral_gpu_fallback"
NOT_INSTALLED = f"the GPU fallback package ({PACKAGE}) is not installed"


class GpuFallback(Protocol):
    """What the core asks of the package (its `plugin` module's functions)."""

    def start_engine(self, artifact: Artifact, settings: Settings, tokenizer: Tokenizer) -> Engine:
        """The engine in its own process (`engine_process: on`) or the replay engine."""
        ...

    def static_path_problem(self, config: dict[str, Any]) -> str | None:
        """Why the static KV cache cannot run this checkpoint, or None."""
        ...

    def start_static_torch_engine(
        self,
        model_dir: Path,
        settings: TorchEngineSettings,
        eos_token_id: int,
        config: dict[str, Any],
    ) -> TorchEngine:
        """The PyTorch engine with the static KV cache (or the dynamic one over the same
        weights where `auto` finds the modules unfit)."""
        ...

    def run_frontends(self, settings: Settings, port: int) -> int:
        """Several front-end processes on `port` until they end; the exit status."""
        ...


def installed() -> GpuFallback | None:
    """The package's plugin, or None where the image leaves the package out."""
    try:
        module = importlib.import_module(f"{PACKAGE}.plugin")
    except ModuleNotFoundError as exc:
        if exc.name in (PACKAGE, f"{PACKAGE}.plugin"):
            return None
        raise  # the package is there and broken: say so, not "not installed"
    return cast("GpuFallback", module)


def required(setting: str) -> GpuFallback:
    """The plugin, or a SettingsError that names the setting that needs it."""
    plugin = installed()
    if plugin is None:
        raise SettingsError(
            f"{setting} needs {NOT_INSTALLED} (an image built for the TensorRT-LLM engine "
            "kinds leaves it out); unset it, or build the image with the fallback"
        )
    return plugin
