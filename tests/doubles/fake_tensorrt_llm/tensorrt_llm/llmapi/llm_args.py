"""Mirrors tensorrt_llm/llmapi/llm_args.py: `KvCacheConfig` (a pydantic model that forbids
unknown fields, reduced to the fields a deployment might set), `CapacitySchedulerPolicy`
(a StrEnum mirroring the C++ enum) and `SchedulerConfig` (`capacity_scheduler_policy`,
default GUARANTEED_NO_EVICT)."""

import math
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field, model_validator


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


class CudaGraphConfig(BaseModel):
    """llm_args.py::CudaGraphConfig: `batch_sizes`, `max_batch_size`, `enable_padding`; the
    validator derives one from the other (`validate_cuda_graph_config`,
    `_generate_cuda_graph_batch_sizes`)."""

    model_config = ConfigDict(extra="forbid")

    batch_sizes: list[int] | None = None
    max_batch_size: int = Field(default=0, ge=0)
    enable_padding: bool = False

    @model_validator(mode="after")
    def validate_cuda_graph_config(self) -> "CudaGraphConfig":
        if self.batch_sizes:
            self.batch_sizes = sorted(self.batch_sizes)
            derived = max(self.batch_sizes)
            if self.max_batch_size == 0:
                self.max_batch_size = derived
            elif self.max_batch_size != derived:
                raise ValueError("max_batch_size must equal max(batch_sizes)")
        else:
            max_bs = self.max_batch_size or 128
            if self.enable_padding:
                sizes = [1, 2, 4] + [i * 8 for i in range(1, 17)]
            else:
                sizes = list(range(1, 32)) + [32, 64, 128]
            sizes += [2**i for i in range(8, math.ceil(math.log(max_bs, 2)))]
            sizes = sorted(s for s in sizes if s <= max_bs)
            if max_bs != sizes[-1]:
                sizes.append(max_bs)
            self.batch_sizes, self.max_batch_size = sizes, max_bs
        return self
