"""Where the pods read the artifact from (`artifact_source`), as Kubernetes objects.

- `hub`: nothing here; each pod downloads artifact@revision into its cache volume.
- `gcsfuse`: the bucket folder is a CSI ephemeral volume of the GCS FUSE CSI driver
  (`gcsfuse.csi.storage.gke.io`), mounted read-only at ARTIFACT_MOUNT_PATH. Its volume
  attributes are the driver's own keys (pkg/csi_driver/utils.go: `bucketName`,
  `mountOptions`, `fileCacheCapacity`, `fileCacheForRangeRead`, `metadataCacheTTLSeconds`,
  `metadataStatCacheCapacity`, `metadataTypeCacheCapacity`; the webhook's
  `gcsfuseMetadataPrefetchOnMount`), set as GKE's serving guidance sets them: a file cache
  the size of the artifact filled by parallel downloads, metadata cached for the pod's life
  (the artifact does not change under a pinned manifest). The pod template carries the
  `gke-gcsfuse/volumes` annotation (the driver's webhook injects its sidecar only then) and
  runs as a Kubernetes service account (`serviceaccount.yaml`) that Workload Identity maps
  to a Google service account (`iam.gke.io/gcp-service-account`) or that is granted read on
  the bucket itself. The file cache is the `gke-gcsfuse-cache` volume, which the webhook
  uses when the pod declares it.
- `volume`: a ReadOnlyMany PersistentVolumeClaim (Hyperdisk ML) mounted read-only at the
  artifact's folder. `k8s/weights/` creates it once: a Hyperdisk ML StorageClass, a
  ReadWriteOnce claim, a Job that fills it (`python3 -m mistral_serving.artifacts.fill` in
  the serving image: the Hub is read once per volume), a VolumeSnapshot of it, and the
  ReadOnlyMany claim restored from that snapshot, which every pod attaches read-only.
"""

from __future__ import annotations

from typing import Any

from mistral_build.deploy_settings import APP_HOME_DIR, ARTIFACT_MOUNT_PATH, DeploySettings
from mistral_build.k8s_objects import NON_ROOT_UID, hf_token_env, labels, meta
from mistral_serving.settings import ENV_PREFIX

GCSFUSE_DRIVER = "gcsfuse.csi.storage.gke.io"
GCSFUSE_CACHE_VOLUME = "gke-gcsfuse-cache"  # the name the driver's webhook looks for
WORKLOAD_IDENTITY_ANNOTATION = "iam.gke.io/gcp-service-account"
ARTIFACT_VOLUME = "artifact"
SERVICE_ACCOUNT_FILE = "serviceaccount.yaml"
WEIGHTS_DIR = "weights"  # k8s/weights/: applied on its own, once, before the Deployment
FILL_MOUNT = "/weights"
PD_CSI_DRIVER = "pd.csi.storage.gke.io"
SNAPSHOT_API = "snapshot.storage.k8s.io/v1"


def service_account_name(s: DeploySettings) -> str:
    return f"{s.name[:55]}-weights"


def gcsfuse_mount_options(s: DeploySettings) -> str:
    """gcsfuse flags (config-file keys, `:`-separated) for reading one folder of weights."""
    g = s.gcsfuse
    assert g is not None
    return ",".join(
        [
            f"only-dir={g.path}",
            "implicit-dirs",
            # The artifact is immutable under its pin: no negative lookups to repeat.
            "metadata-cache:negative-ttl-secs:0",
            # Fill the file cache with parallel ranged downloads: the first read of a
            # multi-GB engine file is what a cold pod waits for.
            "file-cache:enable-parallel-downloads:true",
            f"file-cache:parallel-downloads-per-file:{g.parallel_downloads_per_file}",
            "file-cache:max-parallel-downloads:-1",
            f"file-cache:download-chunk-size-mb:{g.download_chunk_size_mb}",
            # Read-ahead for large sequential reads through the kernel's FUSE client.
            "read_ahead_kb=1024",
        ]
    )


def gcsfuse_volume(s: DeploySettings) -> dict[str, Any]:
    g = s.gcsfuse
    assert g is not None
    return {
        "name": ARTIFACT_VOLUME,
        "csi": {
            "driver": GCSFUSE_DRIVER,
            "readOnly": True,
            "volumeAttributes": {
                "bucketName": g.bucket,
                "mountOptions": gcsfuse_mount_options(s),
                "fileCacheCapacity": g.file_cache_size,
                "fileCacheForRangeRead": "true",
                "metadataCacheTTLSeconds": "-1",
                "metadataStatCacheCapacity": "-1",
                "metadataTypeCacheCapacity": "-1",
                "gcsfuseMetadataPrefetchOnMount": "true",
            },
        },
    }


def gcsfuse_cache_volume(s: DeploySettings) -> dict[str, Any]:
    g = s.gcsfuse
    assert g is not None
    empty_dir: dict[str, Any] = {"sizeLimit": g.file_cache_size}
    if g.file_cache_medium == "memory":
        empty_dir["medium"] = "Memory"
    return {"name": GCSFUSE_CACHE_VOLUME, "emptyDir": empty_dir}


# The sidecar's own limits: "0" lifts them (the driver's annotation convention); the file
# cache is bounded by its volume instead.
GCSFUSE_POD_ANNOTATIONS = {
    "gke-gcsfuse/volumes": "true",
    "gke-gcsfuse/cpu-limit": "0",
    "gke-gcsfuse/memory-limit": "0",
    "gke-gcsfuse/ephemeral-storage-limit": "0",
}


def artifact_volumes(s: DeploySettings) -> list[dict[str, Any]]:
    """The pod's volumes for its artifact source (none for the Hub)."""
    if s.artifact_source == "gcsfuse":
        return [gcsfuse_volume(s), gcsfuse_cache_volume(s)]
    if s.artifact_source == "volume":
        claim = {"claimName": s.volume_claim, "readOnly": True}
        return [{"name": ARTIFACT_VOLUME, "persistentVolumeClaim": claim}]
    return []


def artifact_mounts(s: DeploySettings) -> list[dict[str, Any]]:
    if s.artifact_source == "hub":
        return []
    mount: dict[str, Any] = {
        "name": ARTIFACT_VOLUME,
        "mountPath": ARTIFACT_MOUNT_PATH,
        "readOnly": True,
    }
    if s.artifact_source == "volume" and s.volume_path:
        mount["subPath"] = s.volume_path
    return [mount]


def pod_annotations(s: DeploySettings) -> dict[str, str]:
    return dict(GCSFUSE_POD_ANNOTATIONS) if s.artifact_source == "gcsfuse" else {}


def apply_source(s: DeploySettings, pod: dict[str, Any], annotations: dict[str, str]) -> None:
    """Add the artifact's volume, mount, annotations and service account to the
    Deployment's pod (the verify Job's pod reads no artifact and gets none of it)."""
    pod["volumes"] += artifact_volumes(s)
    for container in pod["containers"]:
        container["volumeMounts"] += artifact_mounts(s)
    annotations.update(pod_annotations(s))
    if s.artifact_source == "gcsfuse":
        pod["serviceAccountName"] = service_account_name(s)


def service_account(s: DeploySettings) -> dict[str, Any]:
    """The identity the GCS FUSE sidecar reads the bucket as (Workload Identity)."""
    g = s.gcsfuse
    assert g is not None
    m = meta(s, service_account_name(s))
    if g.service_account:
        m["annotations"] = {WORKLOAD_IDENTITY_ANNOTATION: g.service_account}
    # The server never calls the Kubernetes API; the CSI driver gets its own token.
    return {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": m,
            "automountServiceAccountToken": False}  # fmt: skip


# ---- k8s/weights/: fill a Hyperdisk ML volume once ---------------------------------------


def fill_claim_name(s: DeploySettings) -> str:
    return f"{s.volume_claim[:50]}-fill"


def snapshot_name(s: DeploySettings) -> str:
    return f"{s.volume_claim[:50]}-snapshot"


def snapshot_class_name(s: DeploySettings) -> str:
    return f"{s.volume_source.storage_class[:50]}-snapshots"


def fill_job_name(s: DeploySettings) -> str:
    return f"{s.name[:50]}-fill-weights"


def cluster_meta(s: DeploySettings, name: str) -> dict[str, Any]:
    """Metadata of a cluster-scoped object: no namespace."""
    m = meta(s, name)
    m.pop("namespace", None)
    return m


def storage_class(s: DeploySettings) -> dict[str, Any]:
    v = s.volume_source
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": cluster_meta(s, v.storage_class),
        "provisioner": PD_CSI_DRIVER,
        "parameters": {
            "type": "hyperdisk-ml",
            "provisioned-throughput-on-create": f"{v.throughput_mib_per_s}Mi",
        },
        "allowVolumeExpansion": False,
        "reclaimPolicy": "Delete",
        "volumeBindingMode": "WaitForFirstConsumer",
    }


def _claim(s: DeploySettings, name: str, mode: str) -> dict[str, Any]:
    v = s.volume_source
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": meta(s, name),
        "spec": {
            "accessModes": [mode],
            "storageClassName": v.storage_class,
            "resources": {"requests": {"storage": v.size}},
        },
    }


def fill_claim(s: DeploySettings) -> dict[str, Any]:
    return _claim(s, fill_claim_name(s), "ReadWriteOnce")


def serving_claim(s: DeploySettings) -> dict[str, Any]:
    """ReadOnlyMany, restored from the filled volume's snapshot: every pod attaches it."""
    claim = _claim(s, s.volume_claim, "ReadOnlyMany")
    claim["spec"]["dataSource"] = {
        "apiGroup": SNAPSHOT_API.split("/")[0],
        "kind": "VolumeSnapshot",
        "name": snapshot_name(s),
    }
    return claim


def snapshot_class(s: DeploySettings) -> dict[str, Any]:
    return {
        "apiVersion": SNAPSHOT_API,
        "kind": "VolumeSnapshotClass",
        "metadata": cluster_meta(s, snapshot_class_name(s)),
        "driver": PD_CSI_DRIVER,
        "deletionPolicy": "Delete",
    }


def snapshot(s: DeploySettings) -> dict[str, Any]:
    return {
        "apiVersion": SNAPSHOT_API,
        "kind": "VolumeSnapshot",
        "metadata": meta(s, snapshot_name(s)),
        "spec": {
            "volumeSnapshotClassName": snapshot_class_name(s),
            "source": {"persistentVolumeClaimName": fill_claim_name(s)},
        },
    }


def fill_env(s: DeploySettings) -> list[dict[str, Any]]:
    """What the fill reads: the repo and its commit (the pods read the mount instead), the
    Hub token from the same Secret a Hub-sourced pod reads."""
    return [
        {"name": ENV_PREFIX + "ARTIFACT", "value": str(s.artifact)},
        {"name": ENV_PREFIX + "ARTIFACT_REVISION", "value": str(s.artifact_revision)},
        {"name": "HOME", "value": APP_HOME_DIR},
        {"name": "PYTHONPATH", "value": "/packages"},
        hf_token_env(s),
    ]


def fill_job(s: DeploySettings, pod: dict[str, Any]) -> dict[str, Any]:
    """The serving image downloads artifact@revision into the writable claim, verifies it
    as a pod would, and prints the manifest's sha256 (the pods' pin). `pod` is the
    Deployment's pod spec: the same user, security context and nodes, but no GPU."""
    (server,) = pod["containers"]
    into = f"{FILL_MOUNT}/{s.volume_path}"
    container = {
        "name": "fill",
        "image": s.image_ref,
        "imagePullPolicy": "IfNotPresent",
        "command": ["/usr/bin/python3", "-m", "mistral_serving.artifacts.fill"],
        "args": ["--into", into],
        "workingDir": "/app",
        "env": fill_env(s),
        "resources": {
            "requests": {"cpu": "2", "memory": "4Gi", "ephemeral-storage": "10Gi"},
            "limits": {"memory": "8Gi", "ephemeral-storage": "20Gi"},
        },
        "securityContext": server["securityContext"],
        "volumeMounts": [
            {"name": "weights", "mountPath": FILL_MOUNT},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
    }
    spec = {
        "restartPolicy": "OnFailure",  # a retry resumes the download
        # On the serving node pool (no GPU asked): its machine type is the one that must
        # attach Hyperdisk ML, and the volume is made in that pool's zone.
        "nodeSelector": pod["nodeSelector"],
        "tolerations": pod["tolerations"],
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": NON_ROOT_UID,
            "runAsGroup": NON_ROOT_UID,
            "fsGroup": NON_ROOT_UID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
        "volumes": [
            {"name": "weights", "persistentVolumeClaim": {"claimName": fill_claim_name(s)}},
            {"name": "tmp", "emptyDir": {"sizeLimit": "4Gi"}},
        ],
    }
    job_labels = {**labels(s), "app.kubernetes.io/component": "fill-weights"}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": meta(s, fill_job_name(s), {"app.kubernetes.io/component": "fill-weights"}),
        "spec": {
            "backoffLimit": 4,
            "activeDeadlineSeconds": 7200,
            "ttlSecondsAfterFinished": 604800,  # its log (the pin) stays a week
            "template": {"metadata": {"labels": job_labels}, "spec": spec},
        },
    }


# Files in k8s/weights/, in the order they are applied (docs/deploy.md walks it).
WEIGHTS_FILES = (
    "storageclass.yaml",
    "fill-pvc.yaml",
    "fill-job.yaml",
    "snapshotclass.yaml",
    "snapshot.yaml",
    "pvc.yaml",
)


def render_weights(s: DeploySettings, pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """File name inside k8s/weights/ -> object (only with artifact_source: volume)."""
    objs = [storage_class(s), fill_claim(s), fill_job(s, pod), snapshot_class(s),
            snapshot(s), serving_claim(s)]  # fmt: skip
    return dict(zip(WEIGHTS_FILES, objs, strict=True))
