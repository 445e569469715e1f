"""`python build.py SUBCOMMAND`: each subcommand module has `register(subparsers)`, which
adds its parser and sets `func` (taking the parsed args, returning an exit code)."""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

# Modules with a `register(subparsers)` function, in the order `--help` lists them.
SUBCOMMAND_MODULES = [
    "mistral_build.dev_model",
    "mistral_build.engine",
    "mistral_build.local_server",
    "mistral_build.image",
    "mistral_build.truss_config",
    "mistral_build.k8s",
    "mistral_build.k8s_bucket",
    "mistral_build.verify.cli",
    "mistral_build.reference",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="build.py",
        description="Build the dev model, TensorRT-LLM engines, the image and the manifests. "
        "Without a command: the image and k8s/ from --values FILE.",
    )
    parser.add_argument(
        "--values",
        dest="everyday_values",
        type=Path,
        metavar="FILE",
        help="Without a command: the deploy settings (start from k8s/values.yaml.example).",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    return parser


def everyday(values_file: Path | None) -> int:
    """`python build.py --values FILE`: the image (build context; build and push where
    Docker answers) and the Kubernetes manifests in k8s/. Refused, before anything is
    written, while the settings lack an image, an artifact or its commit sha."""
    from mistral_build import image, k8s, paths
    from mistral_build.deploy_settings import DeploySettingsError, load_deploy_settings

    try:
        settings = load_deploy_settings(values_file)
        settings.require_deployable()
    except DeploySettingsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    rc = image.build_image(settings, image.DEFAULT_CONTEXT_DIR)
    if rc != 0:
        return rc
    return k8s.run_manifests(settings, paths.K8S_DIR, values_file)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        return everyday(args.everyday_values)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return args.func(args)
