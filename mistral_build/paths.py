"""Where things are in a checkout of this repository."""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
TRUSS_DIR = REPO_ROOT / "mistral-trt-truss"
CACHE_DIR = REPO_ROOT / ".cache"
DEV_MODEL_DIR = CACHE_DIR / "dev-model"
K8S_DIR = REPO_ROOT / "k8s"
