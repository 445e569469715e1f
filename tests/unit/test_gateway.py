"""k8s/gateway/: the GKE Inference Gateway objects, checked against the schemas a cluster
enforces (the vendored CRDs of the pinned releases, with unknown fields refused as
`kubectl apply` does with strict field validation; core objects with kubernetes-validate
--strict) and against each other and our pods (selectors, ports, metric names)."""

from __future__ import annotations

import copy
import typing
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from prometheus_client import CollectorRegistry

from mistral_build import gateway, k8s
from mistral_build.deploy_settings import DeploySettings, load_deploy_settings
from mistral_build.paths import K8S_DIR, REPO_ROOT
from mistral_serving.ops.metrics import Metrics
from mistral_serving.settings import Settings

CRD_DIR = REPO_ROOT / "tests" / "data" / "crds"
EXAMPLE = load_deploy_settings(k8s.EXAMPLE_VALUES_FILE)
GKE_KINDS = {"HealthCheckPolicy", "GCPBackendPolicy"}  # GKE's own CRDs: no public schema


def committed() -> dict[str, dict[str, Any]]:
    return {
        p.name: yaml.safe_load(p.read_text()) for p in sorted((K8S_DIR / "gateway").glob("*.yaml"))
    }


def strict(schema: Any) -> Any:
    """The CRD schema with unknown fields refused (the API server prunes or, with
    strict field validation, rejects them; either way they would be lost)."""
    if isinstance(schema, list):
        return [strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: strict(v) for k, v in schema.items()}
    if (
        out.get("type") == "object"
        and "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


@cache
def crd_schemas() -> dict[tuple[str, str], dict[str, Any]]:
    """(apiVersion, kind) -> the strict openAPIV3Schema of every served version."""
    schemas = {}
    for path in CRD_DIR.glob("*.yaml"):
        crd = yaml.safe_load(path.read_text())
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        for version in crd["spec"]["versions"]:
            if version.get("served"):
                schema = copy.deepcopy(version["schema"]["openAPIV3Schema"])
                schema["properties"]["metadata"] = {"type": "object"}  # checked below
                schemas[(f"{group}/{version['name']}", kind)] = strict(schema)
    return schemas


def validate(obj: dict[str, Any]) -> None:
    key = (obj["apiVersion"], obj["kind"])
    if key in crd_schemas():
        jsonschema.validate(obj, crd_schemas()[key])
        meta = obj["metadata"]
        assert set(meta) <= {"name", "namespace", "labels", "annotations"}
        assert all(isinstance(v, str) for v in meta.get("labels", {}).values())
    else:
        kubernetes_validate.validate(obj, kubernetes_validate.latest_version(), strict=True)


# --- validity ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(committed()))
def test_every_gateway_object_validates_strictly(name: str) -> None:
    obj = committed()[name]
    if obj["kind"] in GKE_KINDS:
        assert obj["apiVersion"] == "networking.gke.io/v1"
        assert set(obj["spec"]) == {"targetRef", "default"}
        return
    validate(obj)


def test_the_crds_cover_every_custom_resource_we_render() -> None:
    kinds = {
        (o["apiVersion"], o["kind"])
        for o in committed().values()
        if "." in o["apiVersion"].split("/")[0] and o["kind"] not in GKE_KINDS
    }
    kinds -= {("rbac.authorization.k8s.io/v1", "Role")}
    kinds -= {("rbac.authorization.k8s.io/v1", "RoleBinding")}
    assert kinds == {
        ("inference.networking.k8s.io/v1", "InferencePool"),
        ("gateway.networking.k8s.io/v1", "Gateway"),
        ("gateway.networking.k8s.io/v1", "HTTPRoute"),
    }
    assert kinds <= set(crd_schemas())


@pytest.mark.parametrize(
    "name,mutate",
    [
        ("inferencepool.yaml", lambda o: o["spec"].update(targetPortNumber=8080)),  # v1alpha2
        ("inferencepool.yaml", lambda o: o["spec"]["endpointPickerRef"].update(failureMode="x")),
        ("inferencepool.yaml", lambda o: o["spec"].pop("selector")),
        ("httproute.yaml", lambda o: o["spec"]["rules"][0].update(backendRef={})),
        ("gateway.yaml", lambda o: o["spec"]["listeners"][0].update(port=0)),
    ],
)
def test_strict_validation_refuses_a_wrong_object(name: str, mutate: Any) -> None:
    obj = copy.deepcopy(committed()[name])
    mutate(obj)
    with pytest.raises(jsonschema.ValidationError):
        validate(obj)


@pytest.mark.parametrize(
    "values",
    [
        {"namespace": "llm", "serving": {"metrics_names": "vllm"}},
        {"name": "a" * 63, "port": 9000, "gateway_class": "gke-l7-global-external-managed"},
    ],
)
def test_other_settings_render_valid_gateway_objects(values: dict[str, Any]) -> None:
    s = DeploySettings(**{**EXAMPLE.model_dump(), **values})
    for name, obj in gateway.render_gateway(s).items():
        if obj["kind"] not in GKE_KINDS:
            validate(obj)
        if s.namespace:
            assert obj["metadata"]["namespace"] == s.namespace, name


def test_the_vendored_crds_are_the_current_releases() -> None:
    crd = yaml.safe_load((CRD_DIR / "inference.networking.k8s.io_inferencepools.yaml").read_text())
    bundle = crd["metadata"]["annotations"]["inference.networking.k8s.io/bundle-version"]
    assert bundle == gateway.INFERENCE_EXTENSION_VERSION
    # At least the Inference Extension the router's release installs (v1.5.0 for v0.10.0).
    assert tuple(int(x) for x in bundle[1:].split(".")) >= (1, 5, 0)
    assert gateway.EPP_IMAGE.endswith(":" + gateway.ROUTER_VERSION)
    assert gateway.EPP_IMAGE.startswith("ghcr.io/llm-d/llm-d-router-endpoint-picker:")
    readme = (CRD_DIR / "README.md").read_text()
    assert bundle in readme and gateway.ROUTER_VERSION in readme


# --- the pieces fit together ------------------------------------------------------------


def test_the_pool_selects_our_server_pods_on_their_port_and_nothing_else() -> None:
    objs = committed()
    dep = yaml.safe_load((K8S_DIR / "deployment.yaml").read_text())
    pod_labels = dep["spec"]["template"]["metadata"]["labels"]
    (server,) = dep["spec"]["template"]["spec"]["containers"]
    pool = objs["inferencepool.yaml"]["spec"]
    assert pool["selector"]["matchLabels"].items() <= pod_labels.items()
    assert pool["targetPorts"] == [{"number": server["ports"][0]["containerPort"]}]
    epp_pod_labels = objs["epp-deployment.yaml"]["spec"]["template"]["metadata"]["labels"]
    assert not pool["selector"]["matchLabels"].items() <= epp_pod_labels.items()
    # The picker it names is the EPP Service, on its ext-proc port.
    ref = pool["endpointPickerRef"]
    svc = objs["epp-service.yaml"]
    assert ref["name"] == svc["metadata"]["name"]
    assert ref["port"]["number"] in {p["port"] for p in svc["spec"]["ports"]}
    assert svc["spec"]["selector"].items() <= epp_pod_labels.items()


def test_route_sends_everything_to_the_pool_through_the_gateway() -> None:
    objs = committed()
    gw = objs["gateway.yaml"]
    assert gw["spec"]["gatewayClassName"] == "gke-l7-rilb"
    (rule,) = objs["httproute.yaml"]["spec"]["rules"]
    (parent,) = objs["httproute.yaml"]["spec"]["parentRefs"]
    assert parent["name"] == gw["metadata"]["name"] and parent["kind"] == "Gateway"
    (backend,) = rule["backendRefs"]
    assert (backend["group"], backend["kind"]) == ("inference.networking.k8s.io", "InferencePool")
    assert backend["name"] == objs["inferencepool.yaml"]["metadata"]["name"]
    assert rule["matches"] == [{"path": {"type": "PathPrefix", "value": "/"}}]
    # A stream may last as long as the Truss server allows, through every hop.
    timeout = gateway.request_timeout_seconds()
    assert rule["timeouts"]["request"] == f"{timeout}s"
    assert objs["gke-backendpolicy.yaml"]["spec"]["default"]["timeoutSec"] == timeout


def test_load_balancer_health_check_is_the_servers_health_route() -> None:
    hc = committed()["gke-healthcheckpolicy.yaml"]["spec"]
    assert hc["targetRef"]["kind"] == "InferencePool"
    assert hc["default"]["config"]["httpHealthCheck"] == {"requestPath": "/health", "port": 8080}


def epp_flags(s: DeploySettings) -> dict[str, str]:
    args = gateway.epp_deployment(s)["spec"]["template"]["spec"]["containers"][0]["args"]
    flags, i = {}, 0
    while i < len(args):
        if "=" in args[i]:
            key, _, value = args[i].partition("=")
            flags[key], i = value, i + 1
        else:
            flags[args[i]], i = args[i + 1], i + 2
    return flags


# The router's built-in model-server types (core-metrics-extractor, factories.go,
# defaultEngineConfigs at ROUTER_VERSION).
ROUTER_ENGINES = {"vllm", "sglang", "trtllm-serve", "triton-tensorrt-llm", "triton"}
NAME_MODES = typing.get_args(Settings.model_fields["metrics_names"].annotation)


def picker_config(s: DeploySettings) -> dict[str, Any]:
    data = gateway.epp_config(s)["data"]
    return yaml.safe_load(data[gateway.EPP_CONFIG_FILE])


def plugin(config: dict[str, Any], kind: str) -> dict[str, Any]:
    (found,) = [p for p in config["plugins"] if p["type"] == kind]
    return found.get("parameters", {})


@pytest.mark.parametrize("names", NAME_MODES)
def test_endpoint_picker_reads_the_gauges_the_server_exports(names: str) -> None:
    s = DeploySettings(**{**EXAMPLE.model_dump(), "serving": {"metrics_names": names}})
    config = picker_config(s)
    assert config["apiVersion"] == "llm-d.ai/v1alpha1"
    assert plugin(config, "metrics-data-source")["path"] == k8s.METRICS_PATH
    extractor = plugin(config, "core-metrics-extractor")
    engine = extractor["defaultEngine"]
    assert engine == gateway.picker_engine(names)
    if names == "mtt":  # our own names: an engine config of ours, every name exported
        (ours,) = extractor["engineConfigs"]
        assert ours["name"] == engine and engine not in ROUTER_ENGINES
        registry = CollectorRegistry()
        Metrics(registry, prefix=s.serving_settings.metrics_prefix)
        gauges = {m.name for m in registry.collect() if m.type == "gauge"}
        picked = {ours[k] for k in ("queuedRequestsSpec", "runningRequestsSpec", "kvUsageSpec")}
        assert picked == {
            "mtt:num_requests_waiting",
            "mtt:num_requests_running",
            "mtt:kv_cache_usage_perc",
        }
        assert picked <= gauges
        assert ours["cacheInfoSpec"] == "mtt:cache_config_info"  # the TensorRT-LLM engines'
    else:  # a name set the router knows as its own model-server type
        assert engine in ROUTER_ENGINES and "engineConfigs" not in extractor
    flags = epp_flags(s)
    assert flags["--pool-name"] == gateway.pool_name(s)
    assert flags["--pool-group"] == "inference.networking.k8s.io"
    assert not any("metric" in f for f in flags if f != "--metrics-endpoint-auth")  # deprecated


def test_each_naming_mode_is_a_model_server_type_the_router_knows() -> None:
    """`vllm` and `trtllm` (trtllm-serve's names) are the router's built-in types; `mtt`
    is ours, configured in full."""
    assert set(gateway.PICKER_ENGINES) >= set(NAME_MODES)
    assert gateway.picker_engine("vllm") == "vllm"
    assert gateway.picker_engine("trtllm") == "trtllm-serve"
    assert {gateway.picker_engine(m) for m in ("vllm", "trtllm")} <= ROUTER_ENGINES


def test_committed_endpoint_picker_uses_our_names() -> None:
    dep = committed()["epp-deployment.yaml"]
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    assert c["image"] == gateway.EPP_IMAGE
    # Its plugin configuration is mounted where --config-file points.
    config = committed()["epp-config.yaml"]
    (mount,) = c["volumeMounts"]
    path = c["args"][c["args"].index("--config-file") + 1]
    assert Path(path).parent == Path(mount["mountPath"])
    plugins = yaml.safe_load(config["data"][Path(path).name])
    assert plugins["kind"] == "EndpointPickerConfig"
    assert "mtt:num_requests_waiting" in config["data"][Path(path).name]
    types = {p["type"] for p in plugins["plugins"]}
    refs = {r["pluginRef"] for prof in plugins["schedulingProfiles"] for r in prof["plugins"]}
    assert refs == {"queue-scorer", "kv-cache-utilization-scorer", "prefix-cache-scorer"}
    assert types == refs | {"metrics-data-source", "core-metrics-extractor"}
    # The health port the probes and GKE's controller (9003 by default) ask.
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports["grpc-health"] == gateway.EPP_HEALTH_PORT == 9003
    assert c["readinessProbe"]["grpc"]["port"] == ports["grpc-health"]


def test_endpoint_picker_may_read_pods_and_pools_only() -> None:
    objs = committed()
    role, binding = objs["epp-role.yaml"], objs["epp-rolebinding.yaml"]
    sa = objs["epp-serviceaccount.yaml"]["metadata"]["name"]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa}]
    assert objs["epp-deployment.yaml"]["spec"]["template"]["spec"]["serviceAccountName"] == sa
    for rule in role["rules"]:
        assert set(rule["verbs"]) == {"get", "list", "watch"}
    resources = {r for rule in role["rules"] for r in rule["resources"]}
    assert resources == {"pods", "inferencepools", "inferenceobjectives", "inferencemodelrewrites"}


def test_gateway_is_off_unless_asked() -> None:
    plain = DeploySettings(**{**EXAMPLE.model_dump(), "gateway": False})
    assert not any(n.startswith("gateway/") for n in k8s.render_manifests(plain))
    assert EXAMPLE.gateway and any(n.startswith("gateway/") for n in k8s.render_manifests(EXAMPLE))


# The router decodes its configuration strictly (DisallowUnknownFields: a misspelt key is a
# start-up failure). The field names at ROUTER_VERSION, from its source:
# apix/config/v1alpha1/endpointpickerconfig_types.go (the config, plugins, profiles),
# pkg/epp/framework/plugins/datalayer/source/metrics/datasource.go (metricsDatasourceParams),
# .../extractor/metrics/factories.go (modelServerExtractorParams, engineConfigParams).
ROUTER_FIELDS: dict[str, set[str]] = {
    "config": {"apiVersion", "kind", "featureGates", "plugins", "schedulingProfiles",
               "dataLayer", "flowControl", "requestHandler", "saturationDetector", "parser"},
    "plugin": {"name", "type", "parameters"},
    "profile": {"name", "plugins"},
    "profile plugin": {"pluginRef", "weight"},
    "metrics-data-source": {"scheme", "path", "port", "insecureSkipVerify", "caCertPath",
                            "clientCertPath", "clientKeyPath"},
    "core-metrics-extractor": {"engineLabelKey", "defaultEngine", "engineConfigs"},
    "engine config": {"name", "queuedRequestsSpec", "runningRequestsSpec", "kvUsageSpec",
                      "loraSpec", "cacheInfoSpec", "cacheBlockSizeLabelName",
                      "cacheNumBlocksLabelName", "cacheBlockSizeSpec", "cacheNumBlocksSpec",
                      "customMetrics"},
}  # fmt: skip


@pytest.mark.parametrize("names", NAME_MODES)
def test_the_picker_config_uses_only_the_routers_field_names(names: str) -> None:
    s = DeploySettings(**{**EXAMPLE.model_dump(), "serving": {"metrics_names": names}})
    config = picker_config(s)
    assert set(config) <= ROUTER_FIELDS["config"]
    for p in config["plugins"]:
        assert set(p) <= ROUTER_FIELDS["plugin"]
        if p["type"] in ROUTER_FIELDS:
            assert set(p.get("parameters", {})) <= ROUTER_FIELDS[p["type"]], p["type"]
    for ec in plugin(config, "core-metrics-extractor").get("engineConfigs", []):
        assert set(ec) <= ROUTER_FIELDS["engine config"]
    for profile in config["schedulingProfiles"]:
        assert set(profile) <= ROUTER_FIELDS["profile"]
        assert all(set(r) <= ROUTER_FIELDS["profile plugin"] for r in profile["plugins"])
        # Every profile refers to a declared plugin (the router refuses a dangling ref).
        declared = {p.get("name", p["type"]) for p in config["plugins"]}
        assert {r["pluginRef"] for r in profile["plugins"]} <= declared
