"""The two pictures in docs/images/: the pipeline (weights -> engine -> Hub -> image -> GKE)
and the drain timeline of a pod being stopped.

`python -m mistral_build.diagrams` writes them. Their numbers come from where the
deployment takes them: the example deploy settings (k8s/values.yaml.example: preStop sleep,
margin, grace period), `Settings` (the drain) and the TensorRT-LLM release. Each PNG
records a digest of those inputs and of this script (`Source` text chunk), so a test can
tell a stale picture without comparing pixels, which differ between matplotlib versions.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; no display needed

import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch  # noqa: E402

from mistral_build.deploy_settings import load_deploy_settings  # noqa: E402
from mistral_build.image import BASE_IMAGE, TRTLLM_VERSION  # noqa: E402
from mistral_build.paths import K8S_DIR, REPO_ROOT  # noqa: E402

IMAGES_DIR = REPO_ROOT / "docs" / "images"
PIPELINE_PNG = "pipeline.png"
DRAIN_PNG = "drain-timeline.png"


def inputs() -> dict[str, Any]:
    """Every number and name the pictures show."""
    s = load_deploy_settings(K8S_DIR / "values.yaml.example")
    return {
        "pre_stop_s": s.pre_stop_sleep_seconds,
        "drain_s": s.serving_settings.drain_grace_seconds,
        "listen_s": min(
            s.serving_settings.drain_listen_seconds, s.serving_settings.drain_grace_seconds
        ),
        "margin_s": s.shutdown_margin_seconds,
        "grace_s": s.termination_grace_period_seconds,
        "trtllm": TRTLLM_VERSION,
        "base_image": BASE_IMAGE,
        "gpu": s.gke_accelerator,
    }


def inputs_digest() -> str:
    source = Path(__file__).read_bytes()
    blob = json.dumps(inputs(), sort_keys=True).encode() + source
    return hashlib.sha256(blob).hexdigest()


def _box(
    ax: Any, x: float, y: float, w: float, h: float, title: str, body: str, color: str
) -> None:
    ax.add_patch(
        FancyBboxPatch(
            (x, y), w, h, boxstyle="round,pad=0.02,rounding_size=0.08", fc=color, ec="#333333"
        )
    )
    ax.text(x + w / 2, y + h - 0.18, title, ha="center", va="top", fontsize=10, weight="bold")
    ax.text(x + w / 2, y + h - 0.52, body, ha="center", va="top", fontsize=7.5, linespacing=1.4)


def pipeline(values: dict[str, Any], path: Path, digest: str) -> None:
    fig, ax = plt.subplots(figsize=(13, 3.2))
    steps = [
        ("Weights", "Hugging Face checkpoint\nmistralai/Mistral-7B-\nInstruct-v0.2", "#e8f1fb"),
        (
            "Engine build",
            f"python build.py engine\nin tensorrt-llm:{values['trtllm']}\non the target GPU",
            "#fdf0dc",
        ),
        ("Hub", "engine + tokenizer +\nbuild manifest, pushed;\npinned by commit sha", "#e9f6ea"),
        (
            "Image",
            f"python build.py image\nFROM {values['base_image'].split('/')[-1]}\n"
            "+ Truss server, uid 60000",
            "#f3e8fb",
        ),
        (
            "GKE",
            f"python build.py manifests\nkubectl apply -f k8s/\n{values['gpu']} nodes",
            "#fbe8ea",
        ),
    ]
    w, h, gap = 2.1, 1.45, 0.55
    for i, (title, body, color) in enumerate(steps):
        x = i * (w + gap)
        _box(ax, x, 0, w, h, title, body, color)
        if i:
            ax.add_patch(
                FancyArrowPatch(
                    (x - gap + 0.05, h / 2), (x - 0.05, h / 2), arrowstyle="-|>", mutation_scale=16
                )
            )
    ax.text(
        (w + gap) * 2.5 - gap / 2,
        -0.35,
        "The pod downloads the pinned engine from the Hub at start (token: Secret "
        "hf_access_token) and checks it against its build manifest and GPU.",
        ha="center",
        fontsize=8,
        style="italic",
    )
    ax.set_xlim(-0.2, len(steps) * (w + gap) - gap + 0.2)
    ax.set_ylim(-0.6, h + 0.2)
    ax.axis("off")
    ax.set_title("From weights to a GPU pod", fontsize=12, weight="bold")
    _save(fig, path, digest)


def drain_timeline(values: dict[str, Any], path: Path, digest: str) -> None:
    pre, drain, grace = values["pre_stop_s"], values["drain_s"], values["grace_s"]
    sigterm, aborts, closes = pre, pre + drain, pre + values["listen_s"]
    fig, ax = plt.subplots(figsize=(13, 4.2))
    rows = {"Kubernetes": 3, "Endpoints": 2, "Server": 1, "Requests": 0}
    bars = [
        ("Kubernetes", 0, pre, "#fdf0dc", f"preStop: sleep {pre} s"),
        ("Kubernetes", pre, grace - pre, "#fbe8ea", f"SIGTERM; grace period ends at {grace} s"),
        ("Endpoints", 0, pre, "#e8f1fb", "removal\npropagates"),
        ("Server", 0, sigterm, "#e9f6ea", "serving,\naccepting"),
        ("Server", sigterm, closes - sigterm, "#fdf0dc", "unready:\n503 draining"),
        (
            "Server",
            closes,
            aborts - closes,
            "#f3e8fb",
            "listener closed: no new connections",
        ),
        ("Server", aborts, grace - aborts, "#eeeeee", "abort, engine teardown, exit"),
        (
            "Requests",
            sigterm,
            aborts - sigterm,
            "#e9f6ea",
            f"in-flight requests may finish (drain {drain:g} s)",
        ),
        ("Requests", aborts, grace - aborts, "#fbe8ea", "unfinished: aborted"),
    ]
    for row, start, length, color, label in bars:
        y = rows[row]
        ax.barh(y, length, left=start, height=0.6, color=color, edgecolor="#333333")
        ax.text(start + length / 2, y, label, ha="center", va="center", fontsize=7.5)
    ax.text(
        pre + 1,
        rows["Endpoints"],
        "the pod leaves the Service (and InferencePool) endpoints while preStop sleeps",
        va="center",
        fontsize=7.5,
        style="italic",
    )
    _marks(ax, sigterm, closes, aborts, grace)
    ax.set_yticks(list(rows.values()), list(rows.keys()))
    ax.set_xlim(-2, grace + 3)
    ax.set_ylim(-0.6, 4.3)
    ax.set_xlabel("seconds after the pod is deleted")
    ax.set_title(
        f"Stopping a pod: preStop {pre} s + drain {drain:g} s + margin {values['margin_s']} s "
        f"= terminationGracePeriodSeconds {grace} s",
        fontsize=11,
        weight="bold",
        pad=28,
    )
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    _save(fig, path, digest)


def _marks(ax: Any, sigterm: float, closes: float, aborts: float, grace: float) -> None:
    """The drain's moments as dashed lines; the two close ones lean apart."""
    marks = [
        (0, "pod deleted", "center"),
        (sigterm, f"SIGTERM ({sigterm:g} s): unready", "right"),
        (closes, f"listener closes ({closes:g} s)", "left"),
        (aborts, f"drain over ({aborts:g} s)", "center"),
        (grace, f"SIGKILL ({grace:g} s)", "center"),
    ]
    for x, label, align in marks:
        ax.axvline(x, color="#555555", linestyle="--", linewidth=0.8)
        ax.text(x, 3.55, label, ha=align, va="bottom", fontsize=8)


def _save(fig: Any, path: Path, digest: str) -> None:
    fig.tight_layout()
    # No software/date chunks: the same inputs give the same metadata.
    fig.savefig(path, dpi=110, metadata={"Software": None, "Source": digest})
    plt.close(fig)


def write_all(out_dir: Path = IMAGES_DIR) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    values, digest = inputs(), inputs_digest()
    paths = [out_dir / PIPELINE_PNG, out_dir / DRAIN_PNG]
    pipeline(values, paths[0], digest)
    drain_timeline(values, paths[1], digest)
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=IMAGES_DIR, help="default: docs/images/")
    args = parser.parse_args(argv)
    for path in write_all(args.out):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
