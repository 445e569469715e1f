"""`k8s/gateway/`: the GKE Inference Gateway in front of our pods (`--gateway`).

A plain Service balances connections round-robin. An LLM pod's cost per request varies by
orders of magnitude (prompt length, output length, what its KV cache holds), so with many
replicas the Gateway API Inference Extension routes each request through an endpoint
picker (EPP) that scrapes every pod's queue and KV-cache gauges and picks the least loaded.

What is rendered, following the pinned release's `inferencepool` Helm chart with
`provider.name=gke` (config/charts/inferencepool at INFERENCE_EXTENSION_VERSION):
- `inferencepool.yaml`: InferencePool selecting our pods on the server port, pointing at
  the EPP Service;
- `epp-*.yaml`: the EPP Deployment, Service, ServiceAccount, Role/RoleBinding (read pods
  and InferencePools) and ConfigMap (its scheduling plugins), with our metric names;
- `gateway.yaml`, `httproute.yaml`: a Gateway of class `gateway_class` (GKE's internal
  regional L7 load balancer, `gke-l7-rilb`) and an HTTPRoute sending `/` to the pool;
- `gke-healthcheckpolicy.yaml`, `gke-backendpolicy.yaml`: the load balancer's health check
  on `/health` and its backend timeout (GKE's own CRDs, present on any GKE cluster with
  the Gateway API enabled).
"""

from __future__ import annotations

from typing import Any

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

# The Gateway API Inference Extension release: the EPP image and the CRDs the objects are
# validated against (tests/data/crds) come from the same tag.
INFERENCE_EXTENSION_VERSION = "v1.3.1"
EPP_IMAGE = f"registry.k8s.io/gateway-api-inference-extension/epp:{INFERENCE_EXTENSION_VERSION}"
INFERENCE_POOL_API = "inference.networking.k8s.io/v1"
GATEWAY_API = "gateway.networking.k8s.io/v1"

EPP_GRPC_PORT = 9002  # ext-proc: the load balancer asks the EPP where to send a request
EPP_HEALTH_PORT = 9003
EPP_METRICS_PORT = 9090
EPP_CONFIG_FILE = "default-plugins.yaml"
HEALTH_PATH = "/health"  # 200 only when the pod can serve (503 loading or draining)

# The chart's default scheduling profile: queue length, KV-cache use and prefix-cache hits.
EPP_PLUGINS = """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: prefix-cache-scorer
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
    weight: 2
  - pluginRef: kv-cache-utilization-scorer
    weight: 2
  - pluginRef: prefix-cache-scorer
    weight: 3
"""


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
    args = [
        "--pool-name",
        pool_name(s),
        "--pool-namespace",
        "$(NAMESPACE)",
        "--config-file",
        f"/config/{EPP_CONFIG_FILE}",
        "--zap-encoder",
        "json",
        "--model-server-metrics-path",
        METRICS_PATH,
        "--total-queued-requests-metric",
        metric_name(s, GAUGE_WAITING),
        "--total-running-requests-metric",
        metric_name(s, GAUGE_RUNNING),
        "--kv-cache-usage-percentage-metric",
        metric_name(s, GAUGE_KV_CACHE),
        # We export neither LoRA nor cache-config info: an empty name turns the scrape off.
        "--lora-info-metric",
        "",
        "--cache-info-metric",
        "",
        "--tracing=false",
        "--metrics-endpoint-auth=false",
    ]
    return args


def inference_pool(s: DeploySettings) -> dict[str, Any]:
    return {
        "apiVersion": INFERENCE_POOL_API,
        "kind": "InferencePool",
        "metadata": meta(s, pool_name(s)),
        "spec": {
            "selector": {"matchLabels": labels(s)},
            "targetPorts": [{"number": s.port}],
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
            {
                "apiGroups": ["inference.networking.x-k8s.io"],
                "resources": ["inferenceobjectives"],
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
        "data": {EPP_CONFIG_FILE: EPP_PLUGINS},
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
        "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "4Gi"}},
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
                {"name": "grpc-ext-proc", "protocol": "TCP", "port": EPP_GRPC_PORT},
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


def render_gateway(s: DeploySettings) -> dict[str, dict[str, Any]]:
    """File name inside k8s/gateway/ -> the object it holds."""
    return {
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
