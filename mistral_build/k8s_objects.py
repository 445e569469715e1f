"""What every rendered Kubernetes object shares: names, labels, metadata, metric names,
the server's routes and the image's user.

A neutral module: `k8s.py` (the workload) and `gateway.py` (the Inference Gateway) both
read it, and `k8s.py` renders the gateway's objects without `gateway.py` importing it back.
"""

from __future__ import annotations

from typing import Any

from mistral_build.deploy_settings import DeploySettings
from mistral_serving.ops import metrics

HF_SECRET_KEY = "hf_access_token"  # Truss secret name (config.yaml `secrets`).
HF_SECRET_ENV = "TRUSS_SECRET_" + HF_SECRET_KEY  # how Truss reads a secret from the env.

# Truss server routes (truss/templates/server/truss_server.py; model name is "model").
LIVE_PATH = "/"
READY_PATH = "/v1/models/model"
METRICS_PATH = "/metrics/"  # the Truss metrics mount; answers on every server version

NON_ROOT_UID = 60000  # the `app` user the Truss Dockerfile creates (BT_USE_NON_ROOT_USER).

# The service's gauges (mistral_serving.ops.metrics) that the HPA and the endpoint picker read.
GAUGE_WAITING = "num_requests_waiting"
GAUGE_RUNNING = "num_requests_running"
GAUGE_KV_CACHE = "kv_cache_usage_perc"


def labels(s: DeploySettings) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "mistral-trt-truss",
        "app.kubernetes.io/instance": s.name,
        "app.kubernetes.io/component": "llm-server",
    }


def meta(s: DeploySettings, name: str, extra_labels: dict[str, str] | None = None) -> dict:
    m: dict[str, Any] = {"name": name}
    if s.namespace:
        m["namespace"] = s.namespace
    m["labels"] = {
        **labels(s),
        "app.kubernetes.io/part-of": "mistral-trt-truss",
        **(extra_labels or {}),
    }
    return m


def metric_name(s: DeploySettings, gauge: str) -> str:
    """The name the pod exports a gauge under (Settings.metrics_names picks the names; the
    serving library's own rule, so `trtllm`'s renamed gauges match)."""
    return metrics.metric_name(s.serving_settings.metrics_prefix, gauge)


def hf_token_env(s: DeploySettings) -> dict[str, Any]:
    """The Hub token from the deployment's Secret; the pod waits until the Secret exists."""
    ref = {"name": s.hf_token_secret, "key": HF_SECRET_KEY, "optional": False}
    return {"name": HF_SECRET_ENV, "valueFrom": {"secretKeyRef": ref}}
