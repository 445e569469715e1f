"""Prometheus metrics, named and bucketed as vLLM's `vllm:*` metrics are.

They are registered on prometheus_client's default registry, which the server serves at
`GET /metrics`. With several front-end processes (`frontend_group.py`) each records into
prometheus_client's multiprocess directory and `/metrics`, from whichever answers, sums
them all (`exposition`); the engine's own figures are read from the shared engine.

The prefix is `mtt:`, or `vllm:` with `metrics_names: vllm`, or `trtllm_`
with `metrics_names: trtllm` (then the names trtllm-serve gives the same figures, from
`tensorrt_llm/metrics/collector.py::MetricsCollector`, where they differ from vLLM's), so
that vLLM dashboards and the Inference Gateway's endpoint picker (which routes on the
waiting and running requests, the KV-cache use, and for prefix-aware scoring the block
size in `cache_config_info`) read them as their own. The README lists them.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

from prometheus_client import (
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

PREFIX = "mtt:"
# prometheus_client's own variable: set (by the launcher of several front-end processes)
# before it is imported, its values live in files there, one set per process.
MULTIPROC_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"
TRTLLM_PREFIX = "trtllm_"
# trtllm-serve's names (MetricsCollector) for the figures it names differently from vLLM.
TRTLLM_NAMES = {"kv_cache_usage_perc": "kv_cache_utilization"}


def prefix_for(names: str) -> str:
    """The prefix of a `metrics_names` mode: `mtt:`, `vllm:`, `trtllm_`."""
    return TRTLLM_PREFIX if names == "trtllm" else names + ":"


def metric_name(prefix: str, base: str) -> str:
    """The exported name of the figure `base` (a name of the `mtt:` set, without a
    counter's `_total`) under `prefix`."""
    if prefix == TRTLLM_PREFIX:
        base = TRTLLM_NAMES.get(base, base)
    return prefix + base


@dataclass(frozen=True)
class CacheStats:
    """What an engine with a paged KV cache reports about it (TensorRT-LLM's iteration
    stats). Counts are totals since the engine started."""

    block_size: int  # tokens per KV-cache block
    num_gpu_blocks: int
    reused_blocks: int  # prompt blocks found in the prefix cache (block reuse)
    missed_blocks: int | None  # prompt blocks not found; None where the release omits it
    preemptions: int  # requests paused (evicted from the batch) and resumed later


class GaugedEngine(Protocol):
    def kv_cache_usage(self) -> float: ...


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


class EngineUsageCollector(Collector):
    """The KV cache's use, read from the engine at each scrape (0 before it is loaded):
    one figure of the one engine however many front-end processes serve it."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.source: Callable[[], float] | None = None

    HELP = "Fraction of the engine's KV cache in use (0-1)."

    def collect(self) -> Iterator[GaugeMetricFamily]:
        try:
            value = float(self.source()) if self.source is not None else 0.0
        except Exception:  # a scrape must never fail for an engine's figure
            value = 0.0
        yield _gauge(self.name, self.HELP, value)

    def describe(self) -> Iterator[GaugeMetricFamily]:
        yield _gauge(self.name, self.HELP, 0.0)


class EngineCacheCollector(Collector):
    """`cache_config_info`, prefix-cache queries and hits and preemptions, read from the
    engine's `cache_stats()` at each scrape. An engine that reports none (the PyTorch
    engines: no block reuse, no preemption) exports none of these."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.source: Callable[[], CacheStats | None] | None = None

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        try:
            stats = self.source() if self.source is not None else None
        except Exception:  # a scrape must never fail for an engine's figure
            stats = None
        if stats is None:
            return
        name = self._name
        blocks = stats.block_size
        info = GaugeMetricFamily(
            name("cache_config_info"),
            "KV-cache configuration: block size (tokens) and number of GPU blocks.",
            labels=["block_size", "num_gpu_blocks", "enable_prefix_caching"],
        )
        info.add_metric([str(blocks), str(stats.num_gpu_blocks), "True"], 1.0)
        yield info
        if self.prefix == TRTLLM_PREFIX:  # trtllm-serve's own figures, counted in blocks
            yield _gauge(name("kv_cache_tokens_per_block"), "Tokens per KV-cache block.", blocks)
            yield _gauge(name("kv_cache_max_blocks"), "KV-cache blocks.", stats.num_gpu_blocks)
            yield CounterMetricFamily(
                name("kv_cache_reused_blocks"),
                "Prompt KV-cache blocks reused (prefix-cache hits).",
                value=stats.reused_blocks,
            )
            if stats.missed_blocks is not None:
                yield CounterMetricFamily(
                    name("kv_cache_missed_blocks"),
                    "Prompt KV-cache blocks not found (prefix-cache misses).",
                    value=stats.missed_blocks,
                )
        else:  # vLLM counts tokens: whole blocks times their size
            yield CounterMetricFamily(
                name("prefix_cache_hits"),
                "Prompt tokens found in the prefix cache (whole blocks).",
                value=stats.reused_blocks * blocks,
            )
            if stats.missed_blocks is not None:
                yield CounterMetricFamily(
                    name("prefix_cache_queries"),
                    "Prompt tokens looked up in the prefix cache (whole blocks).",
                    value=(stats.reused_blocks + stats.missed_blocks) * blocks,
                )
        yield CounterMetricFamily(
            name("num_preemptions"),
            "Requests preempted (paused, to resume later) by the engine's scheduler.",
            value=stats.preemptions,
        )

    def describe(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        return iter(())  # the families depend on the engine: known only at scrape

    def _name(self, base: str) -> str:
        return metric_name(self.prefix, base)


# vLLM's buckets for the same figures (vllm/engine/metrics.py).
TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
TPOT_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
E2E_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
GC_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000)


class Metrics:
    def __init__(self, registry: CollectorRegistry = REGISTRY, prefix: str = PREFIX) -> None:
        # Kept whole: a flat table of metric declarations, one per series, no logic to split.
        def name(n: str) -> str:
            return metric_name(prefix, n)

        self.ttft = Histogram(
            name("time_to_first_token_seconds"),
            "Time from request arrival to its first output text.",
            ["route"],
            buckets=TTFT_BUCKETS,
            registry=registry,
        )
        self.tpot = Histogram(
            name("time_per_output_token_seconds"),
            "Mean time per output token after the first, per request.",
            ["route"],
            buckets=TPOT_BUCKETS,
            registry=registry,
        )
        self.e2e = Histogram(
            name("e2e_request_latency_seconds"),
            "Time from request arrival to its last output.",
            ["route"],
            buckets=E2E_BUCKETS,
            registry=registry,
        )
        self.queue_time = Histogram(
            name("request_queue_time_seconds"),
            "Time a request waited for an engine slot.",
            buckets=TTFT_BUCKETS,
            registry=registry,
        )
        self.prompt_tokens = Counter(
            name("prompt_tokens"), "Prompt tokens processed.", registry=registry
        )
        self.generation_tokens = Counter(
            name("generation_tokens"), "Output tokens generated.", registry=registry
        )
        self.request_prompt_tokens = Histogram(
            name("request_prompt_tokens"),
            "Prompt tokens per request.",
            buckets=TOKEN_BUCKETS,
            registry=registry,
        )
        self.request_generation_tokens = Histogram(
            name("request_generation_tokens"),
            "Output tokens per request.",
            buckets=TOKEN_BUCKETS,
            registry=registry,
        )
        self.finished = Counter(
            name("request_finished"),
            "Requests finished, by route and reason: stop, length, abort, error (generation "
            "ended so), invalid (4xx: bad body or field), rejected (429/503), client_gone "
            "(left before the model saw it).",
            ["route", "finished_reason"],
            registry=registry,
        )
        self.rejected = Counter(
            name("request_rejected"),
            "Requests refused before generating (queue_full, draining: 503; key_limit: 429).",
            ["reason"],
            registry=registry,
        )
        # multiprocess_mode: how several front-end processes' values add up (livesum:
        # the live processes' sum); ignored in one process.
        self.running = Gauge(
            name("num_requests_running"),
            "Requests generating now.",
            registry=registry,
            multiprocess_mode="livesum",
        )
        self.waiting = Gauge(
            name("num_requests_waiting"),
            "Requests waiting for a slot.",
            registry=registry,
            multiprocess_mode="livesum",
        )
        self.kv_cache_usage = EngineUsageCollector(name("kv_cache_usage_perc"))
        registry.register(self.kv_cache_usage)
        self.gc_pause = Histogram(
            name("gc_pause_seconds"),
            "Python garbage-collection pauses, by generation (the whole process waits).",
            ["generation"],
            buckets=GC_BUCKETS,
            registry=registry,
        )
        self.artifact = Gauge(
            name("artifact_info"),
            "What is served (1): its build manifest in one line.",
            ["engine", "artifact", "manifest"],
            registry=registry,
            multiprocess_mode="max",
        )
        self.engine_cache = EngineCacheCollector(prefix)
        registry.register(self.engine_cache)

    def bind_engine(self, engine: GaugedEngine) -> None:
        """Read the figures the engine keeps: KV-cache use, and its cache stats if it has
        them (an optional `cache_stats()`)."""
        self.kv_cache_usage.source = engine.kv_cache_usage
        self.engine_cache.source = getattr(engine, "cache_stats", None)


def exposition(metrics: Metrics) -> bytes:
    """What `GET /metrics` answers: the default registry, or, with several front-end
    processes, every process's figures summed (prometheus_client's multiprocess mode,
    chosen by its PROMETHEUS_MULTIPROC_DIR) and the engine's, read here."""
    if not os.environ.get(MULTIPROC_DIR_ENV):
        return generate_latest(REGISTRY)
    from prometheus_client import multiprocess

    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
    registry.register(metrics.kv_cache_usage)
    registry.register(metrics.engine_cache)
    return generate_latest(registry)


_defaults: dict[str, Metrics] = {}


def default_metrics(prefix: str = PREFIX) -> Metrics:
    """The process's metrics on the default registry (created once per prefix: a second
    registration of the same names would fail)."""
    if prefix not in _defaults:
        _defaults[prefix] = Metrics(prefix=prefix)
    return _defaults[prefix]
