"""k8s/gateway/: the GKE Inference Gateway objects, checked against the schemas a cluster
enforces (the vendored CRDs of the pinned releases, with unknown fields refused as
`kubectl apply` does with strict field validation; core objects with kubernetes-validate
--strict) and against each other and our pods (selectors, ports, metric names)."""

from __future__ import annotations

import copy
import json
import re
import typing
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from mistral_build import gateway, k8s
from mistral_build.deploy_settings import (
    DeploySettings,
    DeploySettingsError,
    load_deploy_settings,
)
from mistral_build.paths import K8S_DIR, REPO_ROOT
from mistral_serving.ops.metrics import Metrics
from mistral_serving.settings import Settings
from tests.router_types import ROUTER_DATA, load_structs, unknown_fields

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
        ("llm-d.ai/v1alpha2", "InferenceObjective"),
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
        ("objective-batch.yaml", lambda o: o["spec"].pop("poolRef")),
        ("objective-batch.yaml", lambda o: o["spec"].update(priority="high")),
        ("objective-batch.yaml", lambda o: o["spec"].update(criticality="Critical")),  # v1alpha1
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
    # The router's own files come from the pinned release, and each names where it came from.
    assert (ROUTER_DATA / gateway.ROUTER_VERSION).is_dir()
    vendored = [CRD_DIR / "llm-d.ai_inferenceobjectives.yaml"]
    vendored += sorted((ROUTER_DATA / gateway.ROUTER_VERSION).glob("*.go"))
    for path in vendored:
        head = path.read_text().splitlines()[:2]
        assert "github.com/llm-d/llm-d-router" in head[0], path
        assert f"at tag {gateway.ROUTER_VERSION} (commit " in head[1], path


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


NAME_MODES = typing.get_args(Settings.model_fields["metrics_names"].annotation)
ROUTER_STRUCTS = load_structs(gateway.ROUTER_VERSION)
# A plugin's parameters struct, by plugin type (their factories decode them strictly).
PLUGIN_PARAMETERS = {
    "metrics-data-source": "metricsDatasourceParams",
    "core-metrics-extractor": "modelServerExtractorParams",
}
_BUILT_IN = re.compile(r"\{\s*Name:\s*\"([^\"]+)\",(.*?)\n\t\}", re.S)
_SPEC = re.compile(r"(\w+Spec):\s*\"([^\"]*)\"")


def built_in_engines() -> dict[str, dict[str, str]]:
    """The router's built-in model-server types and their metric specs, read from
    `defaultEngineConfigs` in the vendored factories.go of ROUTER_VERSION."""
    source = (ROUTER_DATA / gateway.ROUTER_VERSION / "metrics_extractor_factories.go").read_text()
    table = source[source.index("var defaultEngineConfigs") :]
    table = table[: table.index("\n}\n")]
    return {
        name: {key: spec for key, spec in _SPEC.findall(body) if spec}
        for name, body in _BUILT_IN.findall(table)
    }


def settings_for(names: str, **values: Any) -> DeploySettings:
    return DeploySettings(**{**EXAMPLE.model_dump(), "serving": {"metrics_names": names}, **values})


def picker_config(s: DeploySettings) -> dict[str, Any]:
    data = gateway.epp_config(s)["data"]
    return yaml.safe_load(data[gateway.EPP_CONFIG_FILE])


def plugin(config: dict[str, Any], kind: str) -> dict[str, Any]:
    (found,) = [p for p in config["plugins"] if p["type"] == kind]
    return found.get("parameters", {})


def exported_gauges(s: DeploySettings) -> set[str]:
    registry = CollectorRegistry()
    Metrics(registry, prefix=s.serving_settings.metrics_prefix)
    return {m.name for m in registry.collect() if m.type == "gauge"}


def pod_labels(s: DeploySettings) -> dict[str, str]:
    return k8s.deployment(s)["spec"]["template"]["metadata"]["labels"]


def test_the_vendored_router_table_is_read_whole() -> None:
    engines = built_in_engines()
    assert set(engines) == {"vllm", "sglang", "trtllm-serve", "triton-tensorrt-llm", "triton"}
    assert engines["trtllm-serve"]["QueuedRequestsSpec"] == "trtllm_num_requests_waiting"
    assert engines["vllm"]["KVUsageSpec"] == "vllm:kv_cache_usage_perc"


@pytest.mark.parametrize("names", ["vllm", "trtllm"])
def test_a_known_engines_names_are_typed_by_the_label_alone(names: str) -> None:
    """vllm and trtllm-serve names: the pods say their type, the router's own mapping reads
    every gauge it scores on, and the config declares no engine of ours."""
    s = settings_for(names)
    engine = gateway.picker_engine(names)
    labels = pod_labels(s)
    assert engine == {"trtllm": "trtllm-serve", "vllm": "vllm"}[names]
    assert labels[gateway.ENGINE_TYPE_LABEL] == labels[gateway.LEGACY_ENGINE_TYPE_LABEL] == engine
    mapping = built_in_engines()[engine]
    scored = {mapping[k] for k in ("QueuedRequestsSpec", "RunningRequestsSpec", "KVUsageSpec")}
    assert scored <= exported_gauges(s)
    assert "parameters" not in next(
        p for p in picker_config(s)["plugins"] if p["type"] == "core-metrics-extractor"
    )


def test_our_own_names_keep_the_one_engine_config_the_label_names() -> None:
    """`mtt:` names: no built-in mapping can know them, so the config declares them under
    the engine name the pods' label carries (and nothing else)."""
    s = settings_for("mtt")
    engine = gateway.picker_engine("mtt")
    assert engine not in built_in_engines()
    assert pod_labels(s)[gateway.ENGINE_TYPE_LABEL] == engine
    (ours,) = plugin(picker_config(s), "core-metrics-extractor")["engineConfigs"]
    assert set(plugin(picker_config(s), "core-metrics-extractor")) == {"engineConfigs"}
    assert ours["name"] == engine
    picked = {ours[k] for k in ("queuedRequestsSpec", "runningRequestsSpec", "kvUsageSpec")}
    assert picked == {
        "mtt:num_requests_waiting",
        "mtt:num_requests_running",
        "mtt:kv_cache_usage_perc",
    }
    assert picked <= exported_gauges(s)
    assert ours["cacheInfoSpec"] == "mtt:cache_config_info"  # the TensorRT-LLM engines'


@pytest.mark.parametrize("names", NAME_MODES)
def test_the_engine_type_is_on_the_pods_and_in_no_selector(names: str) -> None:
    s = settings_for(names)
    dep = k8s.deployment(s)
    keys = {gateway.ENGINE_TYPE_LABEL, gateway.LEGACY_ENGINE_TYPE_LABEL}
    assert keys <= set(pod_labels(s))
    assert not keys & set(dep["spec"]["selector"]["matchLabels"])
    assert not keys & set(gateway.inference_pool(s)["spec"]["selector"]["matchLabels"])
    # The key the router's release reads by default (its parameters' documentation).
    source = (ROUTER_DATA / gateway.ROUTER_VERSION / "metrics_extractor_factories.go").read_text()
    assert f'Defaults to "{gateway.ENGINE_TYPE_LABEL}"' in source


@pytest.mark.parametrize("names", NAME_MODES)
def test_the_picker_reads_our_metrics_path(names: str) -> None:
    s = settings_for(names)
    config = picker_config(s)
    assert config["apiVersion"] == gateway.PICKER_CONFIG_API == "llm-d.ai/v1alpha1"
    assert plugin(config, "metrics-data-source")["path"] == k8s.METRICS_PATH
    flags = epp_flags(s)
    assert flags["--pool-name"] == gateway.pool_name(s)
    assert flags["--pool-group"] == "inference.networking.k8s.io"
    assert not any("metric" in f for f in flags if f != "--metrics-endpoint-auth")  # deprecated


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
    assert EXAMPLE.serving_settings.metrics_names == "trtllm"  # the example: a known engine
    assert "engineConfigs" not in config["data"][Path(path).name]
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


def config_problems(config: dict[str, Any]) -> list[str]:
    """What the router at ROUTER_VERSION would refuse in this config: unknown keys of the
    config, its plugins and profiles (its own types), and of our plugins' parameters."""
    top = {k: v for k, v in config.items() if k not in ("apiVersion", "kind")}
    problems = unknown_fields(top, "EndpointPickerConfig", ROUTER_STRUCTS)
    for p in config["plugins"]:
        if p["type"] in PLUGIN_PARAMETERS and "parameters" in p:
            problems += unknown_fields(
                p["parameters"], PLUGIN_PARAMETERS[p["type"]], ROUTER_STRUCTS
            )
    return problems


@pytest.mark.parametrize("names", NAME_MODES)
def test_the_picker_config_validates_against_the_routers_own_types(names: str) -> None:
    """The router decodes its configuration strictly (a misspelt key is a start-up
    failure): every key we render is a field of its vendored types."""
    config = picker_config(settings_for(names))
    assert config["kind"] == "EndpointPickerConfig"
    assert config_problems(config) == []
    for profile in config["schedulingProfiles"]:
        # Every profile refers to a declared plugin (the router refuses a dangling ref).
        declared = {p.get("name", p["type"]) for p in config["plugins"]}
        assert {r["pluginRef"] for r in profile["plugins"]} <= declared


@pytest.mark.parametrize(
    "mutate",
    [
        lambda c: c.update(schedulingProfile=[]),  # singular: not a field
        lambda c: c["plugins"][0].update(params={}),
        lambda c: c["schedulingProfiles"][0]["plugins"][0].update(ref="x"),
        lambda c: c["plugins"][3].update(parameters={"url": "/metrics"}),
        lambda c: c["plugins"][4].update(parameters={"engineConfigs": [{"queueSpec": "x"}]}),
        lambda c: c.update(dataLayer={"crossReplica": {}}),  # v1's layout, not v0.10.0's
    ],
)
def test_validation_against_the_routers_types_refuses_a_wrong_key(mutate: Any) -> None:
    config = picker_config(settings_for("mtt"))
    assert [p["type"] for p in config["plugins"]][3:] == [
        "metrics-data-source",
        "core-metrics-extractor",
    ]
    mutate(config)
    assert config_problems(config) != []


def test_the_config_sets_nothing_the_v1_api_moves() -> None:
    """The router's main branch reads `llm-d.ai/v1` and converts v1alpha1 to it, moving
    only dataLayer's cross-replica and bare discovery keys (and the deprecated top-level
    saturationDetector and parser): none of them is ours, so the move to v1 is its
    apiVersion alone."""
    moved = {"saturationDetector", "parser", "dataLayer"}
    for names in NAME_MODES:
        assert not moved & set(picker_config(settings_for(names)))


# --- InferenceObjectives -----------------------------------------------------------------


def test_each_objective_is_an_inference_objective_on_our_pool() -> None:
    objs = committed()
    assert EXAMPLE.gateway_objectives == {"interactive": 10, "batch": -10}
    for name, priority in EXAMPLE.gateway_objectives.items():
        obj = objs[f"objective-{name}.yaml"]
        assert obj["metadata"]["name"] == name
        assert obj["spec"]["priority"] == priority
        assert obj["spec"]["poolRef"]["name"] == objs["inferencepool.yaml"]["metadata"]["name"]
    none = settings_for("mtt", gateway_objectives={})
    assert not any(n.startswith("objective-") for n in gateway.render_gateway(none))


@settings(max_examples=150, deadline=None)
@given(
    st.dictionaries(
        st.text(alphabet="abz09-_.A ", max_size=70),
        st.one_of(st.integers(-(2**33), 2**33), st.text(max_size=3), st.booleans(), st.floats()),
        max_size=4,
    )
)
def test_objectives_are_rendered_valid_or_refused_with_a_message(objectives: Any) -> None:
    try:
        s = load_deploy_settings(k8s.EXAMPLE_VALUES_FILE, {"gateway_objectives": objectives})
    except DeploySettingsError as exc:
        assert "gateway_objectives" in str(exc)
        return
    for name, priority in s.gateway_objectives.items():
        obj = gateway.render_gateway(s)[f"objective-{name}.yaml"]
        validate(obj)
        assert obj["spec"]["priority"] == priority and type(priority) is int


def test_the_pods_order_their_queue_by_the_same_objectives() -> None:
    """One map: the router's InferenceObjectives and the pods' own queue priorities."""
    (server,) = k8s.deployment(EXAMPLE)["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in server["env"]}
    assert json.loads(env["MTT_OBJECTIVE_PRIORITIES"]) == EXAMPLE.gateway_objectives
    assert EXAMPLE.serving_settings.objective_priorities == EXAMPLE.gateway_objectives
    none = settings_for("trtllm", gateway_objectives={})
    assert none.serving_settings.objective_priorities == {}
    with pytest.raises(DeploySettingsError, match="gateway setting|deploy setting"):
        load_deploy_settings(
            k8s.EXAMPLE_VALUES_FILE, {"serving": {"objective_priorities": '{"a": 1}'}}
        )


def test_the_picker_outlasts_its_own_drain_and_every_pods() -> None:
    """The router's chart: the picker's grace mirrors the longest grace of the pool's pods;
    its own drain window (--drain-timeout, the release's default, not overridden) fits in."""
    source = (ROUTER_DATA / gateway.ROUTER_VERSION / "epp_server_options.go").read_text()
    found = re.search(r"DefaultDrainTimeout\s*=\s*(\d+) \* time\.Second", source)
    assert found is not None
    router_drain = int(found.group(1))
    epp = committed()["epp-deployment.yaml"]["spec"]["template"]["spec"]
    pods = yaml.safe_load((K8S_DIR / "deployment.yaml").read_text())["spec"]["template"]["spec"]
    assert epp["terminationGracePeriodSeconds"] == pods["terminationGracePeriodSeconds"]
    assert epp["terminationGracePeriodSeconds"] >= router_drain + EXAMPLE.shutdown_margin_seconds
    assert "--drain-timeout" not in epp_flags(EXAMPLE)
