"""What the Inference Gateway's scorers read beyond queue/running/KV use: `cache_config_info`,
prefix-cache queries and hits, preemptions; and the third naming mode (trtllm-serve's names).
TensorRT-LLM through its test double (tests/doubles/fake_tensorrt_llm); nothing of it runs."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from mistral_serving.engines.base import SamplingOptions
from mistral_serving.engines.trtllm.engine import CacheStatsReader
from mistral_serving.ops.metrics import CacheStats, Metrics, metric_name, prefix_for
from mistral_serving.settings import Settings
from tests.doubles.scripted_engine import ScriptedEngine
from tests.doubles.trtllm_helpers import consume, load, load_pytorch_kind, settle


def samples(registry: CollectorRegistry) -> dict[str, list[tuple[dict[str, str], float]]]:
    text = generate_latest(registry).decode()
    found: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            found.setdefault(s.name, []).append((dict(s.labels), s.value))
    return found


def served(engine: object, names: str = "mtt") -> CollectorRegistry:
    registry = CollectorRegistry()
    Metrics(registry, prefix=prefix_for(names)).bind_engine(engine)  # type: ignore[arg-type]
    return registry


def run_prompts(engine, prompts: list[list[int]]) -> None:
    async def main() -> None:
        for i, prompt in enumerate(prompts):
            await consume(engine, f"r{i}", prompt, SamplingOptions(max_new_tokens=2))
            await settle()

    asyncio.run(main())


BLOCK = 32
SHARED = list(range(100, 100 + 2 * BLOCK))  # two whole blocks


@pytest.mark.parametrize("kind", ["engine", "pytorch_backend"])
def test_prefix_cache_hits_and_queries_follow_block_reuse(fake_trtllm, tmp_path: Path, kind):
    engine = load(tmp_path) if kind == "engine" else load_pytorch_kind(tmp_path)
    engine.llm.tokens_per_block, engine.llm.max_num_blocks = BLOCK, 64
    registry = served(engine, "vllm")
    assert "vllm:cache_config_info" not in samples(registry)  # no iteration stat yet
    # 2 blocks + 5 tokens, then the same 2 blocks + other 9 tokens: 2 blocks reused.
    run_prompts(engine, [SHARED + [1] * 5, SHARED + [2] * 9])
    found = samples(registry)
    assert found["vllm:cache_config_info"] == [
        ({"block_size": "32", "num_gpu_blocks": "64", "enable_prefix_caching": "True"}, 1.0)
    ]
    assert found["vllm:prefix_cache_hits_total"] == [({}, 2 * BLOCK)]  # tokens, as vLLM
    assert found["vllm:prefix_cache_queries_total"] == [({}, 6 * BLOCK)]  # 3 + 3 blocks
    assert found["vllm:num_preemptions_total"] == [({}, 0.0)]


def test_block_reuse_off_reports_no_hits(fake_trtllm, tmp_path: Path):
    engine = load(tmp_path, Settings(trtllm_kv_block_reuse=False))
    engine.llm.tokens_per_block = BLOCK
    registry = served(engine)
    run_prompts(engine, [SHARED, SHARED])
    assert samples(registry)["mtt:prefix_cache_hits_total"] == [({}, 0.0)]


def test_a_release_without_missed_blocks_exports_hits_but_no_queries(fake_trtllm, tmp_path):
    engine = load(tmp_path)
    engine.llm.tokens_per_block, engine.llm.stats_missed_blocks = BLOCK, False
    registry = served(engine)
    run_prompts(engine, [SHARED, SHARED])
    found = samples(registry)
    assert found["mtt:prefix_cache_hits_total"] == [({}, 2 * BLOCK)]
    assert "mtt:prefix_cache_queries_total" not in found  # never made up


def test_trtllm_names_are_trtllm_serves(fake_trtllm, tmp_path: Path):
    engine = load(tmp_path)
    engine.llm.tokens_per_block, engine.llm.max_num_blocks = BLOCK, 64
    registry = served(engine, "trtllm")
    run_prompts(engine, [SHARED, SHARED])
    found = samples(registry)
    # tensorrt_llm/metrics/collector.py::MetricsCollector's names and types
    for gauge in ("num_requests_waiting", "num_requests_running", "kv_cache_utilization"):
        assert f"trtllm_{gauge}" in found
    assert found["trtllm_kv_cache_tokens_per_block"] == [({}, 32.0)]
    assert found["trtllm_kv_cache_max_blocks"] == [({}, 64.0)]
    assert found["trtllm_kv_cache_reused_blocks_total"] == [({}, 2.0)]  # blocks, as upstream
    assert found["trtllm_kv_cache_missed_blocks_total"] == [({}, 2.0)]
    assert "trtllm_prompt_tokens_total" in found
    assert not any(":" in name for name in found)
    text = generate_latest(registry).decode()
    assert "# TYPE trtllm_kv_cache_utilization gauge" in text
    assert "# TYPE trtllm_num_requests_waiting gauge" in text
    assert "# TYPE trtllm_kv_cache_reused_blocks_total counter" in text
    assert "# TYPE trtllm_time_to_first_token_seconds histogram" in text


def test_preemptions_count_each_rise_of_paused_requests():
    reader = CacheStatsReader()
    kv = {"tokensPerBlock": 32, "maxNumBlocks": 10, "reusedBlocks": 0}
    for paused in (0, 2, 2, 1, 3, 0):
        reader.read({"kvCacheStats": kv, "inflightBatchingStats": {"numPausedRequests": paused}})
    assert reader.stats is not None and reader.stats.preemptions == 4  # +2, then +2


def test_preemptions_reach_the_metric_from_the_double(fake_trtllm, tmp_path: Path):
    engine = load(tmp_path)
    engine.llm.paused_requests = 3
    registry = served(engine)
    run_prompts(engine, [[1, 2, 3]])
    assert samples(registry)["mtt:num_preemptions_total"] == [({}, 3.0)]


@pytest.mark.parametrize(
    "stat",
    [
        None,
        "{}",
        {"kvCacheStats": None},
        {"kvCacheStats": {"tokensPerBlock": 0, "maxNumBlocks": 5}},
        {"kvCacheStats": {"tokensPerBlock": "32", "maxNumBlocks": 5}},
        {"kvCacheStats": {"tokensPerBlock": 32}},
        {"inflightBatchingStats": {"numPausedRequests": -1}},
    ],
)
def test_a_stat_without_the_figures_reports_nothing(stat):
    reader = CacheStatsReader()
    reader.read(stat)
    assert reader.stats is None


def test_the_pytorch_engines_report_no_cache_stats():
    # ScriptedEngine stands for every engine without `cache_stats` (both PyTorch engines,
    # replay, the engine process): their families are absent, not zero.
    registry = served(ScriptedEngine())
    found = samples(registry)
    assert "mtt:kv_cache_usage_perc" in found
    for absent in ("cache_config_info", "prefix_cache_hits_total", "num_preemptions_total"):
        assert f"mtt:{absent}" not in found


def test_a_failing_source_never_breaks_a_scrape():
    registry = CollectorRegistry()
    metrics = Metrics(registry)

    def broken() -> CacheStats | None:
        raise RuntimeError("engine gone")

    metrics.engine_cache.source = broken
    assert "mtt:ttft" not in samples(registry)  # scraped without raising


def test_metric_name_renames_only_in_trtllm_mode():
    assert metric_name("vllm:", "kv_cache_usage_perc") == "vllm:kv_cache_usage_perc"
    assert metric_name("trtllm_", "kv_cache_usage_perc") == "trtllm_kv_cache_utilization"
    assert Settings(metrics_names="trtllm").metrics_prefix == "trtllm_"
