"""`k8s/gateway/`: the GKE Inference Gateway in front of our pods (`--gateway`).

A plain Service balances connections round-robin. An LLM pod's cost per request varies by
orders of magnitude (prompt length, output length, what its KV cache holds), so with many
replicas the load balancer asks an endpoint picker (EPP) where to send each request: it
scrapes every pod's queue and KV-cache gauges and scores queue length, KV-cache use and
prefix-cache affinity. The Gateway API Inference Extension handed its picker to the llm-d
project: the picker is llm-d's router (`llm-d/llm-d-router`, ROUTER_VERSION), the pool is
still the Inference Extension's InferencePool (`inference.networking.k8s.io/v1`).

What is rendered, following the router's `llm-d-router-gateway` Helm chart with
`provider.name=gke` (config/charts/ at ROUTER_VERSION):
- `inferencepool.yaml`: InferencePool selecting our pods on the server port (HTTP/1.1),
  pointing at the EPP Service;
- `epp-*.yaml`: the EPP Deployment, Service, ServiceAccount, Role/RoleBinding (read pods,
  InferencePools, InferenceObjectives) and ConfigMap: its EndpointPickerConfig, whose
  `core-metrics-extractor` reads our metric names as a model-server type (see
  `picker_engine`), and whose `metrics-data-source` scrapes our metrics path;
- `gateway.yaml`, `httproute.yaml`: a Gateway of class `gateway_class` (GKE's internal
  regional L7 load balancer, `gke-l7-rilb`) and an HTTPRoute sending `/` to the pool;
- `gke-healthcheckpolicy.yaml`, `gke-backendpolicy.yaml`: the load balancer's health check
  on `/health` and its backend timeout (GKE's own CRDs, present on any GKE cluster with
  the Gateway API enabled);
- `objective-<name>.yaml`: one InferenceObjective (`llm-d.ai/v1alpha2`) per entry of
  `gateway_objectives`: the priority the router's flow control gives requests that name it
  in `x-llm-d-inference-objective` (the pods order their own queue by the same map).

The pods themselves carry the router's engine-type label (`engine_type_labels`): the router
maps their metric names from it, so `metrics_names: vllm` or `trtllm` needs no engine
config of ours.
"""

from __future__ import annotations

from typing import Any

import yaml

from mistral_build.deploy_settings import DeploySettings
from mistral_build.k8s_objects import (
    GAUGE_KV_CACHE,
    GAUGE_RUNNING,
    GAUGE_WAITING,
    METRICS_PATH,
    labels,
    meta,
    metric_name,
)
from mistral_build.truss_config import truss_config

# llm-d's router: the endpoint picker image and the chart its objects follow. The newest
# release (2026-08-17); its config types and CRDs are vendored in tests/data/.
ROUTER_VERSION = "v0.10.0"
EPP_IMAGE = f"ghcr.io/llm-d/llm-d-router-endpoint-picker:{ROUTER_VERSION}"
# The Gateway API Inference Extension release whose CRDs the pool is validated against
# (tests/data/crds): the newest, at least the one the router's release installs (v1.5.0).
INFERENCE_EXTENSION_VERSION = "v1.6.0"
INFERENCE_POOL_API = "inference.networking.k8s.io/v1"
GATEWAY_API = "gateway.networking.k8s.io/v1"
# The EndpointPickerConfig version ROUTER_VERSION decodes. The router's main branch adds
# `llm-d.ai/v1` (same fields for all we set; only dataLayer's sync/discovery keys move), which
# v0.10.0 refuses to load: the version moves with the first release that has it.
PICKER_CONFIG_API = "llm-d.ai/v1alpha1"
OBJECTIVE_API = "llm-d.ai/v1alpha2"  # InferenceObjective at ROUTER_VERSION
# The pod label the router reads a model server's type from, and the key it falls back to
# (the Inference Extension's, deprecated since router v0.8; older pickers read only it).
ENGINE_TYPE_LABEL = "llm-d.ai/engine-type"
LEGACY_ENGINE_TYPE_LABEL = "inference.networking.k8s.io/engine-type"

EPP_GRPC_PORT = 9002  # ext-proc: the load balancer asks the EPP where to send a request
EPP_HEALTH_PORT = 9003  # GKE's controller health-checks the EPP here by default
EPP_METRICS_PORT = 9090
EPP_CONFIG_FILE = "default-plugins.yaml"
HEALTH_PATH = "/health"  # 200 only when the pod can serve (503 loading or draining)

# The picker's model-server type for each `metrics_names` mode. `vllm` and `trtllm-serve`
# are the router's built-in engine configs (core-metrics-extractor, factories.go:
# `defaultEngineConfigs`); our own `mtt:` names get an engine config of their own.
PICKER_ENGINES = {"mtt": "mistral-trt-truss", "vllm": "vllm", "trtllm": "trtllm-serve"}


def pool_name(s: DeploySettings) -> str:
    return s.name


def epp_name(s: DeploySettings) -> str:
    return f"{s.name[:40]}-epp"


def gateway_name(s: DeploySettings) -> str:
    return f"{s.name[:50]}-gateway"


def request_timeout_seconds() -> int:
    """The longest a request may take through the load balancer: as long as the Truss
    server lets a stream run (config.yaml runtime.streaming_read_timeout)."""
    return int(truss_config()["runtime"]["streaming_read_timeout"])


def _epp_labels() -> dict[str, str]:
    return {"app.kubernetes.io/component": "endpoint-picker"}


def _epp_selector(s: DeploySettings) -> dict[str, str]:
    return {"inferencepool": epp_name(s)}


def epp_args(s: DeploySettings) -> list[str]:
    """The chart's flags (routerlib `_deployment.yaml`): the metric names are no longer
    flags (deprecated for engineConfigs) but the config file's."""
    return [
        "--pool-name",
        pool_name(s),
        "--pool-namespace",
        "$(NAMESPACE)",
        "--pool-group",
        INFERENCE_POOL_API.split("/")[0],
        "--zap-encoder",
        "json",
        "--config-file",
        f"/config/{EPP_CONFIG_FILE}",
        "--grpc-health-port",
        str(EPP_HEALTH_PORT),
        "--tracing=false",
        "--metrics-endpoint-auth=false",
    ]


def picker_engine(names: str) -> str:
    """The model-server type the picker reads a `metrics_names` mode as."""
    return PICKER_ENGINES[names]


def engine_type_labels(s: DeploySettings) -> dict[str, str]:
    """The pod labels that type our server for the router (both keys: a picker before the
    rename reads only the old one). Not in any selector: they may change with the names."""
    engine = picker_engine(s.serving_settings.metrics_names)
    return {ENGINE_TYPE_LABEL: engine, LEGACY_ENGINE_TYPE_LABEL: engine}


def engine_config(s: DeploySettings) -> dict[str, Any]:
    """Our `mtt:` names as a model-server type: the three gauges the scorers read, and the
    KV-cache block size and count (`cache_config_info` labels, which the TensorRT-LLM engines
    export) for prefix-aware scoring."""
    return {
        "name": PICKER_ENGINES["mtt"],
        "queuedRequestsSpec": metric_name(s, GAUGE_WAITING),
        "runningRequestsSpec": metric_name(s, GAUGE_RUNNING),
        "kvUsageSpec": metric_name(s, GAUGE_KV_CACHE),
        "cacheInfoSpec": metric_name(s, "cache_config_info"),
    }


def picker_config(s: DeploySettings) -> dict[str, Any]:
    """The EndpointPickerConfig: the chart's default scheduling profile (queue length,
    KV-cache use, prefix-cache affinity) over metrics scraped from our metrics path. The
    pods' engine-type label picks the metric mapping: the router's own for vllm and
    trtllm-serve names; for our `mtt:` names (no built-in mapping can know them) the one
    engine config we declare, under the name the label gives."""
    extractor: dict[str, Any] = {}
    if s.serving_settings.metrics_names == "mtt":
        extractor["engineConfigs"] = [engine_config(s)]
    scorers = ["queue-scorer", "kv-cache-utilization-scorer", "prefix-cache-scorer"]
    return {
        "apiVersion": PICKER_CONFIG_API,
        "kind": "EndpointPickerConfig",
        "plugins": [
            *({"type": t} for t in scorers),
            {
                "type": "metrics-data-source",
                "parameters": {"scheme": "http", "path": METRICS_PATH, "insecureSkipVerify": True},
            },
            {"type": "core-metrics-extractor", **({"parameters": extractor} if extractor else {})},
        ],
        "schedulingProfiles": [
            {
                "name": "default",
                "plugins": [
                    {"pluginRef": "queue-scorer", "weight": 2},
                    {"pluginRef": "kv-cache-utilization-scorer", "weight": 2},
                    {"pluginRef": "prefix-cache-scorer", "weight": 3},
                ],
            }
        ],
    }


def inference_pool(s: DeploySettings) -> dict[str, Any]:
    return {
        "apiVersion": INFERENCE_POOL_API,
        "kind": "InferencePool",
        "metadata": meta(s, pool_name(s)),
        "spec": {
            "selector": {"matchLabels": labels(s)},
            "targetPorts": [{"number": s.port}],
            "appProtocol": "http",  # HTTP/1.1 (uvicorn)
            "endpointPickerRef": {
                "name": epp_name(s),
                "port": {"number": EPP_GRPC_PORT},
                # No picker, no routing: better an error than traffic on a blind guess.
                "failureMode": "FailClose",
            },
        },
    }


def epp_service_account(s: DeploySettings) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": meta(s, epp_name(s), _epp_labels()),
    }


def epp_role(s: DeploySettings) -> dict[str, Any]:
    read = ["get", "watch", "list"]
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": meta(s, epp_name(s), _epp_labels()),
        "rules": [
            {  # the router reads them under its own group now, the old one still
                "apiGroups": ["inference.networking.x-k8s.io", "llm-d.ai"],
                "resources": ["inferenceobjectives", "inferencemodelrewrites"],
                "verbs": read,
            },
            {
                "apiGroups": [INFERENCE_POOL_API.split("/")[0]],
                "resources": ["inferencepools"],
                "verbs": read,
            },
            {"apiGroups": [""], "resources": ["pods"], "verbs": read},
        ],
    }


def epp_role_binding(s: DeploySettings) -> dict[str, Any]:
    subject: dict[str, Any] = {"kind": "ServiceAccount", "name": epp_name(s)}
    if s.namespace:
        subject["namespace"] = s.namespace
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": meta(s, epp_name(s), _epp_labels()),
        "subjects": [subject],
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": epp_name(s)},
    }


def epp_config(s: DeploySettings) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": meta(s, epp_name(s), _epp_labels()),
        "data": {EPP_CONFIG_FILE: yaml.safe_dump(picker_config(s), sort_keys=False)},
    }


def epp_deployment(s: DeploySettings) -> dict[str, Any]:
    def field_env(name: str, path: str) -> dict[str, Any]:
        return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}

    def grpc_probe() -> dict[str, Any]:
        return {"grpc": {"port": EPP_HEALTH_PORT, "service": "inference-extension"}}

    container = {
        "name": "epp",
        "image": EPP_IMAGE,
        "imagePullPolicy": "IfNotPresent",
        "args": epp_args(s),
        "ports": [
            {"name": "grpc", "containerPort": EPP_GRPC_PORT},
            {"name": "grpc-health", "containerPort": EPP_HEALTH_PORT},
            {"name": "metrics", "containerPort": EPP_METRICS_PORT},
        ],
        "livenessProbe": {**grpc_probe(), "initialDelaySeconds": 5, "periodSeconds": 10},
        "readinessProbe": {**grpc_probe(), "periodSeconds": 2},
        "env": [
            field_env("NAMESPACE", "metadata.namespace"),
            field_env("POD_NAME", "metadata.name"),
        ],
        # The chart asks 8 CPUs / 8Gi for large pools; a pool of a few GPU pods needs less.
        "resources": {"requests": {"cpu": "2", "memory": "2Gi"}, "limits": {"memory": "8Gi"}},
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 65532,  # the image is distroless `nonroot` (uid 65532)
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": [{"name": "plugins-config", "mountPath": "/config"}],
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta(s, epp_name(s), _epp_labels()),
        "spec": {
            "replicas": 1,
            # One active picker (its prefix-cache state is in memory): replace, not surge.
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": _epp_selector(s)},
            "template": {
                "metadata": {"labels": _epp_selector(s)},
                "spec": {
                    "serviceAccountName": epp_name(s),
                    # As long as the pods it routes to may take to drain.
                    "terminationGracePeriodSeconds": s.termination_grace_period_seconds,
                    "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
                    "containers": [container],
                    "volumes": [{"name": "plugins-config", "configMap": {"name": epp_name(s)}}],
                },
            },
        },
    }


def epp_service(s: DeploySettings) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta(s, epp_name(s), _epp_labels()),
        "spec": {
            "type": "ClusterIP",
            "selector": _epp_selector(s),
            "ports": [
                {
                    "name": "grpc-ext-proc",
                    "protocol": "TCP",
                    "port": EPP_GRPC_PORT,
                    "appProtocol": "kubernetes.io/h2c",
                },
                {"name": "http-metrics", "protocol": "TCP", "port": EPP_METRICS_PORT},
            ],
        },
    }


def gateway(s: DeploySettings) -> dict[str, Any]:
    return {
        "apiVersion": GATEWAY_API,
        "kind": "Gateway",
        "metadata": meta(s, gateway_name(s)),
        "spec": {
            "gatewayClassName": s.gateway_class,
            "listeners": [{"name": "http", "port": 80, "protocol": "HTTP"}],
        },
    }


def http_route(s: DeploySettings) -> dict[str, Any]:
    return {
        "apiVersion": GATEWAY_API,
        "kind": "HTTPRoute",
        "metadata": meta(s, s.name),
        "spec": {
            "parentRefs": [
                {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": gateway_name(s)}
            ],
            "rules": [
                {
                    "matches": [{"path": {"type": "PathPrefix", "value": "/"}}],
                    "backendRefs": [
                        {
                            "group": INFERENCE_POOL_API.split("/")[0],
                            "kind": "InferencePool",
                            "name": pool_name(s),
                        }
                    ],
                    "timeouts": {"request": f"{request_timeout_seconds()}s"},
                }
            ],
        },
    }


def _pool_target_ref(s: DeploySettings) -> dict[str, str]:
    return {
        "group": INFERENCE_POOL_API.split("/")[0],
        "kind": "InferencePool",
        "name": pool_name(s),
    }


def health_check_policy(s: DeploySettings) -> dict[str, Any]:
    return {
        "apiVersion": "networking.gke.io/v1",
        "kind": "HealthCheckPolicy",
        "metadata": meta(s, s.name),
        "spec": {
            "targetRef": _pool_target_ref(s),
            "default": {
                "timeoutSec": 2,
                "checkIntervalSec": 2,
                "config": {
                    "type": "HTTP",
                    "httpHealthCheck": {"requestPath": HEALTH_PATH, "port": s.port},
                },
            },
        },
    }


def backend_policy(s: DeploySettings) -> dict[str, Any]:
    return {
        "apiVersion": "networking.gke.io/v1",
        "kind": "GCPBackendPolicy",
        "metadata": meta(s, s.name),
        "spec": {
            "targetRef": _pool_target_ref(s),
            "default": {"timeoutSec": request_timeout_seconds(), "logging": {"enabled": True}},
        },
    }


def inference_objective(s: DeploySettings, name: str, priority: int) -> dict[str, Any]:
    """A named priority for requests that carry `x-llm-d-inference-objective: <name>` (the
    router's flow control serves higher priorities first; no objective is priority 0)."""
    return {
        "apiVersion": OBJECTIVE_API,
        "kind": "InferenceObjective",
        "metadata": meta(s, name),
        "spec": {
            "priority": priority,
            "poolRef": {"group": INFERENCE_POOL_API.split("/")[0], "name": pool_name(s)},
        },
    }


def render_gateway(s: DeploySettings) -> dict[str, dict[str, Any]]:
    """File name inside k8s/gateway/ -> the object it holds."""
    objectives = {
        f"objective-{name}.yaml": inference_objective(s, name, priority)
        for name, priority in sorted(s.gateway_objectives.items())
    }
    return {
        **objectives,
        "inferencepool.yaml": inference_pool(s),
        "epp-serviceaccount.yaml": epp_service_account(s),
        "epp-role.yaml": epp_role(s),
        "epp-rolebinding.yaml": epp_role_binding(s),
        "epp-config.yaml": epp_config(s),
        "epp-deployment.yaml": epp_deployment(s),
        "epp-service.yaml": epp_service(s),
        "gateway.yaml": gateway(s),
        "httproute.yaml": http_route(s),
        "gke-healthcheckpolicy.yaml": health_check_policy(s),
        "gke-backendpolicy.yaml": backend_policy(s),
    }
