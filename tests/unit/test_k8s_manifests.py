"""k8s/: what `kubectl apply -f k8s/` creates, read back from the rendered objects.

Every manifest passes kubernetes-validate --strict; probes hit routes the installed Truss
server really serves; GPU, node selector and resources follow DeploySettings; no secret
value is in the repo; the pod drains before SIGKILL; it runs as non-root; the HPA scales
on the service's queue gauges; and k8s/ in the repo is exactly what the settings render.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from mistral_build import manifests
from mistral_build.cli import main as build_main
from mistral_build.deploy_settings import (
    GKE_ACCELERATORS,
    DeploySettings,
    DeploySettingsError,
    load_deploy_settings,
)
from mistral_build.image import truss_config, truss_server_dir
from mistral_build.paths import K8S_DIR
from mistral_serving.settings import Settings

# Oldest GKE minor we expect to deploy on, and the newest schema kubernetes-validate has.
K8S_VERSIONS = ["1.31", kubernetes_validate.latest_version()]


def rendered(settings: DeploySettings | None = None) -> dict[str, dict[str, Any]]:
    return manifests.render_manifests(settings or DeploySettings())


def container(objs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    (c,) = objs["deployment.yaml"]["spec"]["template"]["spec"]["containers"]
    return c


def pod_spec(objs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return objs["deployment.yaml"]["spec"]["template"]["spec"]


def env_of(c: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in c["env"]}


def truss_routes() -> dict[str, str]:
    """Route template -> handler, from the installed truss server's source."""
    src = (truss_server_dir() / "truss_server.py").read_text()
    routes = dict(re.findall(r'FastAPIRoute\(\s*r?"([^"]+)",\s*([^,\s)]+)', src))
    for mount in re.findall(r'app\.mount\(\s*"([^"]+)"', src):
        routes[mount.rstrip("/") + "/{path:path}"] = "mount"
    assert routes, "no routes parsed from truss_server.py"
    return routes


def handler_for(path: str) -> str | None:
    for template, handler in truss_routes().items():
        pattern = re.sub(r"\{[^}:]+:path\}", ".*", template)
        pattern = re.sub(r"\{[^}]+\}", "[^/]+", pattern)
        if re.fullmatch(pattern, path):
            return handler
    return None


# --- validity ---------------------------------------------------------------------------


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("name", sorted(set(rendered()) - {manifests.PODMONITORING_FILE}))
def test_every_manifest_is_valid_kubernetes_strict(name: str, version: str) -> None:
    obj = yaml.safe_load((K8S_DIR / name).read_text())
    kubernetes_validate.validate(obj, version, strict=True)


def test_strict_validation_rejects_an_unknown_field() -> None:
    obj = rendered()["deployment.yaml"]
    obj["spec"]["template"]["spec"]["containers"][0]["startupprobe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(obj, K8S_VERSIONS[-1], strict=True)


@pytest.mark.parametrize("gpu_type", sorted(GKE_ACCELERATORS))
def test_other_settings_render_valid_manifests(gpu_type: str, tmp_path: Path) -> None:
    s = DeploySettings(
        gpu_type=gpu_type,
        gpu_count=2,
        replicas=2,
        max_replicas=6,
        namespace="llm",
        cache_pvc="engine-cache",
        metrics_adapter="prometheus-adapter",
    )
    for name, obj in rendered(s).items():
        kubernetes_validate.validate(obj, K8S_VERSIONS[-1], strict=True)
        assert obj["metadata"]["namespace"] == "llm", name


def test_podmonitoring_selects_the_pods_and_scrapes_metrics() -> None:
    objs = rendered()
    pm = yaml.safe_load((K8S_DIR / manifests.PODMONITORING_FILE).read_text())
    assert pm["apiVersion"] == "monitoring.googleapis.com/v1"
    assert pm["kind"] == "PodMonitoring"
    pod_labels = objs["deployment.yaml"]["spec"]["template"]["metadata"]["labels"]
    assert pm["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    (endpoint,) = pm["spec"]["endpoints"]
    assert endpoint["port"] == container(objs)["ports"][0]["name"]
    assert handler_for(endpoint["path"]) == "mount"


# --- no drift ----------------------------------------------------------------------------


def test_k8s_folder_equals_what_build_py_manifests_renders(tmp_path: Path) -> None:
    assert manifests.drift(DeploySettings(), K8S_DIR) == []
    assert build_main(["manifests", "--out", str(tmp_path)]) == 0
    ours = {p.relative_to(tmp_path): p.read_text() for p in tmp_path.rglob("*") if p.is_file()}
    repo = {p.relative_to(K8S_DIR): p.read_text() for p in K8S_DIR.rglob("*") if p.is_file()}
    assert ours == repo


def test_drift_is_detected(tmp_path: Path) -> None:
    manifests.write_manifests(DeploySettings(), tmp_path)
    (tmp_path / "service.yaml").write_text((tmp_path / "service.yaml").read_text() + "# edit\n")
    (tmp_path / "extra.yaml").write_text("kind: ConfigMap\n")
    problems = manifests.drift(DeploySettings(), tmp_path)
    assert len(problems) == 2
    assert build_main(["manifests", "--out", str(tmp_path), "--check"]) == 1
    assert build_main(["manifests", "--out", str(tmp_path)]) == 0
    assert not (tmp_path / "extra.yaml").exists()
    assert build_main(["manifests", "--out", str(tmp_path), "--check"]) == 0


# --- the pod waits for its engine, serves only when ready --------------------------------


def test_probes_point_at_the_truss_servers_routes() -> None:
    c = container(rendered())
    assert handler_for(c["startupProbe"]["httpGet"]["path"]) == "self._endpoints.model_ready"
    assert handler_for(c["readinessProbe"]["httpGet"]["path"]) == "self._endpoints.model_ready"
    assert c["livenessProbe"]["httpGet"]["path"] == "/"
    assert handler_for(c["livenessProbe"]["httpGet"]["path"]) == "lambda:"  # `lambda: True`
    assert handler_for("/v1/models/model/nonexistent") is None
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"]["port"] == c["ports"][0]["name"] == "http"
        assert c[probe]["timeoutSeconds"] < c[probe]["periodSeconds"]


def test_startup_probe_allows_the_whole_engine_download_and_load() -> None:
    for timeout in (1800, 2400):
        c = container(rendered(DeploySettings(startup_timeout_seconds=timeout)))
        p = c["startupProbe"]
        assert p["periodSeconds"] * p["failureThreshold"] >= timeout
    # The default budget: 30 minutes.
    p = container(rendered())["startupProbe"]
    assert p["periodSeconds"] * p["failureThreshold"] >= 30 * 60
    # Readiness reacts within seconds; liveness tolerates a busy minute.
    c = container(rendered())
    r, live = c["readinessProbe"], c["livenessProbe"]
    assert r["periodSeconds"] * r["failureThreshold"] <= 30
    assert live["periodSeconds"] * live["failureThreshold"] >= 60


def test_rollout_waits_for_the_new_pod_and_its_deadline_covers_startup() -> None:
    spec = rendered()["deployment.yaml"]["spec"]
    assert spec["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    assert spec["progressDeadlineSeconds"] > DeploySettings().startup_timeout_seconds


# --- the pod drains on shutdown ----------------------------------------------------------


@pytest.mark.parametrize("drain", [0, 30, 60, 90.5, 600])
def test_grace_period_fits_pre_stop_plus_drain_plus_margin(drain: float) -> None:
    s = DeploySettings(drain_grace_seconds=drain)
    objs = rendered(s)
    c = container(objs)
    grace = pod_spec(objs)["terminationGracePeriodSeconds"]
    sleep = int(c["lifecycle"]["preStop"]["exec"]["command"][-1])
    assert c["lifecycle"]["preStop"]["exec"]["command"][0] == "sleep"
    served_drain = float(env_of(c)["MTT_DRAIN_GRACE_SECONDS"]["value"])
    assert served_drain == drain
    assert grace >= sleep + math.ceil(served_drain) + 10


def test_drain_setting_reaches_the_server_under_its_settings_name() -> None:
    env = env_of(container(rendered()))
    settings = Settings.load({}, env={k: v["value"] for k, v in env.items() if "value" in v})
    assert settings.drain_grace_seconds == DeploySettings().drain_grace_seconds
    assert settings.cache_dir == DeploySettings().cache_dir


# --- GPU, placement, resources -----------------------------------------------------------


@pytest.mark.parametrize("gpu_type,label", sorted(GKE_ACCELERATORS.items()))
@pytest.mark.parametrize("count", [1, 2, 4])
def test_gpu_limit_and_node_selector_follow_settings(gpu_type: str, label: str, count: int) -> None:
    objs = rendered(DeploySettings(gpu_type=gpu_type, gpu_count=count))
    res = container(objs)["resources"]
    assert res["limits"]["nvidia.com/gpu"] == str(count)
    assert res["requests"]["nvidia.com/gpu"] == str(count)
    spec = pod_spec(objs)
    assert spec["nodeSelector"] == {"cloud.google.com/gke-accelerator": label}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec[
        "tolerations"
    ]


def test_default_is_one_a100() -> None:
    objs = yaml.safe_load((K8S_DIR / "deployment.yaml").read_text())
    spec = objs["spec"]["template"]["spec"]
    assert spec["nodeSelector"]["cloud.google.com/gke-accelerator"] == "nvidia-tesla-a100"
    assert spec["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"


def test_cpu_memory_and_ephemeral_storage_are_requested() -> None:
    res = container(rendered())["resources"]
    for key in ("cpu", "memory", "ephemeral-storage"):
        assert res["requests"][key]
    assert res["limits"]["memory"] and res["limits"]["ephemeral-storage"]


def test_shm_is_memory_and_engine_cache_is_mounted_at_cache_dir() -> None:
    objs = rendered()
    c = container(objs)
    volumes = {v["name"]: v for v in pod_spec(objs)["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    assert volumes[mounts["/dev/shm"]]["emptyDir"]["medium"] == "Memory"
    assert mounts[DeploySettings().cache_dir] == "engine-cache"
    assert DeploySettings().cache_dir == "/app/model_cache"
    assert "emptyDir" in volumes["engine-cache"]
    assert "/tmp" in mounts
    pvc = rendered(DeploySettings(cache_pvc="shared-engines"))
    vol = {v["name"]: v for v in pod_spec(pvc)["volumes"]}["engine-cache"]
    assert vol == {"name": "engine-cache", "persistentVolumeClaim": {"claimName": "shared-engines"}}


def test_config_yaml_resources_agree_with_deploy_settings() -> None:
    res = truss_config()["resources"]
    s = DeploySettings()
    assert res["accelerator"] == s.truss_accelerator
    assert str(res["cpu"]) == s.cpu_request
    assert res["memory"] == s.memory_request
    assert truss_config()["model_metadata"]["cache_dir"] == s.cache_dir


# --- secrets -----------------------------------------------------------------------------


def test_hf_token_comes_from_a_required_secret_reference() -> None:
    objs = rendered()
    env = env_of(container(objs))
    token = env["TRUSS_SECRET_hf_access_token"]
    assert "value" not in token
    ref = token["valueFrom"]["secretKeyRef"]
    assert ref["optional"] is False
    secret = objs[manifests.SECRET_TEMPLATE_FILE]
    assert ref["name"] == secret["metadata"]["name"]
    assert ref["key"] in secret["stringData"]
    assert "hf_access_token" in truss_config()["secrets"]


def test_no_secret_values_in_k8s_folder() -> None:
    texts = {p.name: p.read_text() for p in K8S_DIR.rglob("*") if p.is_file()}
    for name, text in texts.items():
        assert not re.search(r"hf_[A-Za-z0-9]{20,}", text), name
        for obj in yaml.safe_load_all(text):
            if obj and obj.get("kind") == "Secret":
                assert name.endswith(".example"), "a Secret in an applied file"
                assert set(obj.get("stringData", {}).values()) == {"REPLACE_WITH_YOUR_HF_TOKEN"}
                assert "data" not in obj


def test_kubectl_apply_on_the_folder_never_applies_the_secret_template() -> None:
    # `kubectl apply -f DIR` reads DIR's *.json, *.yaml, *.yml files, not subfolders.
    applied = [p for p in K8S_DIR.iterdir() if p.suffix in (".json", ".yaml", ".yml")]
    kinds = sorted(yaml.safe_load(p.read_text())["kind"] for p in applied)
    assert kinds == ["Deployment", "HorizontalPodAutoscaler", "PodDisruptionBudget", "Service"]


# --- non-root ----------------------------------------------------------------------------


def test_runs_as_the_images_non_root_user() -> None:
    objs = rendered()
    pod_sc = pod_spec(objs)["securityContext"]
    c_sc = container(objs)["securityContext"]
    assert pod_sc["runAsNonRoot"] is True and c_sc["runAsNonRoot"] is True
    assert pod_sc["runAsUser"] == c_sc["runAsUser"] == manifests.NON_ROOT_UID != 0
    assert pod_sc["fsGroup"] == manifests.NON_ROOT_UID
    assert c_sc["allowPrivilegeEscalation"] is False
    assert c_sc["capabilities"]["drop"] == ["ALL"]
    assert pod_sc["seccompProfile"]["type"] == "RuntimeDefault"
    assert pod_spec(objs)["automountServiceAccountToken"] is False


# --- traffic, metrics and scaling ----------------------------------------------------------


def test_service_is_cluster_ip_on_8080_and_selects_the_pods() -> None:
    objs = rendered()
    svc = objs["service.yaml"]["spec"]
    assert svc["type"] == "ClusterIP"
    assert svc["ports"] == [{"name": "http", "port": 8080, "targetPort": "http", "protocol": "TCP"}]
    pod_labels = objs["deployment.yaml"]["spec"]["template"]["metadata"]["labels"]
    assert svc["selector"].items() <= pod_labels.items()
    assert objs["deployment.yaml"]["spec"]["selector"]["matchLabels"] == pod_labels
    assert container(objs)["ports"][0]["containerPort"] == 8080
    assert env_of(container(objs))["INFERENCE_SERVER_PORT"]["value"] == "8080"


def test_prometheus_scrape_annotations_point_at_the_metrics_route() -> None:
    objs = rendered()
    ann = objs["deployment.yaml"]["spec"]["template"]["metadata"]["annotations"]
    assert ann["prometheus.io/scrape"] == "true"
    assert ann["prometheus.io/port"] == str(container(objs)["ports"][0]["containerPort"])
    assert handler_for(ann["prometheus.io/path"]) == "mount"


def test_pdb_selects_the_pods_and_allows_one_disruption() -> None:
    objs = rendered()
    pdb = objs["poddisruptionbudget.yaml"]["spec"]
    pod_labels = objs["deployment.yaml"]["spec"]["template"]["metadata"]["labels"]
    assert pdb["selector"]["matchLabels"].items() <= pod_labels.items()
    assert pdb["maxUnavailable"] == 1


@pytest.mark.parametrize(
    "adapter,waiting",
    [
        ("gke-managed-prometheus", "prometheus.googleapis.com|mtt:num_requests_waiting|gauge"),
        ("prometheus-adapter", "mtt:num_requests_waiting"),
    ],
)
def test_hpa_scales_the_deployment_on_queue_and_in_flight_gauges(
    adapter: str, waiting: str
) -> None:
    s = DeploySettings(metrics_adapter=adapter, replicas=2, max_replicas=5)
    objs = rendered(s)
    hpa = objs["hpa.yaml"]["spec"]
    assert hpa["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": objs["deployment.yaml"]["metadata"]["name"],
    }
    assert (hpa["minReplicas"], hpa["maxReplicas"]) == (2, 5)
    names = [m["pods"]["metric"]["name"] for m in hpa["metrics"]]
    assert all(m["type"] == "Pods" for m in hpa["metrics"])
    assert names[0] == waiting
    assert "mtt:num_requests_running" in names[1]
    assert (manifests.PODMONITORING_FILE in objs) == (adapter == "gke-managed-prometheus")
    assert hpa["behavior"]["scaleDown"]["stabilizationWindowSeconds"] >= 300


# --- settings: defaults in code, a values file and flags override ------------------------


def test_values_file_and_flags_override_defaults(tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(
        "gpu_type: h100\ngpu_count: 2\nimage_tag: v7\nreplicas: 2\n"
        "serving:\n  max_inflight: 128\n  log_prompts: false\n"
    )
    out = tmp_path / "k8s"
    rc = build_main(
        [
            "manifests",
            "--values",
            str(values),
            "--gpu-count",
            "4",
            "--out",
            str(out),
            "--set",
            "max_waiting=64",
            "--revision",
            "abc123",
        ]
    )
    assert rc == 0
    dep = yaml.safe_load((out / "deployment.yaml").read_text())
    c = dep["spec"]["template"]["spec"]["containers"][0]
    assert c["image"].endswith(":v7")
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "4"
    assert dep["spec"]["template"]["spec"]["nodeSelector"] == {
        "cloud.google.com/gke-accelerator": "nvidia-h100-80gb"
    }
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["MTT_MAX_INFLIGHT"] == "128"
    assert env["MTT_MAX_WAITING"] == "64"
    assert env["MTT_LOG_PROMPTS"] == "false"
    assert env["MTT_ARTIFACT_REVISION"] == "abc123"


@pytest.mark.parametrize(
    "values",
    [
        {"gpu_type": "v100"},
        {"gpu_count": 0},
        {"replicas": 3, "max_replicas": 2},
        {"serving": {"not_a_setting": "1"}},
        {"serving": {"max_inflight": "zero"}},
        {"serving": {"artifact": "x"}},
        {"name": "Bad_Name"},
        {"unknown_field": 1},
    ],
)
def test_invalid_settings_are_refused_with_a_message(values: dict[str, Any]) -> None:
    with pytest.raises(DeploySettingsError, match="invalid deploy settings"):
        load_deploy_settings(None, values)


def test_cli_reports_bad_settings_without_a_traceback(tmp_path: Path, capsys) -> None:
    assert build_main(["manifests", "--gpu-count", "9", "--out", str(tmp_path)]) == 2
    assert "gpu_count" in capsys.readouterr().err


def test_hpa_metrics_are_gauges_the_service_exports() -> None:
    from prometheus_client import CollectorRegistry

    from mistral_serving.metrics import Metrics

    registry = CollectorRegistry()
    Metrics(registry)
    gauges = {m.name for m in registry.collect() if m.type == "gauge"}
    assert {manifests.METRIC_WAITING, manifests.METRIC_RUNNING} <= gauges
