"""One settings source for the image and the Kubernetes manifests.

`DeploySettings` holds everything `python build.py image` and `python build.py manifests`
need: image name and tag, the engine artifact (repo + pinned revision), GPU type and count,
replicas, ports, resources and shutdown timing. Its defaults live here, in code; a
`--values FILE` (YAML, a subset of the fields) and command-line flags override them, in
that order. Serving settings (`mistral_serving.settings.Settings`, `MTT_*` in the pod) keep
their own names: `drain_grace_seconds`, `cache_dir` and the `serving` overrides below are
passed to the pod under those names.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from mistral_serving.settings import ENV_PREFIX, Settings

GpuType = Literal["a100", "h100", "l4"]

# GKE node label `cloud.google.com/gke-accelerator` for each GPU type we build engines for.
GKE_ACCELERATORS: dict[str, str] = {
    "a100": "nvidia-tesla-a100",
    "h100": "nvidia-h100-80gb",
    "l4": "nvidia-l4",
}

# The Truss `resources.accelerator` spelling of the same GPU types.
TRUSS_ACCELERATORS: dict[str, str] = {"a100": "A100", "h100": "H100", "l4": "L4"}

# Label, namespace-less names: [a-z0-9-], at most 63 characters (DNS-1035 label).
_NAME_PATTERN = r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$"


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
    image: str = Field(
        "us-central1-docker.pkg.dev/my-gcp-project/llm/mistral-trt-truss",
        min_length=1,
        description="Image repository (registry/path/name) that `build.py image` pushes to.",
    )
    image_tag: str = Field("0.1.0", pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")

    # What the pod serves (MTT_ARTIFACT / MTT_ARTIFACT_REVISION).
    artifact: str = Field(
        "my-hf-org/mistral-7b-instruct-v0.2-trtllm-1.2.1-a100-tp1",
        min_length=1,
        description="Hugging Face repo id of the TensorRT-LLM engine artifact.",
    )
    artifact_revision: str = Field(
        "main",
        min_length=1,
        description="Revision of the artifact; pin a commit sha for production.",
    )
    cache_dir: str = Field(
        "/app/model_cache", description="Engine cache mount path (MTT_CACHE_DIR)."
    )
    serving: dict[str, str] = Field(
        default_factory=dict,
        description="More serving settings (model_metadata keys), passed as MTT_<KEY>.",
    )

    # GPUs.
    gpu_type: GpuType = "a100"
    gpu_count: int = Field(
        1, ge=1, le=8, description="GPUs per pod = the engine's tensor-parallel size."
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

    # Start-up and shutdown.
    startup_timeout_seconds: int = Field(
        1800, ge=60, description="How long the engine may take to download and load."
    )
    drain_grace_seconds: float = Field(
        60.0, ge=0, description="Settings.drain_grace_seconds: in-flight work may finish."
    )
    pre_stop_sleep_seconds: int = Field(
        10, ge=0, description="Keep serving while the endpoint removal propagates."
    )
    shutdown_margin_seconds: int = Field(
        20, ge=5, description="Time after the drain for aborting, engine teardown and exit."
    )

    @field_validator("serving", mode="before")
    @classmethod
    def _known_serving_keys(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            return value  # pydantic reports the type error
        owned = {"artifact", "artifact_revision", "cache_dir", "drain_grace_seconds"}
        for key in value:
            if key not in Settings.model_fields:
                raise ValueError(f"{key!r} is not a field of mistral_serving Settings")
            if key in owned:
                raise ValueError(f"set {key!r} as a deploy setting, not under serving")
        return {
            k: "" if v is None else str(v).lower() if isinstance(v, bool) else str(v)
            for k, v in value.items()
        }

    @model_validator(mode="after")
    def _check(self) -> DeploySettings:
        if self.max_replicas < self.replicas:
            raise ValueError("max_replicas must be at least replicas")
        # The serving overrides must make a valid Settings object in the pod.
        env = {ENV_PREFIX + k.upper(): v for k, v in self.serving_env().items()}
        Settings.load({}, env=env)
        return self

    # Derived values: every manifest reads them from here.

    @property
    def image_ref(self) -> str:
        return f"{self.image}:{self.image_tag}"

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
            + math.ceil(self.drain_grace_seconds)
            + self.shutdown_margin_seconds
        )

    def serving_env(self) -> dict[str, str]:
        """Serving settings for the pod, by Settings field name."""
        drain = self.drain_grace_seconds
        return {
            "artifact": self.artifact,
            "artifact_revision": self.artifact_revision,
            "cache_dir": self.cache_dir,
            "drain_grace_seconds": str(int(drain) if drain == int(drain) else drain),
            **self.serving,
        }


def load_deploy_settings(
    values_file: Path | None = None, overrides: dict[str, Any] | None = None
) -> DeploySettings:
    """Defaults, then the values file (YAML mapping), then overrides (None = not given)."""
    values: dict[str, Any] = {}
    if values_file is not None:
        try:
            loaded = yaml.safe_load(Path(values_file).read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise DeploySettingsError(f"cannot read values file {values_file}: {exc}") from None
        if not isinstance(loaded, dict):
            raise DeploySettingsError(f"values file {values_file} must hold a YAML mapping")
        values.update(loaded)
    for key, value in (overrides or {}).items():
        if value is None:
            continue
        if key == "serving":
            values["serving"] = {**values.get("serving", {}), **value}
        else:
            values[key] = value
    try:
        return DeploySettings(**values)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'settings'}: {e['msg']}" for e in exc.errors()
        )
        raise DeploySettingsError(f"invalid deploy settings: {problems}") from None


def add_settings_arguments(parser: Any) -> None:
    """The flags `image`, `manifests` and the no-argument run share."""
    g = parser.add_argument_group("deploy settings (override defaults and --values)")
    g.add_argument(
        "--values",
        type=Path,
        metavar="FILE",
        help="YAML file with DeploySettings fields (see docs/deploy.md).",
    )
    g.add_argument(
        "--image", help="Image repository, e.g. REGION-docker.pkg.dev/PROJECT/REPO/NAME."
    )
    g.add_argument("--tag", dest="image_tag", help="Image tag.")
    g.add_argument("--artifact", help="Hugging Face repo id of the engine artifact.")
    g.add_argument("--revision", dest="artifact_revision", help="Pinned artifact revision.")
    g.add_argument("--gpu-type", choices=sorted(GKE_ACCELERATORS), help="GPU type (a100).")
    g.add_argument("--gpu-count", type=int, help="GPUs per pod = tensor-parallel size.")
    g.add_argument("--replicas", type=int, help="Initial replicas (HPA minimum).")
    g.add_argument("--max-replicas", type=int, help="HPA maximum.")
    g.add_argument("--namespace", help="Namespace to write into the manifests.")
    g.add_argument(
        "--set",
        dest="serving_set",
        action="append",
        metavar="KEY=VALUE",
        help="Serving setting for the pod (model_metadata key), e.g. max_inflight=128.",
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
