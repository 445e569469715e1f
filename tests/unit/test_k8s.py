"""k8s/: what `kubectl apply -f k8s/` creates, read back from the rendered objects.

Every manifest passes kubernetes-validate --strict; probes hit routes the installed Truss
server really serves; GPU, node selector and resources follow DeploySettings; no secret
value is in the repo and README, docs and k8s/ name one Secret; the pod drains before
SIGKILL; it runs as non-root; the HPA scales on the service's queue gauges; nothing is
rendered from placeholders; and k8s/ in the repo is exactly what k8s/values.yaml.example
renders.
"""

from __future__ import annotations

import math
import re
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from mistral_build import k8s, k8s_objects
from mistral_build.cli import main as build_main
from mistral_build.deploy_settings import GKE_ACCELERATORS, DeploySettings, load_deploy_settings
from mistral_build.image import truss_server_dir
from mistral_build.paths import K8S_DIR, REPO_ROOT
from mistral_build.truss_config import truss_config
from mistral_serving.settings import Settings

# Oldest GKE minor we expect to deploy on, and the newest schema kubernetes-validate has.
K8S_VERSIONS = ["1.31", kubernetes_validate.latest_version()]
EXAMPLE = load_deploy_settings(k8s.EXAMPLE_VALUES_FILE)
SHA = "89abcdef" * 5


def deployable(**values: Any) -> DeploySettings:
    """Example settings with changes (what a values file gives)."""
    return DeploySettings(**{**EXAMPLE.model_dump(), **values})


def rendered(settings: DeploySettings | None = None) -> dict[str, dict[str, Any]]:
    return k8s.render_manifests(settings or EXAMPLE)


def applied_files() -> list[Path]:
    # `kubectl apply -f DIR` reads DIR's *.json, *.yaml, *.yml files, not subfolders.
    return sorted(p for p in K8S_DIR.iterdir() if p.suffix in (".json", ".yaml", ".yml"))


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
@pytest.mark.parametrize("name", sorted(n for n in rendered() if "/" not in n))
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
    s = deployable(
        gpu_type=gpu_type,
        gpu_count=2,
        replicas=2,
        max_replicas=6,
        namespace="llm",
        cache_pvc="engine-cache",
        metrics_adapter="prometheus-adapter",
    )
    for name, obj in rendered(s).items():
        if "/" not in name:  # core objects; the gateway/ CRs: test_gateway.py
            kubernetes_validate.validate(obj, K8S_VERSIONS[-1], strict=True)
        assert obj["metadata"]["namespace"] == "llm", name


def test_podmonitoring_selects_the_pods_and_scrapes_metrics() -> None:
    objs = rendered()
    pm = yaml.safe_load((K8S_DIR / k8s.PODMONITORING_FILE).read_text())
    assert pm["apiVersion"] == "monitoring.googleapis.com/v1"
    assert pm["kind"] == "PodMonitoring"
    pod_labels = objs["deployment.yaml"]["spec"]["template"]["metadata"]["labels"]
    assert pm["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    (endpoint,) = pm["spec"]["endpoints"]
    assert endpoint["port"] == container(objs)["ports"][0]["name"]
    assert handler_for(endpoint["path"]) == "mount"


# --- no drift ----------------------------------------------------------------------------


def repository_k8s(root: Path = K8S_DIR) -> dict[Path, str]:
    """k8s/ as the repository holds it: the working tree, or, where a rendering of your own
    values went there (the README's deploy steps write into k8s/), the committed files."""
    files = {p.relative_to(root): p.read_text() for p in root.rglob("*") if p.is_file()}
    example = f"values: {k8s.EXAMPLE_VALUES_FILE.relative_to(REPO_ROOT)})"
    if all(example in text for text in files.values() if text.startswith(k8s.HEADER_MARK)):
        return files
    listed = (
        subprocess.run(
            ["git", "ls-files", "-z", "--", str(root)],
            cwd=REPO_ROOT,
            capture_output=True,
            check=True,
        )
        .stdout.decode()
        .split("\0")
    )
    return {
        (REPO_ROOT / name).relative_to(root): subprocess.run(
            ["git", "show", f"HEAD:{name}"], cwd=REPO_ROOT, capture_output=True, check=True
        ).stdout.decode()
        for name in listed
        if name
    }


def test_k8s_folder_equals_what_the_example_values_render(tmp_path: Path) -> None:
    values = k8s.EXAMPLE_VALUES_FILE
    assert build_main(["manifests", "--values", str(values), "--out", str(tmp_path)]) == 0
    ours = {p.relative_to(tmp_path): p.read_text() for p in tmp_path.rglob("*") if p.is_file()}
    repo = {
        path: text
        for path, text in repository_k8s().items()
        # The example values files (this one and the other artifact sources') are inputs.
        if not (path.name.startswith("values") and path.name.endswith(".yaml.example"))
    }
    assert ours == repo, k8s.drift_advice(K8S_DIR)
    for text in repo.values():
        assert "values: k8s/values.yaml.example" in text.splitlines()[1]


def test_a_rendering_of_your_values_in_k8s_leaves_the_check_on_the_repositorys() -> None:
    """The README's deploy steps write your manifests into k8s/: `make test` then checks
    the committed example rendering, not yours."""
    path = K8S_DIR / "service.yaml"
    example = path.read_text()
    assert repository_k8s()[Path("service.yaml")] == example  # the example's: read as it is
    try:
        path.write_text(example.replace("values: k8s/values.yaml.example", "values: my.yaml"))
        assert repository_k8s()[Path("service.yaml")] == example  # yours: the committed one
    finally:
        path.write_text(example)


def test_drift_is_detected_and_hand_written_files_are_kept(tmp_path: Path) -> None:
    s = deployable(gateway=True)
    values = tmp_path / "v.yaml"
    values.write_text(yaml.safe_dump(s.model_dump(mode="json")))
    k8s.write_manifests(s, tmp_path, values)
    (tmp_path / "service.yaml").write_text((tmp_path / "service.yaml").read_text() + "# edit\n")
    (tmp_path / "stale.yaml").write_text(k8s.HEADER_MARK + "\nkind: ConfigMap\n")
    (tmp_path / "mine.yaml").write_text("kind: ConfigMap\n")  # not ours: never touched
    problems = k8s.drift(s, tmp_path, values)
    assert len(problems) == 2
    args = ["manifests", "--values", str(values), "--out", str(tmp_path)]
    assert build_main([*args, "--check"]) == 1
    assert build_main(args) == 0
    assert not (tmp_path / "stale.yaml").exists() and (tmp_path / "mine.yaml").exists()
    assert build_main([*args, "--check"]) == 0
    # Without the gateway, its generated folder goes as a whole.
    assert build_main([*args, "--set", "max_inflight=8"]) == 0
    values.write_text(yaml.safe_dump({**s.model_dump(mode="json"), "gateway": False}))
    assert build_main(args) == 0
    assert not (tmp_path / "gateway").exists()


# --- nothing is rendered from placeholders ---------------------------------------------


def test_defaults_alone_render_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "k8s"
    assert build_main(["manifests", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "image, artifact, artifact_revision" in err and "--values" in err
    assert len(err.strip().splitlines()) == 1
    assert not out.exists()
    # `python build.py` without a command refuses the same way, before rendering anything.
    assert build_main([]) == 2
    assert "--values" in capsys.readouterr().err


@pytest.mark.parametrize(
    "revision", ["main", "v1.0", "refs/pr/1", "0123456", "A" * 40, "0123456789abcdef" * 3]
)
def test_a_revision_must_be_a_commit_sha(revision: str, capsys: pytest.CaptureFixture[str]) -> None:
    values = ["--values", str(k8s.EXAMPLE_VALUES_FILE), "--check"]
    assert build_main(["manifests", *values, "--revision", revision]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "artifact_revision" in err and "40-hex commit sha" in err


@pytest.mark.parametrize(
    "values",
    [
        {"image": "us-central1-docker.pkg.dev/my-gcp-project/llm/mistral-trt-truss"},
        {"artifact": "my-hf-org/mistral-7b-instruct-v0.2-trtllm-a100-tp1"},
        {"image": "REGION-docker.pkg.dev/PROJECT/llm/x"},
    ],
)
def test_documentation_placeholders_are_refused(values: dict[str, str]) -> None:
    with pytest.raises(k8s.DeploySettingsError, match="invalid deploy settings"):
        load_deploy_settings(k8s.EXAMPLE_VALUES_FILE, values)


def test_committed_manifests_name_only_example_values() -> None:
    dep = yaml.safe_load((K8S_DIR / "deployment.yaml").read_text())
    c = dep["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert "example-project" in c["image"]
    assert env["MTT_ARTIFACT"].startswith("example-org/")
    assert re.fullmatch(r"[0-9a-f]{40}", env["MTT_ARTIFACT_REVISION"])


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
        c = container(rendered(deployable(startup_timeout_seconds=timeout)))
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
    assert spec["progressDeadlineSeconds"] > EXAMPLE.startup_timeout_seconds


# --- the pod drains on shutdown ----------------------------------------------------------


def pod_settings(c: dict[str, Any]) -> Settings:
    """What the pod's server loads: config.yaml's model_metadata, then the MTT_* env."""
    env = {e["name"]: e["value"] for e in c["env"] if "value" in e}
    return Settings.load(truss_config()["model_metadata"], env=env)


@pytest.mark.parametrize("drain", [None, 0, 30, 90.5, 600])
def test_grace_period_fits_pre_stop_plus_the_servers_drain_plus_margin(drain: float | None) -> None:
    s = deployable(serving={} if drain is None else {"drain_grace_seconds": drain})
    objs = rendered(s)
    c = container(objs)
    grace = pod_spec(objs)["terminationGracePeriodSeconds"]
    sleep = int(c["lifecycle"]["preStop"]["exec"]["command"][-1])
    assert c["lifecycle"]["preStop"]["exec"]["command"][0] == "sleep"
    served_drain = pod_settings(c).drain_grace_seconds
    assert served_drain == (Settings().drain_grace_seconds if drain is None else drain)
    assert grace >= sleep + math.ceil(served_drain) + 10


@pytest.mark.parametrize("cache_dir", [None, "/models/cache"])
def test_engine_cache_volume_is_mounted_where_the_server_caches(cache_dir: str | None) -> None:
    s = deployable(serving={} if cache_dir is None else {"cache_dir": cache_dir})
    c = container(rendered(s))
    env = {e["name"]: e.get("value") for e in c["env"]}
    home = env["HOME"]
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    served = pod_settings(c).cache_dir
    expected = served.replace("~", home, 1) if served.startswith("~") else served
    assert mounts["engine-cache"] == expected
    assert expected.startswith("/")
    if cache_dir is None:  # the Settings default, not a copy of it
        assert "MTT_CACHE_DIR" not in env and served == Settings().cache_dir


def test_a_relative_cache_dir_is_refused() -> None:
    with pytest.raises(k8s.DeploySettingsError, match="absolute"):
        load_deploy_settings(k8s.EXAMPLE_VALUES_FILE, {"serving": {"cache_dir": "cache"}})


# --- GPU, placement, resources -----------------------------------------------------------


@pytest.mark.parametrize("gpu_type,label", sorted(GKE_ACCELERATORS.items()))
@pytest.mark.parametrize("count", [1, 2, 4])
def test_gpu_limit_and_node_selector_follow_settings(gpu_type: str, label: str, count: int) -> None:
    objs = rendered(deployable(gpu_type=gpu_type, gpu_count=count))
    res = container(objs)["resources"]
    assert res["limits"]["nvidia.com/gpu"] == str(count)
    assert res["requests"]["nvidia.com/gpu"] == str(count)
    spec = pod_spec(objs)
    assert spec["nodeSelector"] == {
        "cloud.google.com/gke-accelerator": label,
        k8s.GKE_DRIVER_LABEL: "latest",
    }
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


def test_shm_is_memory_and_engine_cache_is_an_empty_dir_or_a_claim() -> None:
    objs = rendered()
    c = container(objs)
    volumes = {v["name"]: v for v in pod_spec(objs)["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    assert volumes[mounts["/dev/shm"]]["emptyDir"]["medium"] == "Memory"
    assert "emptyDir" in volumes["engine-cache"]
    assert "/tmp" in mounts
    pvc = rendered(deployable(cache_pvc="shared-engines"))
    vol = {v["name"]: v for v in pod_spec(pvc)["volumes"]}["engine-cache"]
    assert vol == {"name": "engine-cache", "persistentVolumeClaim": {"claimName": "shared-engines"}}


# --- secrets -----------------------------------------------------------------------------


def test_hf_token_comes_from_a_required_secret_reference() -> None:
    objs = rendered()
    env = env_of(container(objs))
    token = env["TRUSS_SECRET_hf_access_token"]
    assert "value" not in token
    ref = token["valueFrom"]["secretKeyRef"]
    assert ref["optional"] is False
    secret = objs[k8s.SECRET_TEMPLATE_FILE]
    assert ref["name"] == secret["metadata"]["name"] == EXAMPLE.hf_token_secret
    assert ref["key"] in secret["stringData"]
    assert "hf_access_token" in truss_config()["secrets"]


def test_readme_docs_and_build_py_create_the_secret_the_pod_reads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dep = yaml.safe_load((K8S_DIR / "deployment.yaml").read_text())
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    ref = env_of(c)["TRUSS_SECRET_hf_access_token"]["valueFrom"]["secretKeyRef"]
    pattern = re.compile(r"kubectl create secret generic (\S+)\s+(?:\\\s*)?--from-literal=(\w+)=")
    texts = {
        "README.md": (REPO_ROOT / "README.md").read_text(),
        "docs/deploy.md": (REPO_ROOT / "docs" / "deploy.md").read_text(),
        k8s.SECRET_TEMPLATE_FILE: (K8S_DIR / k8s.SECRET_TEMPLATE_FILE).read_text(),
    }
    assert (
        build_main(["manifests", "--values", str(k8s.EXAMPLE_VALUES_FILE), "--out", str(tmp_path)])
        == 0
    )
    texts["build.py manifests output"] = capsys.readouterr().out
    for where, text in texts.items():
        found = pattern.findall(text)
        assert found, f"{where} does not show how to create the Secret"
        assert set(found) == {(ref["name"], ref["key"])}, where


def test_no_secret_values_in_k8s_folder() -> None:
    texts = {p.name: p.read_text() for p in K8S_DIR.rglob("*") if p.is_file()}
    for name, text in texts.items():
        assert not re.search(r"hf_[A-Za-z0-9]{20,}", text), name
        for obj in yaml.safe_load_all(text):
            if obj and obj.get("kind") == "Secret":
                assert name.endswith(".example"), "a Secret in an applied file"
                assert set(obj.get("stringData", {}).values()) == {"REPLACE_WITH_YOUR_HF_TOKEN"}
                assert "data" not in obj


def test_kubectl_apply_on_the_folder_applies_only_the_workload() -> None:
    kinds = sorted(yaml.safe_load(p.read_text())["kind"] for p in applied_files())
    assert kinds == ["Deployment", "HorizontalPodAutoscaler", "PodDisruptionBudget", "Service"]


# --- non-root ----------------------------------------------------------------------------


def test_runs_as_the_images_non_root_user() -> None:
    objs = rendered()
    pod_sc = pod_spec(objs)["securityContext"]
    c_sc = container(objs)["securityContext"]
    assert pod_sc["runAsNonRoot"] is True and c_sc["runAsNonRoot"] is True
    assert pod_sc["runAsUser"] == c_sc["runAsUser"] == k8s.NON_ROOT_UID != 0
    assert pod_sc["fsGroup"] == k8s.NON_ROOT_UID
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
    # The selector is the pods' labels but the engine type (which may change with the names).
    assert objs["deployment.yaml"]["spec"]["selector"]["matchLabels"] == {
        k: v for k, v in pod_labels.items() if not k.endswith("/engine-type")
    }
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
    "adapter,names,waiting",
    [
        (
            "gke-managed-prometheus",
            "mtt",
            "prometheus.googleapis.com|mtt:num_requests_waiting|gauge",
        ),
        ("prometheus-adapter", "mtt", "mtt:num_requests_waiting"),
        ("prometheus-adapter", "vllm", "vllm:num_requests_waiting"),
    ],
)
def test_hpa_scales_the_deployment_on_queue_and_in_flight_gauges(
    adapter: str, names: str, waiting: str
) -> None:
    s = deployable(
        metrics_adapter=adapter, replicas=2, max_replicas=5, serving={"metrics_names": names}
    )
    objs = rendered(s)
    hpa = objs["hpa.yaml"]["spec"]
    assert hpa["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": objs["deployment.yaml"]["metadata"]["name"],
    }
    assert (hpa["minReplicas"], hpa["maxReplicas"]) == (2, 5)
    metric_names = [m["pods"]["metric"]["name"] for m in hpa["metrics"]]
    assert all(m["type"] == "Pods" for m in hpa["metrics"])
    assert metric_names[0] == waiting
    assert f"{names}:num_requests_running" in metric_names[1]
    assert (k8s.PODMONITORING_FILE in objs) == (adapter == "gke-managed-prometheus")
    assert hpa["behavior"]["scaleDown"]["stabilizationWindowSeconds"] >= 300


@pytest.mark.parametrize("names", ["mtt", "vllm", "trtllm"])
def test_the_gauges_the_manifests_name_are_the_ones_the_server_exports(names: str) -> None:
    from prometheus_client import CollectorRegistry

    from mistral_serving.ops.metrics import Metrics, prefix_for

    registry = CollectorRegistry()
    Metrics(registry, prefix=prefix_for(names))
    gauges = {m.name for m in registry.collect() if m.type == "gauge"}
    s = deployable(serving={"metrics_names": names})
    wanted = {
        k8s_objects.metric_name(s, g)
        for g in (k8s_objects.GAUGE_WAITING, k8s_objects.GAUGE_RUNNING, k8s_objects.GAUGE_KV_CACHE)
    }
    assert wanted <= gauges


# --- settings: a values file and flags override the defaults -----------------------------


def test_values_file_and_flags_override_defaults(tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(
        (k8s.EXAMPLE_VALUES_FILE.read_text())
        + "\ngpu_type: h100\ngpu_count: 2\nimage_tag: v7\nreplicas: 2\n"
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
            SHA,
        ]
    )
    assert rc == 0
    dep = yaml.safe_load((out / "deployment.yaml").read_text())
    c = dep["spec"]["template"]["spec"]["containers"][0]
    assert c["image"].endswith(":v7")
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "4"
    assert dep["spec"]["template"]["spec"]["nodeSelector"] == {
        "cloud.google.com/gke-accelerator": "nvidia-h100-80gb",
        k8s.GKE_DRIVER_LABEL: "latest",
    }
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["MTT_MAX_INFLIGHT"] == "128"
    assert env["MTT_MAX_WAITING"] == "64"
    assert env["MTT_LOG_PROMPTS"] == "false"
    assert env["MTT_ARTIFACT_REVISION"] == SHA


@pytest.mark.parametrize(
    "values",
    [
        {"gpu_type": "v100"},
        {"gpu_count": 0},
        {"replicas": 3, "max_replicas": 2},
        {"serving": {"not_a_setting": "1"}},
        {"serving": {"max_inflight": "zero"}},
        {"serving": {"artifact": "x"}},
        {"serving": {"metrics_names": "prom"}},
        {"name": "Bad_Name"},
        {"hf_token_secret": "Bad Name"},
        {"unknown_field": 1},
    ],
)
def test_invalid_settings_are_refused_with_a_message(values: dict[str, Any]) -> None:
    with pytest.raises(k8s.DeploySettingsError, match="invalid deploy settings"):
        load_deploy_settings(None, values)


def test_a_serving_key_typo_names_the_setting_meant() -> None:
    """The same check (and words) as the server's and `build.py serve --set`'s."""
    with pytest.raises(k8s.DeploySettingsError) as err:
        load_deploy_settings(None, {"serving": {"max_inflite": "8"}})
    assert "serving: max_inflite is not a setting (did you mean max_inflight?)" in str(err.value)


@pytest.mark.parametrize(
    "text", ["- a list\n", "image: [unclosed\n", "\udcff", "gpu_count: '2'\nname: 7\n"]
)
def test_a_bad_values_file_is_one_line_without_a_traceback(
    tmp_path: Path, text: str, capsys: pytest.CaptureFixture[str]
) -> None:
    values = tmp_path / "v.yaml"
    values.write_bytes(text.encode("utf-8", "surrogateescape"))
    assert build_main(["manifests", "--values", str(values), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and len(err.splitlines()) == 1


def test_cli_reports_bad_settings_without_a_traceback(tmp_path: Path, capsys) -> None:
    assert build_main(["manifests", "--gpu-count", "9", "--out", str(tmp_path)]) == 2
    assert "gpu_count" in capsys.readouterr().err


# --- the GPU node: driver, multi-GPU env, and the verify Job -------------------------------


def test_pods_select_nodes_with_gkes_latest_driver() -> None:
    for objs in (rendered(), rendered(deployable(gpu_driver_version="default"))):
        selector = pod_spec(objs)["nodeSelector"]
        job_selector = objs[k8s.VERIFY_JOB_FILE]["spec"]["template"]["spec"]["nodeSelector"]
        assert selector == job_selector
    assert pod_spec(rendered())["nodeSelector"][k8s.GKE_DRIVER_LABEL] == "latest"
    assert (
        pod_spec(rendered(deployable(gpu_driver_version="default")))["nodeSelector"][
            k8s.GKE_DRIVER_LABEL
        ]
        == "default"
    )


def test_nccl_cumem_is_off_only_with_more_than_one_gpu() -> None:
    assert "NCCL_CUMEM_ENABLE" not in env_of(container(rendered()))
    two = env_of(container(rendered(deployable(gpu_count=2))))
    assert two["NCCL_CUMEM_ENABLE"]["value"] == "0"


def job_pod(objs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return objs[k8s.VERIFY_JOB_FILE]["spec"]["template"]["spec"]


@pytest.mark.parametrize(
    "values",
    [
        {},
        {"gpu_count": 2, "gpu_type": "h100", "cache_pvc": "engines", "namespace": "llm"},
        {"serving": {"max_inflight": "64", "cache_dir": "/cache/engines"}, "shm_size": "16Gi"},
    ],
)
def test_the_verify_job_runs_in_the_deployments_pod(values: dict[str, Any]) -> None:
    """Same node, user, security contexts, volumes, env and resources: rendered by the same
    functions from the same settings, so the check cannot drift from what it checks."""
    s = deployable(**values)
    objs = rendered(s)
    pod, job = pod_spec(objs), job_pod(objs)
    for key in ("nodeSelector", "tolerations", "securityContext", "volumes",
                "automountServiceAccountToken", "enableServiceLinks"):  # fmt: skip
        assert job[key] == pod[key], key
    (server,) = pod["containers"]
    (verify,) = job["containers"]
    for key in ("env", "resources", "securityContext", "volumeMounts"):
        assert verify[key] == server[key], key
    assert verify["image"] == f"{s.image}:{s.image_tag}-verify" == s.verify_image_ref
    assert verify["args"][:2] == ["--kind", "all"]
    # The image's own entry point (tini, then build.py verify-gpu), the nofile limit first.
    assert verify["command"][:4] == ["/usr/bin/tini", "--", "/bin/sh", "-c"]
    assert verify["command"][4].startswith('echo "open files: the container gives ')
    assert verify["command"][4].endswith('exec /usr/bin/python3 build.py verify-gpu "$@"')
    assert job["restartPolicy"] == "Never"
    # Its pods are not the Service's, the PDB's or the HPA's.
    labels = objs[k8s.VERIFY_JOB_FILE]["spec"]["template"]["metadata"]["labels"]
    selector = objs["service.yaml"]["spec"]["selector"]
    assert not selector.items() <= labels.items()
    for version in K8S_VERSIONS:
        kubernetes_validate.validate(objs[k8s.VERIFY_JOB_FILE], version, strict=True)


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_the_committed_verify_job_is_valid_kubernetes_strict(version: str) -> None:
    obj = yaml.safe_load((K8S_DIR / k8s.VERIFY_JOB_FILE).read_text())
    kubernetes_validate.validate(obj, version, strict=True)
    assert obj["spec"]["backoffLimit"] == 0 and obj["spec"]["ttlSecondsAfterFinished"] > 0


def test_the_verify_job_writes_where_its_user_can() -> None:
    (verify,) = job_pod(rendered())["containers"]
    out = verify["args"][verify["args"].index("--out") + 1]
    mounts = [m["mountPath"] for m in verify["volumeMounts"]]
    assert any(out.startswith(m.rstrip("/") + "/") for m in mounts), (out, mounts)


def test_the_verify_jobs_shell_says_the_limit_and_passes_its_args() -> None:
    import subprocess

    (verify,) = job_pod(rendered())["containers"]
    script = verify["command"][4].replace("/usr/bin/python3", "echo")  # no image here
    out = subprocess.run(
        ["/bin/sh", "-c", script, verify["command"][5], *verify["args"]],
        capture_output=True, text=True, check=True, timeout=30,
    ).stdout.splitlines()  # fmt: skip
    assert re.fullmatch(r"open files: the container gives \d+ \(hard (\d+|unlimited)\)", out[0])
    assert re.fullmatch(r"open files \(ulimit -n\): \d+", out[1])
    assert out[2] == "build.py verify-gpu --kind all --out /tmp/verify-gpu"


@pytest.mark.parametrize("engine", ["auto", "tensorrt_llm", "trtllm_pytorch", "pytorch", "replay"])
def test_pmix_gets_a_short_hostname_for_the_tensorrt_llm_kinds(engine: str) -> None:
    """Open MPI 5 fails on a long pod hostname unless PMIX_HOSTNAME names a short one: set
    (a constant: a pod is one node) wherever a TensorRT-LLM engine may run, and in the
    verify Job, which runs them too; nowhere MPI never starts."""
    s = deployable(serving={"engine": engine}, name="a" * 63)
    env = env_of(k8s.server_container(s))
    job_env = {
        e["name"]: e for e in k8s.verify_job(s)["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    if engine in ("pytorch", "replay"):
        assert "PMIX_HOSTNAME" not in env and "PMIX_HOSTNAME" not in job_env
        return
    value = env["PMIX_HOSTNAME"]["value"]
    assert value == job_env["PMIX_HOSTNAME"]["value"] == k8s.PMIX_HOSTNAME
    assert re.fullmatch(r"[a-z][a-z0-9-]{0,15}", value)  # short and plain: no pod name in it
    assert "valueFrom" not in env["PMIX_HOSTNAME"]


def test_the_committed_deployment_sets_pmix_hostname() -> None:
    assert env_of(container(rendered()))["PMIX_HOSTNAME"]["value"] == k8s.PMIX_HOSTNAME


DRAIN_ROW = re.compile(r"^  \| `?(\w+)`? [^|]*\| (\d+) s \|", re.M)


def test_drain_defaults_are_the_fleets_and_the_doc_says_them() -> None:
    """preStop 15 s and drain 45 s as KServe's and llm-d's presets, a 20 s margin: 80 s of
    grace; docs/deploy.md's drain table gives each value as the settings have it."""
    s = DeploySettings()
    served = Settings()
    values = {
        "pre_stop_sleep_seconds": s.pre_stop_sleep_seconds,
        "drain_grace_seconds": served.drain_grace_seconds,
        "drain_listen_seconds": served.drain_listen_seconds,
        "shutdown_margin_seconds": s.shutdown_margin_seconds,
        "terminationGracePeriodSeconds": s.termination_grace_period_seconds,
    }
    assert values == {
        "pre_stop_sleep_seconds": 15,
        "drain_grace_seconds": 45,
        "drain_listen_seconds": 5,
        "shutdown_margin_seconds": 20,
        "terminationGracePeriodSeconds": 80,
    }
    table = dict(DRAIN_ROW.findall((REPO_ROOT / "docs" / "deploy.md").read_text()))
    assert {k: int(v) for k, v in table.items() if k in values} == values
    # The rendered pods, and the endpoint picker, carry the same grace.
    objs = rendered()
    assert pod_spec(objs)["terminationGracePeriodSeconds"] == 80
    assert container(objs)["lifecycle"]["preStop"]["exec"]["command"] == ["sleep", "15"]
