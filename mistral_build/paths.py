"""Where things are in a checkout of this repository."""

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
TRUSS_DIR = REPO_ROOT / "mistral-trt-truss"
CACHE_DIR = REPO_ROOT / ".cache"
# MISTRAL_DEV_MODEL_DIR: another copy (`make test-compat` builds its own with its own transformers).
DEV_MODEL_DIR = Path(os.environ.get("MISTRAL_DEV_MODEL_DIR") or CACHE_DIR / "dev-model")
K8S_DIR = REPO_ROOT / "k8s"  # what the example values render: tracked, for review
# Where `build.py manifests` renders your values by default: untracked (build/ is ignored),
# so a rendering never changes the repository's example (its drift test would fail).
