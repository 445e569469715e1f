"""artifact_source: one values entry picks where the pods read the artifact (the Hub, a
GCS FUSE bucket, a ReadOnlyMany volume). Every rendered variant is strict-valid (core
objects with kubernetes-validate --strict on the oldest and newest schema, the
VolumeSnapshot objects against external-snapshotter's CRDs); the bucket volume uses only
the CSI driver's own attribute keys, read-only, with the webhook's annotation and a
Workload Identity service account; the volume is a read-only ReadOnlyMany claim that
k8s/weights/ fills once; a mounted pod gets no Hub token and never asks the Hub; each
missing piece is refused in one line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from mistral_build import k8s, k8s_weights
from mistral_build.cli import main as build_main
from mistral_build.deploy_settings import (
    ARTIFACT_MOUNT_PATH,
    DeploySettings,
    DeploySettingsError,
    load_deploy_settings,
)
from mistral_build.paths import K8S_DIR
from mistral_serving.settings import Settings
from tests.unit.test_gateway import crd_schemas
from tests.unit.test_gateway import validate as validate_against_crds

GCSFUSE_VALUES = K8S_DIR / "values-gcsfuse.yaml.example"
VOLUME_VALUES = K8S_DIR / "values-volume.yaml.example"
K8S_VERSIONS = ["1.31", kubernetes_validate.latest_version()]
PIN = "ab" * 32

# The GCS FUSE CSI driver's volume attributes (pkg/csi_driver/utils.go, VolumeContextKey*)
# and the webhook's metadata-prefetch switch: any other key is ignored or refused there.
DRIVER_ATTRIBUTES = {
    "bucketName",
    "mountOptions",
    "fileCacheCapacity",
    "fileCacheForRangeRead",
    "metadataStatCacheCapacity",
    "metadataTypeCacheCapacity",
    "metadataCacheTTLSeconds",
    "gcsfuseLoggingSeverity",
    "skipCSIBucketAccessCheck",
    "enableMetrics",
    "gcsfuseMetadataPrefetchOnMount",
}


def variants() -> dict[str, DeploySettings]:
    return {
        "hub": load_deploy_settings(k8s.EXAMPLE_VALUES_FILE),
        "gcsfuse": load_deploy_settings(GCSFUSE_VALUES),
        "volume": load_deploy_settings(VOLUME_VALUES),
        "volume-pinned": load_deploy_settings(
            VOLUME_VALUES, {"artifact_manifest_sha256": PIN, "namespace": "llm"}
        ),
        "gcsfuse-no-gsa": load_deploy_settings(
            GCSFUSE_VALUES,
            {"gcsfuse": {"bucket": "b-1", "path": "a/b", "file_cache_medium": "memory"}},
        ),
    }


def pod(objs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return objs["deployment.yaml"]["spec"]["template"]["spec"]


def env(objs: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in pod(objs)["containers"][0]["env"]}


def volumes(objs: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in pod(objs)["volumes"]}


def mounts(objs: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {m["name"]: m for m in pod(objs)["containers"][0]["volumeMounts"]}


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("variant", sorted(variants()))
def test_every_rendered_variant_is_strict_valid(variant: str, version: str) -> None:
    for name, obj in k8s.render_manifests(variants()[variant]).items():
        if name.startswith("gateway/") or name == k8s.PODMONITORING_FILE:
            continue  # their CRDs: test_gateway.py; PodMonitoring: test_k8s.py
        if (obj["apiVersion"], obj["kind"]) in crd_schemas():
            validate_against_crds(obj)
        else:
            kubernetes_validate.validate(obj, version, strict=True)


def test_the_snapshot_objects_are_checked_against_their_crds() -> None:
    objs = k8s.render_manifests(variants()["volume"])
    for name in ("weights/snapshot.yaml", "weights/snapshotclass.yaml"):
        assert (objs[name]["apiVersion"], objs[name]["kind"]) in crd_schemas()
    broken = {**objs["weights/snapshot.yaml"], "spec": {"source": {"pvcName": "x"}}}
    with pytest.raises(Exception, match="pvcName|required"):
        validate_against_crds(broken)


def test_the_hub_source_is_unchanged_and_reads_the_hub() -> None:
    objs = k8s.render_manifests(variants()["hub"])
    e = env(objs)
    assert e["MTT_ARTIFACT"]["value"] == variants()["hub"].artifact
    assert "MTT_ARTIFACT_REVISION" in e and "TRUSS_SECRET_hf_access_token" in e
    assert "artifact" not in volumes(objs) and "serviceAccountName" not in pod(objs)
    assert not any(n.startswith("weights/") for n in objs) and "serviceaccount.yaml" not in objs


@pytest.mark.parametrize("variant", ["gcsfuse", "volume", "volume-pinned"])
def test_a_mounted_artifact_is_read_only_at_the_served_path_with_no_hub(variant: str) -> None:
    s = variants()[variant]
    objs = k8s.render_manifests(s)
    e = env(objs)
    assert e["MTT_ARTIFACT"]["value"] == ARTIFACT_MOUNT_PATH
    assert e["HF_HUB_OFFLINE"]["value"] == "1"
    assert "MTT_ARTIFACT_REVISION" not in e and "TRUSS_SECRET_hf_access_token" not in e
    mount = mounts(objs)["artifact"]
    assert mount["mountPath"] == ARTIFACT_MOUNT_PATH and mount["readOnly"] is True
    # The verified marker goes to the writable cache, which is not under the mount.
    cache = mounts(objs)["engine-cache"]["mountPath"]
    assert not cache.startswith(ARTIFACT_MOUNT_PATH + "/")
    # What the pod's server makes of its env: the mount, pinned when a pin is given.
    served = Settings.load({}, env={k: v["value"] for k, v in e.items() if "value" in v})
    assert served.artifact == ARTIFACT_MOUNT_PATH
    assert served.artifact_manifest_sha256 == s.artifact_manifest_sha256
    # The verify Job reads no artifact: no bucket volume without the sidecar's annotation.
    job_pod = objs[k8s.VERIFY_JOB_FILE]["spec"]["template"]["spec"]
    assert "artifact" not in {v["name"] for v in job_pod["volumes"]}
    # Nor the pin: its server serves the tiny engines it builds, which the pin would refuse.
    (job,) = job_pod["containers"]
    assert "MTT_ARTIFACT_MANIFEST_SHA256" not in {x["name"] for x in job["env"]}
    if s.artifact_manifest_sha256:
        assert e["MTT_ARTIFACT_MANIFEST_SHA256"]["value"] == s.artifact_manifest_sha256


def test_the_bucket_is_a_read_only_gcs_fuse_volume_with_the_drivers_keys() -> None:
    s = variants()["gcsfuse"]
    objs = k8s.render_manifests(s)
    csi = volumes(objs)["artifact"]["csi"]
    assert csi["driver"] == "gcsfuse.csi.storage.gke.io" and csi["readOnly"] is True
    attrs = csi["volumeAttributes"]
    assert set(attrs) <= DRIVER_ATTRIBUTES
    assert all(isinstance(v, str) for v in attrs.values())  # a map of strings
    assert attrs["bucketName"] == s.gcsfuse.bucket  # type: ignore[union-attr]
    options = attrs["mountOptions"].split(",")
    assert f"only-dir={s.gcsfuse.path}" in options  # type: ignore[union-attr]
    assert "file-cache:enable-parallel-downloads:true" in options
    assert not any(" " in o for o in options)  # the driver splits on commas only
    assert attrs["fileCacheCapacity"] == "60Gi" and attrs["fileCacheForRangeRead"] == "true"
    # The file cache volume the webhook uses, bounded like the cache it holds.
    assert volumes(objs)["gke-gcsfuse-cache"]["emptyDir"] == {"sizeLimit": "60Gi"}
    annotations = objs["deployment.yaml"]["spec"]["template"]["metadata"]["annotations"]
    assert annotations["gke-gcsfuse/volumes"] == "true"
    assert annotations["prometheus.io/scrape"] == "true"


def test_workload_identity_maps_the_pods_service_account_to_the_google_one() -> None:
    objs = k8s.render_manifests(variants()["gcsfuse"])
    sa = objs["serviceaccount.yaml"]
    assert pod(objs)["serviceAccountName"] == sa["metadata"]["name"]
    assert sa["metadata"]["annotations"] == {
        "iam.gke.io/gcp-service-account": "mistral-weights@example-project.iam.gserviceaccount.com"
    }
    assert sa["automountServiceAccountToken"] is False
    plain = k8s.render_manifests(variants()["gcsfuse-no-gsa"])["serviceaccount.yaml"]
    assert "annotations" not in plain["metadata"]  # the KSA's own principal gets the grant
    cache = volumes(k8s.render_manifests(variants()["gcsfuse-no-gsa"]))["gke-gcsfuse-cache"]
    assert cache["emptyDir"]["medium"] == "Memory"


def test_the_volume_is_a_read_only_claim_that_k8s_weights_fills_once() -> None:
    s = variants()["volume"]
    objs = k8s.render_manifests(s)
    claim = volumes(objs)["artifact"]["persistentVolumeClaim"]
    assert claim == {"claimName": s.volume_claim, "readOnly": True}
    assert mounts(objs)["artifact"]["subPath"] == s.artifact_revision
    weights = {n.removeprefix("weights/"): o for n, o in objs.items() if n.startswith("weights/")}
    assert list(weights) == list(k8s_weights.WEIGHTS_FILES)
    served = weights["pvc.yaml"]
    assert served["metadata"]["name"] == s.volume_claim
    assert served["spec"]["accessModes"] == ["ReadOnlyMany"]
    assert served["spec"]["dataSource"]["name"] == weights["snapshot.yaml"]["metadata"]["name"]
    src = weights["snapshot.yaml"]["spec"]["source"]["persistentVolumeClaimName"]
    assert src == weights["fill-pvc.yaml"]["metadata"]["name"]
    assert weights["fill-pvc.yaml"]["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert weights["storageclass.yaml"]["parameters"]["type"] == "hyperdisk-ml"
    # The fill: the serving image's module, into the folder the pods mount, from the Hub.
    (fill,) = weights["fill-job.yaml"]["spec"]["template"]["spec"]["containers"]
    assert fill["command"][-1] == "mistral_serving.artifacts.fill"
    assert fill["args"] == ["--into", f"{k8s_weights.FILL_MOUNT}/{s.artifact_revision}"]
    fill_env = {e["name"]: e for e in fill["env"]}
    assert fill_env["MTT_ARTIFACT"]["value"] == s.artifact
    assert fill_env["MTT_ARTIFACT_REVISION"]["value"] == s.artifact_revision
    ref = fill_env["TRUSS_SECRET_hf_access_token"]["valueFrom"]["secretKeyRef"]
    assert ref["name"] == s.hf_token_secret
    job_spec = weights["fill-job.yaml"]["spec"]["template"]["spec"]
    assert job_spec["restartPolicy"] == "OnFailure"  # a retry resumes the download
    # On the serving nodes (they must attach Hyperdisk ML, in the volume's zone), no GPU.
    assert job_spec["nodeSelector"] == pod(objs)["nodeSelector"]
    assert job_spec["tolerations"] == pod(objs)["tolerations"]
    assert "nvidia.com/gpu" not in fill["resources"]["requests"]
    # Cluster-scoped objects carry no namespace, namespaced ones the deployment's.
    pinned = k8s.render_manifests(variants()["volume-pinned"])
    assert "namespace" not in pinned["weights/storageclass.yaml"]["metadata"]
    assert pinned["weights/pvc.yaml"]["metadata"]["namespace"] == "llm"


def test_the_example_values_files_render_through_the_cli(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for values in (GCSFUSE_VALUES, VOLUME_VALUES):
        out = tmp_path / values.name
        assert build_main(["manifests", "--values", str(values), "--out", str(out)]) == 0
        assert (out / "deployment.yaml").is_file()
    said = capsys.readouterr().out
    assert "gs://example-llm-artifacts/" in said and "no Hub" in said
    assert "kubectl logs job/mistral-7b-instruct-trt-fill-weights" in said
    assert "None" not in said  # a mounted artifact has no repo or revision to show


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"artifact_source": "gcsfuse"}, "needs a gcsfuse"),
        ({"gcsfuse": {"bucket": "b-1", "path": "p"}}, "only read with artifact_source: gcsfuse"),
        ({"artifact_source": "hub", "volume": {}}, "only read with artifact_source: volume"),
        ({"artifact_manifest_sha256": "ABC"}, "64-hex sha256"),
        (
            {"artifact_source": "gcsfuse", "gcsfuse": {"bucket": "gs://b", "path": "p"}},
            "gcsfuse.bucket",
        ),
        (
            {"artifact_source": "gcsfuse", "gcsfuse": {"bucket": "bkt", "path": "../etc"}},
            "gcsfuse.path",
        ),
        (
            {
                "artifact_source": "gcsfuse",
                "gcsfuse": {"bucket": "bkt", "path": "p", "service_account": "me@gmail.com"},
            },
            "service_account",
        ),  # fmt: skip
        ({"serving": {"artifact_manifest_sha256": PIN}}, "deploy setting, not under serving"),
    ],
)
def test_bad_source_settings_are_one_line(values: dict[str, Any], message: str) -> None:
    with pytest.raises(DeploySettingsError) as err:
        load_deploy_settings(k8s.EXAMPLE_VALUES_FILE, values)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_bucket_needs_a_pin_and_the_hub_its_commit(tmp_path: Path) -> None:
    values = yaml.safe_load(GCSFUSE_VALUES.read_text())
    del values["artifact_manifest_sha256"]
    path = tmp_path / "v.yaml"
    path.write_text(yaml.safe_dump(values))
    with pytest.raises(DeploySettingsError, match="artifact_manifest_sha256"):
        k8s.render_manifests(load_deploy_settings(path))
    # The bucket source needs no repo: it is pinned by its manifest, not a revision.
    s = load_deploy_settings(GCSFUSE_VALUES)
    assert s.artifact is None and s.missing_for_deploy() == []


_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(10**12), 10**12), st.text(max_size=80),
    st.sampled_from(["b-1", "a/b", "../x", "60Gi", "-1", "memory", "disk", "hyperdisk-ml"]),
)  # fmt: skip
_blocks = st.dictionaries(
    st.sampled_from(
        ["bucket", "path", "service_account", "file_cache_size", "file_cache_medium",
         "parallel_downloads_per_file", "download_chunk_size_mb", "claim", "size",
         "storage_class", "throughput_mib_per_s", "other"]
    ),
    _scalars,
    max_size=6,
)  # fmt: skip


@settings(max_examples=150, deadline=None)
@given(
    source=st.one_of(st.sampled_from(["hub", "gcsfuse", "volume"]), _scalars),
    gcsfuse=st.one_of(st.none(), _blocks, _scalars),
    volume=st.one_of(st.none(), _blocks, _scalars),
    pin=st.one_of(st.none(), st.just(PIN), st.text(max_size=70)),
)
def test_any_source_values_render_or_refuse_in_one_line(
    source: Any, gcsfuse: Any, volume: Any, pin: Any
) -> None:
    values: dict[str, Any] = {"artifact_source": source, "artifact_manifest_sha256": pin}
    values |= {k: v for k, v in (("gcsfuse", gcsfuse), ("volume", volume)) if v is not None}
    try:
        s = load_deploy_settings(k8s.EXAMPLE_VALUES_FILE, values)
        objs = k8s.render_manifests(s)
    except DeploySettingsError as exc:
        assert str(exc) and "\n" not in str(exc)
        return
    for name, obj in objs.items():
        custom = (obj["apiVersion"], obj["kind"]) in crd_schemas()
        if not (custom or name.startswith("gateway/") or name == k8s.PODMONITORING_FILE):
            kubernetes_validate.validate(obj, K8S_VERSIONS[-1], strict=True)
