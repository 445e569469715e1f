"""Mirrors tensorrt_llm/llmapi/llm_args.py: `KvCacheConfig` (a pydantic model that forbids
unknown fields, reduced to the fields a deployment might set), `CapacitySchedulerPolicy`
(a StrEnum mirroring the C++ enum) and `SchedulerConfig` (`capacity_scheduler_policy`,
default GUARANTEED_NO_EVICT)."""

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field


class KvCacheConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    enable_block_reuse: bool = True
    max_tokens: int | None = None
    max_attention_window: list[int] | None = None
    sink_token_length: int | None = None
    free_gpu_memory_fraction: float | None = Field(default=0.9, ge=0, le=1)
    host_cache_size: int | None = None
    onboard_blocks: bool = True


class CapacitySchedulerPolicy(StrEnum):
    MAX_UTILIZATION = "MAX_UTILIZATION"
    GUARANTEED_NO_EVICT = "GUARANTEED_NO_EVICT"
    STATIC_BATCH = "STATIC_BATCH"


class ContextChunkingPolicy(StrEnum):
    FIRST_COME_FIRST_SERVED = "FIRST_COME_FIRST_SERVED"
    EQUAL_PROGRESS = "EQUAL_PROGRESS"


class SchedulerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    capacity_scheduler_policy: CapacitySchedulerPolicy = CapacitySchedulerPolicy.GUARANTEED_NO_EVICT
    context_chunking_policy: ContextChunkingPolicy | None = None
