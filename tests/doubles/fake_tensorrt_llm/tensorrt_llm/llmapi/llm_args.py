# Mirrors KvCacheConfig of tensorrt_llm/llmapi/llm_args.py (a pydantic model that forbids
# unknown fields), reduced to the fields a Truss deployment might set.

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
