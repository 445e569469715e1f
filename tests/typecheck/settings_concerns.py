"""Checked by `make typecheck`, never run: a layer typed to take one settings concern
cannot read another concern's knob. Each `type: ignore` below must stay needed
(warn_unused_ignores): if a concern gains a knob it should not see, mypy fails here."""

from __future__ import annotations

from mistral_serving.settings import (
    OpsSettings,
    ServerSettings,
    Settings,
    TorchEngineSettings,
    TrtllmSettings,
)


def the_whole_settings_is_every_concern(settings: Settings) -> list[object]:
    return [
        settings.cache_path,
        settings.max_batch_size,  # limits: shared by the engine kinds
        settings.trtllm_sampler,
        settings.max_body_bytes,
    ]


def a_torch_engine_reads_limits_not_server_knobs(settings: TorchEngineSettings) -> list[object]:
    return [
        settings.max_batch_size,
        settings.pytorch_kv_cache,
        settings.cuda_graphs,  # type: ignore[attr-defined]  # the GPU fallback's
        settings.max_body_bytes,  # type: ignore[attr-defined]
        settings.trtllm_sampler,  # type: ignore[attr-defined]
    ]


def a_trtllm_engine_reads_its_own(settings: TrtllmSettings) -> list[object]:
    return [
        settings.max_seq_len,
        settings.trtllm_kv_block_reuse,
        settings.torch_dtype,  # type: ignore[attr-defined]
        settings.artifact,  # type: ignore[attr-defined]
    ]


def the_server_reads_no_engine_knob(settings: ServerSettings, ops: OpsSettings) -> list[object]:
    return [
        settings.max_connections,
        ops.metrics_prefix,
        settings.max_batch_size,  # type: ignore[attr-defined]
        ops.host,  # type: ignore[attr-defined]
    ]
