"""Prometheus metrics, named and bucketed as vLLM's `vllm:*` metrics are.

They are registered on prometheus_client's default registry, which the server serves at
`GET /metrics`. The prefix is `mtt:` or, with `metrics_names: vllm`, `vllm:`, so that
vLLM dashboards and the Gateway API Inference Extension's endpoint picker (which routes
on `num_requests_waiting`, `num_requests_running` and `kv_cache_usage_perc`) read them
unchanged. The README lists them with example PromQL.
"""

from __future__ import annotations

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

PREFIX = "mtt:"
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
        def name(n: str) -> str:
            return prefix + n

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
            "Requests refused before generating (queue_full, draining).",
            ["reason"],
            registry=registry,
        )
        self.running = Gauge(
            name("num_requests_running"), "Requests generating now.", registry=registry
        )
        self.waiting = Gauge(
            name("num_requests_waiting"), "Requests waiting for a slot.", registry=registry
        )
        self.kv_cache_usage = Gauge(
            name("kv_cache_usage_perc"),
            "Fraction of the engine's KV cache in use (0-1).",
            registry=registry,
        )
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
        )


_defaults: dict[str, Metrics] = {}


def default_metrics(prefix: str = PREFIX) -> Metrics:
    """The process's metrics on the default registry (created once per prefix: a second
    registration of the same names would fail)."""
    if prefix not in _defaults:
        _defaults[prefix] = Metrics(prefix=prefix)
    return _defaults[prefix]
