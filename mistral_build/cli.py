"""`python build.py SUBCOMMAND`: each subcommand module has `register(subparsers)`, which
adds its parser and sets `func` (taking the parsed args, returning an exit code)."""

from __future__ import annotations

import argparse
import importlib

# Modules with a `register(subparsers)` function, in the order `--help` lists them.
SUBCOMMAND_MODULES = [
    "mistral_build.dev_model",
    "mistral_build.engine",
    "mistral_build.local_server",
    "mistral_build.image",
    "mistral_build.manifests",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="build.py",
        description="Build the dev model, TensorRT-LLM engines, the image and the manifests.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    return parser


def everyday() -> int:
    """`python build.py` with no arguments: the image (build context; build and push where
    Docker answers) and the Kubernetes manifests in k8s/, from the default DeploySettings."""
    from mistral_build import image, manifests, paths
    from mistral_build.deploy_settings import load_deploy_settings

    settings = load_deploy_settings()
    rc = image.build_image(settings, image.DEFAULT_CONTEXT_DIR)
    if rc != 0:
        return rc
    return manifests.run_manifests(settings, paths.K8S_DIR)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        return everyday()
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return args.func(args)
