"""`python build.py verify-gpu`: the command line, and the run of each kind (artifact,
server, checks, benchmark, drain) into one report."""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from mistral_build.image import VERIFY_APP_ENV, VERIFY_PACKAGES_ENV
from mistral_build.local_server import (
    LocalServer,
    prepare_app_dir,
    render_build_context,
    wait_ready,
)
from mistral_build.verify import artifact, report
from mistral_build.verify.bench import run_benchmark
from mistral_build.verify.checks import ANSWER_CHECKS, Context
from mistral_build.verify.config import (
    DEFAULT_OUT,
    DRAIN_GRACE_S,
    GPU_KINDS,
    KIND_CHOICES,
    Kind,
    VerifyOptions,
)
from mistral_build.verify.driver import check_driver_vs_cuda, check_trtllm_import
from mistral_build.verify.judges import make_tokenize
from mistral_build.verify.lifecycle import LIFECYCLE_CHECKS, check_drain_on_sigterm
from mistral_build.verify.results import CheckFailed, CheckResult, KindReport, run_check

CHECKS = ANSWER_CHECKS + LIFECYCLE_CHECKS


def context_dir(opts: VerifyOptions) -> Path:
    """What the server runs from (`app/` and `packages/`): in the verify image, the image's
    own folders (links to them); in a checkout, the Truss build context rendered by truss's
    own code, laid out as the image does."""
    if opts.app_dir is not None and opts.packages_dir is not None:
        context = opts.out / "image-server"
        shutil.rmtree(context, ignore_errors=True)
        context.mkdir(parents=True)
        (context / "app").symlink_to(opts.app_dir.resolve())
        (context / "packages").symlink_to(opts.packages_dir.resolve())
        return context
    context = render_build_context(opts.out / "truss-context")
    prepare_app_dir(context)
    return context


def _prepare(kind: Kind, opts: VerifyOptions, report_: KindReport) -> str | None:
    """The kind's artifact, or None after recording a failed build as the kind's result."""
    print(f"[{kind}] artifact", flush=True)
    started = time.monotonic()
    try:
        path, report_.build = artifact.prepare_artifact(kind, opts)
    except Exception as exc:  # a failed build is this kind's result
        report_.build = {"status": "failed", "error": f"{type(exc).__name__}: {exc}"}
        report_.checks.append(
            CheckResult("build", False, report_.build["error"], time.monotonic() - started)
        )
        print(f"  [FAIL] build: {report_.build['error']}", flush=True)
        return None
    report_.artifact = path
    if report_.build["status"] == "built":
        report_.checks.append(CheckResult("build", True, "engine built", report_.build["seconds"]))
    return path


def verify_kind(kind: Kind, opts: VerifyOptions, context: Callable[[], Path]) -> KindReport:
    report_ = KindReport(kind)
    if kind in GPU_KINDS:  # first: a driver too old for the image's CUDA breaks all else
        report_.checks.append(run_check("driver_vs_cuda", check_driver_vs_cuda))
        report_.checks.append(run_check("tensorrt_llm_import", check_trtllm_import))
    path = _prepare(kind, opts, report_)
    if path is None:
        return report_
    settings = artifact.server_settings(kind, path, opts.overrides)
    log_path = opts.out / f"server-{kind}.log"
    server = LocalServer.start(context(), settings, log_path=log_path, wait=False)
    report_.server = {"url": server.url, "settings": settings, "log": str(log_path)}
    print(f"[{kind}] starting the Truss server on {server.url} (log: {log_path})", flush=True)
    try:
        load = run_check(
            "server_ready", lambda: _ready(server.url, server.process, opts.ready_timeout, log_path)
        )
        report_.checks.append(load)
        if load.passed:
            ctx = Context(
                url=server.url,
                expected_engine=kind,
                long_tokens=opts.long_tokens,
                drain_tokens=opts.drain_tokens,
                max_num_tokens=artifact.max_num_tokens_of(kind, path, settings),
                tokenize=make_tokenize(path),
            )
            grace = float(settings.get("drain_grace_seconds", DRAIN_GRACE_S))
            _run_checks(ctx, opts, report_, server.process, grace)
    finally:
        server.kill()
    return report_


def _run_checks(
    ctx: Context,
    opts: VerifyOptions,
    report_: KindReport,
    process: subprocess.Popen[Any],
    grace: float,
) -> None:
    for name, check in CHECKS:
        report_.checks.append(run_check(name, functools.partial(check, ctx)))
    if opts.bench_prompts > 0:
        report_.checks.append(
            run_check("benchmark", lambda: _bench(ctx, opts.bench_prompts, report_))
        )
    report_.checks.append(
        run_check("drain_on_sigterm", lambda: check_drain_on_sigterm(ctx, process, grace))
    )


def _ready(url: str, process: subprocess.Popen[Any], timeout: float, log_path: Path) -> str:
    try:
        return f"ready in {wait_ready(url, process, timeout, log_path):.1f} s"
    except RuntimeError as exc:
        raise CheckFailed(str(exc)) from None


def _bench(ctx: Context, prompts: int, report_: KindReport) -> str:
    report_.bench = run_benchmark(ctx, prompts)
    points = report_.bench["points"]
    failed = sum(p.get("failed") or 0 for p in points)
    if failed:
        raise CheckFailed(f"{failed} benchmark requests failed")
    return (
        "; ".join(f"c={p['concurrency']}: {p['output_throughput']:.0f} tok/s" for p in points)
        + f" ({report_.bench['tool']})"
    )


def parse_set(items: list[str] | None) -> dict[str, str]:
    """`--set KEY=VALUE` pairs; ValueError names a malformed one."""
    out: dict[str, str] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key or not key.replace("_", "").isalnum() or not key.isascii():
            raise ValueError(f"--set {item!r}: expected KEY=VALUE with KEY a setting name")
        out[key.lower()] = value
    return out


def kinds_for(option: str) -> list[Kind]:
    return list(GPU_KINDS) if option == "all" else [option]  # type: ignore[list-item]


def run(opts: VerifyOptions, stdout: IO[str] = sys.stdout) -> int:
    opts.out.mkdir(parents=True, exist_ok=True)
    rendered: list[Path] = []

    def context() -> Path:
        if not rendered:
            rendered.append(context_dir(opts))
        return rendered[0]

    reports = [verify_kind(kind, opts, context) for kind in opts.kinds]
    data = report.report_dict(reports, opts)
    json_path, md_path = report.write_report(data, opts.out)
    print(
        "",
        report.render_markdown(data),
        f"report: {json_path} and {md_path}",
        sep="\n",
        file=stdout,
    )
    return 0 if data["passed"] else 1


def main(args: argparse.Namespace) -> int:
    try:
        overrides = parse_set(args.set)
    except ValueError as exc:
        print(f"refused: {exc}", file=sys.stderr)
        return 2
    if args.engine_dir is not None and not (args.engine_dir / "config.json").is_file():
        print(f"refused: --engine-dir {args.engine_dir}: no config.json there", file=sys.stderr)
        return 2
    opts = VerifyOptions(
        kinds=kinds_for(args.kind),
        out=args.out,
        engine_dir=args.engine_dir,
        gpu=args.gpu,
        examples_dir=args.examples_dir,
        overrides=overrides,
        ready_timeout=args.ready_timeout,
        bench_prompts=args.bench_prompts,
        long_tokens=args.long_tokens,
        drain_tokens=args.drain_tokens,
        app_dir=args.app_dir,
        packages_dir=args.packages_dir,
    )
    if (opts.app_dir is None) != (opts.packages_dir is None):
        print("refused: --app-dir and --packages-dir go together", file=sys.stderr)
        return 2
    if missing := missing_server_packages(opts):
        print(
            f"refused: the server's packages are not installed here ({', '.join(missing)}): "
            "run verify-gpu in the verify image (docker run --rm --gpus all --ipc=host "
            "IMAGE:TAG-verify; `python build.py image` builds it), or after `make venv` "
            "for --kind pytorch",
            file=sys.stderr,
        )
        return 2
    return run(opts)


def missing_server_packages(opts: VerifyOptions) -> list[str]:
    """What the server (and, without the image's own /app, truss's renderer) imports and
    this Python lacks: a bare release container has TensorRT-LLM but not these."""
    import importlib.util

    needed = ["fastapi", "uvicorn", "prometheus_client", "msgspec"]
    needed += [] if opts.app_dir is not None else ["truss"]
    return [name for name in needed if importlib.util.find_spec(name) is None]


def _positive(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError("must be 0 or more")
    return value


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "verify-gpu",
        help="Check the whole serving path on this GPU: tiny engine, real server, checks, report.",
        description=(
            "Build a tiny random-weight Mistral-shaped engine (no download), serve it with the "
            "real Truss server, run the end-to-end checks and a short benchmark, and write "
            "report.json + report.md. Run inside the TensorRT-LLM release image on a GPU. "
            "Exit 1 if any check failed."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    _add_what_arguments(p)
    _add_run_arguments(p)
    p.set_defaults(func=main)


def _add_what_arguments(p: argparse.ArgumentParser) -> None:
    from mistral_build.engine import DEFAULT_EXAMPLES_DIR
    from mistral_build.gpu import TARGETS

    p.add_argument(
        "--kind",
        choices=KIND_CHOICES,
        default="all",
        help="tensorrt_llm: TensorRT engine; trtllm_pytorch: TensorRT-LLM's PyTorch backend "
        "(no build); all: both; pytorch: the dev model on our PyTorch engine (CPU).",
    )
    p.add_argument(
        "--engine-dir", type=Path, help="Serve this engine instead of building the tiny one."
    )
    p.add_argument(
        "--gpu", choices=sorted(TARGETS), help="Build target (default: this machine's GPU)."
    )
    p.add_argument(
        "--examples-dir", default=DEFAULT_EXAMPLES_DIR, help="TensorRT-LLM's example scripts."
    )
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="Report, logs, artifacts.")
    p.add_argument(
        "--app-dir",
        type=Path,
        default=_env_path(VERIFY_APP_ENV),
        help=f"Serve from this server folder as it is (the verify image sets {VERIFY_APP_ENV}: "
        "its own /app); default: render the Truss build context with truss.",
    )
    p.add_argument(
        "--packages-dir",
        type=Path,
        default=_env_path(VERIFY_PACKAGES_ENV),
        help=f"With --app-dir: the packages folder ({VERIFY_PACKAGES_ENV}; the image's /packages).",
    )
    p.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="Override a server setting, e.g. --set kv_cache_free_gpu_memory_fraction=0.5.",
    )


def _env_path(name: str) -> Path | None:
    value = os.environ.get(name)
    return Path(value) if value else None


def _add_run_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ready-timeout", type=float, default=900.0, help="Seconds to load.")
    p.add_argument(
        "--bench-prompts",
        type=_positive,
        default=32,
        help="Requests per benchmark point (0: none).",
    )
    p.add_argument(
        "--long-tokens",
        type=_positive,
        default=4000,
        help="Length of the streams the abort and 503 checks hold open.",
    )
    p.add_argument(
        "--drain-tokens", type=_positive, default=512, help="Length of the drained streams."
    )
