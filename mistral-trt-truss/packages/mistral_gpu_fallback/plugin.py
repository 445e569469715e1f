"""What the serving core calls in this package (`mistral_serving.engines.fallback`
loads this module by name, on first use): each function starts one of its parts."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mistral_gpu_fallback.replay import ReplayEngine
    from mistral_serving.artifacts.artifact import Artifact
    from mistral_serving.engines.base import Engine
    from mistral_serving.engines.pytorch.dynamic import TorchEngine
    from mistral_serving.settings import Settings, TorchEngineSettings
    from mistral_serving.text.tokenizer import Tokenizer

log = logging.getLogger(__name__)


def start_engine(artifact: Artifact, settings: Settings, tokenizer: Tokenizer) -> Engine:
    """`engine_process: on`: the engine (PyTorch or replay) in a process of its own, its
    step loop off the server's GIL; else the replay engine in this process."""
    from mistral_gpu_fallback.process.client import open_process_engine

    if settings.engine_process == "on":
        return open_process_engine(artifact.path, settings, tokenizer.eos_id, artifact.config)
    return start_replay_engine(settings, tokenizer)


def start_replay_engine(settings: Settings, tokenizer: Tokenizer) -> ReplayEngine:
    """The replay engine (benchmarks only), in this process; the engine process starts it
    with this too."""
    from mistral_gpu_fallback.replay import ReplayEngine
    from mistral_serving.engines.base import set_gil_switch_interval

    # It stands in for a fast GPU engine: the PyTorch engine's GIL switch interval.
    set_gil_switch_interval(settings.gil_switch_interval_ms)
    return ReplayEngine.for_tokenizer(
        tokenizer,
        settings.max_batch_size,
        settings.max_seq_len,
        settings.max_input_len,
        settings.replay_step_ms,
    )


def static_path_problem(config: dict[str, Any]) -> str | None:
    from mistral_gpu_fallback.static.engine import static_path_problem as problem

    return problem(config)


def start_static_torch_engine(
    model_dir: Path, settings: TorchEngineSettings, eos_token_id: int, config: dict[str, Any]
) -> TorchEngine:
    from mistral_gpu_fallback.static.engine import (
        StaticTorchEngine,
        load_static_model,
        supports_static_path,
    )
    from mistral_serving.engines.pytorch.dynamic import TorchEngine

    loaded = load_static_model(Path(model_dir), settings, config)
    if settings.pytorch_kv_cache == "auto" and (why := supports_static_path(loaded.model)):
        # config.json looked right but the modules do not: keep the loaded weights.
        log.warning("pytorch_kv_cache=auto: the dynamic KV cache, because %s", why)
        return TorchEngine.for_model(loaded, settings, eos_token_id)
    log.info("pytorch_kv_cache=%s: the static KV cache", settings.pytorch_kv_cache)
    return StaticTorchEngine.for_model(loaded, settings, eos_token_id)


def run_frontends(settings: Settings, port: int) -> int:
    from mistral_gpu_fallback import frontends

    # Past the drain's grace: the guests' wait in the engine process, its own stop.
    stop_s = 2 * settings.drain_grace_seconds + 60
    return frontends.run(settings.frontend_processes, settings.host, port, stop_s)
