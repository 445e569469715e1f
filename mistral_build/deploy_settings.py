"""One settings source for the image, the Truss config.yaml and the Kubernetes manifests.

`DeploySettings` holds what `python build.py image` and `python build.py manifests` need
beyond the serving settings: image name and tag, the engine artifact (repo + pinned commit),
GPU type and count, replicas, resources and shutdown timing. A `--values FILE` (YAML, a
subset of the fields) and command-line flags override the defaults, in that order.

Serving settings are NOT redeclared here: their defaults live in
`mistral_serving.settings.Settings` only. `serving:` holds the ones a deployment changes
(as `MTT_<KEY>` in the pod, and in config.yaml's `model_metadata`); everything derived
from them (the drain in the grace period, the cache mount) reads the effective `Settings`.

There are no placeholder defaults: `image`, `artifact` and `artifact_revision` have none,
and rendering manifests without them is refused (`require_deployable`). The revision must
be a 40-hex commit sha: a branch or tag name can move under a running deployment.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path, PurePosixPath
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    ValidationError,
    field_validator,
    model_validator,
)

from mistral_serving.settings import ENV_PREFIX, Settings, unknown_settings

GpuType = Literal["a100", "h100", "l4"]

# GKE node label `cloud.google.com/gke-accelerator` for each GPU type we build engines for.
GKE_ACCELERATORS: dict[str, str] = {
    "a100": "nvidia-tesla-a100",
    "h100": "nvidia-h100-80gb",
    "l4": "nvidia-l4",
}

# The Truss `resources.accelerator` spelling of the same GPU types.
TRUSS_ACCELERATORS: dict[str, str] = {"a100": "A100", "h100": "H100", "l4": "L4"}

# HOME of the image's non-root `app` user: a `~` in a serving path resolves against it.
APP_HOME_DIR = "/home/app"

# Label, namespace-less names: [a-z0-9-], at most 63 characters (DNS-1035 label).
_NAME_PATTERN = r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$"
# Secret names are DNS-1123 subdomains.
_SECRET_PATTERN = r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$"
# A Docker image repository: lower-case registry host[:port] and path components.
_IMAGE_PATTERN = r"^[a-z0-9]+([.-][a-z0-9]+)*(:[0-9]+)?(/[a-z0-9]+(([._]|__|-+)[a-z0-9]+)*)+$"
_REPO_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$"
_COMMIT_SHA = re.compile(r"^[0-9a-f]{40}$")
# Placeholders from older docs and defaults: refused so that they are never deployed.
_DOC_PLACEHOLDERS = ("my-gcp-project", "my-hf-org")

# Serving settings that are deploy fields of their own (they differ per deployment).
_DEPLOY_OWNED = (
    "artifact",
    "artifact_revision",
    "artifact_manifest_sha256",
    "objective_priorities",  # from gateway_objectives: the router's and the pods' one map
)

# Where a mounted artifact (gcsfuse, volume) appears in the pod: MTT_ARTIFACT points here.
ARTIFACT_MOUNT_PATH = "/models/artifact"
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
# Cloud Storage bucket names (dots allowed, 3-222 characters) and an object prefix.
_BUCKET_PATTERN = r"^[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]$"
_PREFIX_PATTERN = r"^([A-Za-z0-9._-]+/)*[A-Za-z0-9._-]+$"
_GSA_PATTERN = (
    r"^[a-z][a-z0-9-]{4,28}[a-z0-9]@[a-z][a-z0-9-]{4,28}[a-z0-9]\.iam\.gserviceaccount\.com$"
)
_QUANTITY_PATTERN = r"^[0-9]+(Ki|Mi|Gi|Ti)$"

ArtifactSource = Literal["hub", "gcsfuse", "volume"]


def _no_dot_components(value: str | None) -> str | None:
    if value is not None and any(part in (".", "..") for part in value.split("/")):
        raise ValueError(f"{value!r}: no '.' or '..' folder (a path inside the bucket or volume)")
    return value


class GcsFuseSource(BaseModel):
    """A Cloud Storage bucket mounted read-only by the GCS FUSE CSI driver (GKE add-on)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    bucket: str = Field(..., pattern=_BUCKET_PATTERN, description="Bucket name (no gs://).")
    path: str = Field(
        ...,
        pattern=_PREFIX_PATTERN,
        description="Folder in the bucket holding the artifact (what `build.py copy-to-bucket` "
        "wrote); only it is mounted (gcsfuse only-dir).",
    )
    service_account: str | None = Field(
        None,
        pattern=_GSA_PATTERN,
        description="Google service account the pods read the bucket as (Workload Identity "
        "annotation on their Kubernetes service account); none: grant the Kubernetes "
        "service account's own principal roles/storage.objectViewer.",
    )
    file_cache_size: str = Field(
        "60Gi",
        pattern=_QUANTITY_PATTERN,
        description="gcsfuse file cache (fileCacheCapacity): the artifact is read from it "
        "after the first read; at least the artifact's size.",
    )
    file_cache_medium: Literal["disk", "memory"] = Field(
        "disk",
        description="Where the file cache lives: the node's ephemeral disk (Local SSD where "
        "the node pool has it) or memory (counts against the pod's memory).",
    )
    parallel_downloads_per_file: int = Field(
        16, ge=1, le=256, description="gcsfuse parallel downloads per file into the file cache."
    )
    download_chunk_size_mb: int = Field(
        64, ge=1, le=1024, description="Size of each parallel download's chunk."
    )

    _path = field_validator("path")(_no_dot_components)


class VolumeSource(BaseModel):
    """A ReadOnlyMany volume filled once (Hyperdisk ML): `k8s/weights/` creates and fills it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    claim: str | None = Field(
        None,
        pattern=_NAME_PATTERN,
        description="The ReadOnlyMany PersistentVolumeClaim the pods mount (default "
        "NAME-weights, which k8s/weights/ creates).",
    )
    path: str | None = Field(
        None,
        pattern=_PREFIX_PATTERN,
        description="Folder of the artifact inside the volume (default: artifact_revision, "
        "where the fill Job writes it).",
    )
    size: str = Field("100Gi", pattern=_QUANTITY_PATTERN, description="Volume size.")
    storage_class: str = Field(
        "hyperdisk-ml", pattern=_NAME_PATTERN, description="StorageClass k8s/weights/ renders."
    )
    throughput_mib_per_s: int = Field(
        2400,
        ge=400,
        le=1_200_000,
        description="Hyperdisk ML provisioned throughput (provisioned-throughput-on-create).",
    )

    _path = field_validator("path")(_no_dot_components)


class DeploySettingsError(ValueError):
    """Invalid deploy settings; the message is one actionable line."""


class DeploySettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    # Names.
    name: str = Field(
        "mistral-7b-instruct-trt",
        pattern=_NAME_PATTERN,
        description="Name of the Deployment, Service, PDB and HPA; the app label.",
    )
    namespace: str | None = Field(
        None,
        pattern=_NAME_PATTERN,
        description="Namespace written into the manifests; none: `kubectl apply -n` decides.",
    )

    # Image.
    image: str | None = Field(
        None,
        pattern=_IMAGE_PATTERN,
        description="Image repository (registry/path/name) that `build.py image` pushes to.",
    )
    image_tag: str = Field("0.1.0", pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")

    # What the pod serves (MTT_ARTIFACT / MTT_ARTIFACT_REVISION).
    artifact: str | None = Field(
        None,
        pattern=_REPO_ID_PATTERN,
        description="Hugging Face repo id of the TensorRT-LLM engine artifact.",
    )
    artifact_revision: str | None = Field(
        None,
        description="40-hex commit sha of the artifact (`build.py engine --push` prints it).",
    )
    artifact_source: ArtifactSource = Field(
        "hub",
        description="Where the pods read the artifact: `hub` (each pod downloads "
        "artifact@artifact_revision into its cache), `gcsfuse` (a bucket mounted read-only) "
        "or `volume` (a ReadOnlyMany volume filled once). Mounted ones never touch the Hub.",
    )
    gcsfuse: GcsFuseSource | None = Field(None, description="With artifact_source: gcsfuse.")
    volume: VolumeSource | None = Field(None, description="With artifact_source: volume.")
    artifact_manifest_sha256: str | None = Field(
        None,
        description="sha256 of the artifact's build_manifest.json: pins a mounted artifact "
        "(`build.py copy-to-bucket` and the fill Job print it). Required with gcsfuse.",
    )
    hf_token_secret: str = Field(
        "mistral-7b-instruct-trt-hf-token",
        pattern=_SECRET_PATTERN,
        description="Kubernetes Secret holding the Hugging Face token (key hf_access_token).",
    )
    serving: dict[str, str] = Field(
        default_factory=dict,
        description="Serving settings this deployment changes (Settings fields), "
        "passed as MTT_<KEY> and written into config.yaml's model_metadata.",
    )

    gpu_fallback: bool = Field(
        False,
        description="Put the GPU fallback package (the PyTorch engine's static KV cache, the "
        "engine process, several front-end processes) in the image. Off: a TensorRT-LLM "
        "image, without code it never runs.",
    )

    # GPUs.
    gpu_type: GpuType = "a100"
    gpu_count: int = Field(
        1, ge=1, le=8, description="GPUs per pod = the engine's tensor-parallel size."
    )
    gpu_driver_version: Literal["latest", "default"] = Field(
        "latest",
        description="GKE node label cloud.google.com/gke-gpu-driver-version the pods select: "
        "the node pool's gpu-driver-version. The image is CUDA 13.0 and needs an R580 "
        "driver (>= 580.65.06), which GKE's `latest` has on current versions.",
    )

    # Replicas and autoscaling.
    replicas: int = Field(1, ge=1, description="Initial replicas = HPA minimum.")
    max_replicas: int = Field(4, ge=1, description="HPA maximum.")
    hpa_target_waiting: int = Field(
        4, ge=1, description="Scale out when requests waiting per pod exceed this."
    )
    hpa_target_running: int = Field(
        48, ge=1, description="Scale out when requests generating per pod exceed this."
    )
    metrics_adapter: Literal["gke-managed-prometheus", "prometheus-adapter"] = Field(
        "gke-managed-prometheus",
        description="Which custom-metrics adapter serves the HPA's Pods metrics; "
        "it decides the metric names the HPA asks for.",
    )

    # Network.
    port: int = Field(8080, ge=1, le=65535, description="Truss server port in the container.")
    service_port: int = Field(8080, ge=1, le=65535)
    gateway: bool = Field(
        False,
        description="Also render gateway/ beside the manifests: GKE Inference Gateway (InferencePool, "
        "endpoint picker, Gateway, HTTPRoute).",
    )
    gateway_class: str = Field(
        "gke-l7-rilb", min_length=1, description="GatewayClass of the Gateway (internal L7)."
    )
    gateway_objectives: dict[str, StrictInt] = Field(
        default_factory=dict,
        max_length=32,
        description="InferenceObjectives to render with the gateway: name -> priority "
        "(higher first; a request without one is 0). Clients name one in the "
        "`x-llm-d-inference-objective` header; the pods order their own queue by the same "
        "map (serving setting objective_priorities).",
    )

    # Resources (per pod).
    cpu_request: str = "8"
    cpu_limit: str | None = None
    memory_request: str = "64Gi"
    memory_limit: str = "64Gi"
    ephemeral_storage_request: str = "40Gi"
    ephemeral_storage_limit: str = "100Gi"
    shm_size: str = Field("8Gi", description="/dev/shm (memory emptyDir; counts as memory).")
    cache_size: str = Field("60Gi", description="sizeLimit of the engine cache emptyDir.")
    cache_pvc: str | None = Field(
        None,
        description="Use this existing PersistentVolumeClaim for the engine cache instead "
        "of an emptyDir (ReadWriteMany or one claim per replica).",
    )

    # Start-up and shutdown (the drain itself is Settings.drain_grace_seconds, 45 s, and
    # drain_listen_seconds inside it). The fleet's values: KServe (v0.19, llmisvc) and
    # llm-d's guides sleep 15 s in preStop and drain 45 s (vLLM's --shutdown-timeout);
    # llm-d adds 15 s for teardown (75 s), we keep 20 s (verify-gpu measures our exit
    # against it) for 80 s. docs/deploy.md says why each.
    startup_timeout_seconds: int = Field(
        1800, ge=60, description="How long the engine may take to download and load."
    )
    pre_stop_sleep_seconds: int = Field(
        15,
        ge=0,
        description="Keep serving while the pod's removal reaches the endpoint picker and "
        "load balancers (KServe's and llm-d's 15 s).",
    )
    shutdown_margin_seconds: int = Field(
        20, ge=5, description="Time after the drain for aborting, engine teardown and exit."
    )

    @field_validator("image", "artifact")
    @classmethod
    def _no_doc_placeholder(cls, value: str | None) -> str | None:
        for placeholder in _DOC_PLACEHOLDERS:
            if value and placeholder in value:
                raise ValueError(f"{value!r} is a documentation placeholder: use your own")
        return value

    @field_validator("gateway_objectives")
    @classmethod
    def _objective_names(cls, value: dict[str, int]) -> dict[str, int]:
        # Object names (and file names in k8s/gateway/); priorities are the CRD's int32.
        for name, priority in value.items():
            if not re.fullmatch(_NAME_PATTERN, name):
                raise ValueError(f"objective {name[:80]!r}: a DNS-1035 label ([a-z0-9-], <= 63)")
            if not -(2**31) <= priority < 2**31:
                raise ValueError(f"objective {name!r}: priority {priority} is not an int32")
        return value

    @field_validator("artifact_revision")
    @classmethod
    def _commit_sha(cls, value: str | None) -> str | None:
        if value is not None and not _COMMIT_SHA.fullmatch(value):
            raise ValueError(
                f"{value!r} is not a 40-hex commit sha; a branch or tag can move under a "
                "running deployment: pin the sha that `build.py engine --push` printed"
            )
        return value

    @field_validator("artifact_manifest_sha256")
    @classmethod
    def _manifest_sha(cls, value: str | None) -> str | None:
        if value is not None and not _SHA256.fullmatch(value):
            raise ValueError(f"{value!r} is not a 64-hex sha256 (lower case)")
        return value

    @field_validator("serving", mode="before")
    @classmethod
    def _known_serving_keys(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            return value  # pydantic reports the type error
        if problem := unknown_settings(str(k) for k in value):
            raise ValueError(problem)
        for key in value:
            if key in _DEPLOY_OWNED:
                raise ValueError(f"set {key!r} as a deploy setting, not under serving")
        return {
            k: "" if v is None else str(v).lower() if isinstance(v, bool) else str(v)
            for k, v in value.items()
        }

    @model_validator(mode="after")
    def _check(self) -> DeploySettings:
        if self.max_replicas < self.replicas:
            raise ValueError("max_replicas must be at least replicas")
        if self.artifact_source == "gcsfuse" and self.gcsfuse is None:
            raise ValueError("artifact_source gcsfuse needs a gcsfuse: {bucket, path} block")
        if self.gcsfuse is not None and self.artifact_source != "gcsfuse":
            raise ValueError("a gcsfuse block is only read with artifact_source: gcsfuse")
        if self.volume is not None and self.artifact_source != "volume":
            raise ValueError("a volume block is only read with artifact_source: volume")
        # The pod's settings must be valid, and its cache must be a path we can mount.
        self.cache_mount_path  # noqa: B018 - raises on a relative path
        return self

    # --- the pod's serving settings ------------------------------------------------------

    def serving_env(self) -> dict[str, str]:
        """Serving settings the pod gets, by Settings field name (MTT_<NAME> upper-cased).
        A mounted artifact is served from its mount, pinned by its manifest's sha256."""
        env = {}
        if self.mounted:
            env["artifact"] = ARTIFACT_MOUNT_PATH
        else:
            if self.artifact is not None:
                env["artifact"] = self.artifact
            if self.artifact_revision is not None:
                env["artifact_revision"] = self.artifact_revision
        if self.artifact_manifest_sha256 is not None:
            env["artifact_manifest_sha256"] = self.artifact_manifest_sha256
        if self.gateway_objectives:  # the pods order their queue as the router's objectives
            env["objective_priorities"] = json.dumps(self.gateway_objectives, sort_keys=True)
        return {**env, **self.serving}

    @property
    def mounted(self) -> bool:
        """The artifact is a read-only mount in the pod (no Hub, no token)."""
        return self.artifact_source != "hub"

    @property
    def volume_source(self) -> VolumeSource:
        return self.volume or VolumeSource()

    @property
    def volume_claim(self) -> str:
        return self.volume_source.claim or f"{self.name[:55]}-weights"

    @property
    def volume_path(self) -> str | None:
        """Folder of the artifact inside the volume: where the fill Job writes it."""
        return self.volume_source.path or self.artifact_revision

    @property
    def serving_settings(self) -> Settings:
        """The Settings the pod runs with: Settings' defaults, then our overrides."""
        env = {ENV_PREFIX + k.upper(): v for k, v in self.serving_env().items()}
        return Settings.load({}, env=env)

    def model_metadata(self) -> dict[str, Any]:
        """config.yaml's `model_metadata`: the overrides that differ from Settings' defaults,
        typed as Settings holds them."""
        effective = self.serving_settings.model_dump(mode="json")
        defaults = Settings().model_dump(mode="json")
        return {k: effective[k] for k in self.serving if effective[k] != defaults[k]}

    @property
    def cache_mount_path(self) -> str:
        """Where the engine cache volume is mounted: Settings.cache_dir in the pod (a `~`
        is the image user's HOME, which the manifests set)."""
        raw = self.serving_settings.cache_dir
        path = APP_HOME_DIR + raw[1:] if raw == "~" or raw.startswith("~/") else raw
        if not PurePosixPath(path).is_absolute():
            raise ValueError(f"cache_dir {raw!r} must be an absolute path (or start with ~/)")
        return path

    # --- derived values: every manifest reads them from here -----------------------------

    @property
    def image_ref(self) -> str:
        return f"{self.image}:{self.image_tag}"

    @property
    def verify_image_ref(self) -> str:
        """The verify image (`build.py image` builds it beside the serving image)."""
        return f"{self.image}:{self.image_tag}-verify"

    @property
    def gke_accelerator(self) -> str:
        return GKE_ACCELERATORS[self.gpu_type]

    @property
    def truss_accelerator(self) -> str:
        base = TRUSS_ACCELERATORS[self.gpu_type]
        return base if self.gpu_count == 1 else f"{base}:{self.gpu_count}"

    @property
    def termination_grace_period_seconds(self) -> int:
        """preStop sleep + the server's drain + a margin: SIGKILL only after all of it."""
        return (
            self.pre_stop_sleep_seconds
            + math.ceil(self.serving_settings.drain_grace_seconds)
            + self.shutdown_margin_seconds
        )

    def missing_for_deploy(self) -> list[str]:
        """Fields a deployment needs that are not set (no placeholder stands in for them):
        the Hub source (and the volume's fill) needs the repo and its commit; a bucket is
        pinned by its manifest's sha256 instead."""
        needed = {
            "hub": ("image", "artifact", "artifact_revision"),
            "gcsfuse": ("image", "artifact_manifest_sha256"),
            "volume": ("image", "artifact", "artifact_revision"),
        }[self.artifact_source]
        return [f for f in needed if getattr(self, f) is None]

    def require_deployable(self) -> None:
        missing = self.missing_for_deploy()
        if missing:
            raise DeploySettingsError(
                f"no value for {', '.join(missing)}: give them in --values FILE "
                "(start from k8s/values.yaml.example) or as flags; manifests are never "
                "rendered with placeholders"
            )


def load_deploy_settings(
    values_file: Path | None = None, overrides: dict[str, Any] | None = None
) -> DeploySettings:
    """Defaults, then the values file (YAML mapping), then overrides (None = not given)."""
    values: dict[str, Any] = {}
    if values_file is not None:
        try:
            loaded = yaml.safe_load(Path(values_file).read_text()) or {}
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise DeploySettingsError(f"cannot read values file {values_file}: {reason}") from None
        if not isinstance(loaded, dict):
            raise DeploySettingsError(f"values file {values_file} must hold a YAML mapping")
        values.update(loaded)
    for key, value in (overrides or {}).items():
        if value is None:
            continue
        if key == "serving":
            base = values.get("serving")
            values["serving"] = {**(base if isinstance(base, dict) else {}), **value}
        else:
            values[key] = value
    try:
        return DeploySettings(**{str(k): v for k, v in values.items()})
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'settings'}: "
            f"{e['msg'].removeprefix('Value error, ')}"
            for e in exc.errors()
        )
        raise DeploySettingsError(f"invalid deploy settings: {problems}") from None
    except ValueError as exc:  # a serving value Settings refuses (raised while deriving)
        raise DeploySettingsError(f"invalid deploy settings: {exc}") from None


def add_settings_arguments(parser: Any) -> None:
    """The flags `image`, `manifests` and the no-argument run share."""
    g = parser.add_argument_group("deploy settings (override --values)")
    g.add_argument(
        "--values",
        type=Path,
        metavar="FILE",
        help="YAML file with DeploySettings fields (start from k8s/values.yaml.example).",
    )
    g.add_argument(
        "--image", help="Image repository, e.g. REGION-docker.pkg.dev/PROJECT/REPO/NAME."
    )
    g.add_argument("--tag", dest="image_tag", help="Image tag (default: 0.1.0).")
    g.add_argument("--artifact", help="Hugging Face repo id of the engine artifact.")
    g.add_argument(
        "--revision", dest="artifact_revision", help="40-hex commit sha of the artifact."
    )
    g.add_argument("--gpu-type", choices=sorted(GKE_ACCELERATORS), help="GPU type (default: a100).")
    g.add_argument(
        "--gpu-count", type=int, help="GPUs per pod = tensor-parallel size (default: 1)."
    )
    g.add_argument("--replicas", type=int, help="Initial replicas, the HPA minimum (default: 1).")
    g.add_argument("--max-replicas", type=int, help="HPA maximum (default: 4).")
    g.add_argument("--namespace", help="Namespace to write into the manifests (default: none).")
    g.add_argument(
        "--gateway",
        action="store_true",
        default=None,
        help="Also render gateway/ beside the manifests (GKE Inference Gateway; docs/deploy.md).",
    )
    g.add_argument(
        "--set",
        dest="serving_set",
        action="append",
        metavar="KEY=VALUE",
        help="Serving setting for the pod (a Settings field), e.g. max_inflight=128.",
    )


def settings_from_args(args: Any) -> DeploySettings:
    names = [
        "image",
        "image_tag",
        "artifact",
        "artifact_revision",
        "gpu_type",
        "gpu_count",
        "replicas",
        "max_replicas",
        "namespace",
        "gateway",
    ]
    overrides: dict[str, Any] = {n: getattr(args, n, None) for n in names}
    serving: dict[str, str] = {}
    for item in getattr(args, "serving_set", None) or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise DeploySettingsError(f"--set expects KEY=VALUE, got {item!r}")
        serving[key.strip()] = value
    if serving:
        overrides["serving"] = serving
    return load_deploy_settings(getattr(args, "values", None), overrides)
