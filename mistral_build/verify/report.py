"""The report: facts about the machine (GPUs, versions) and the checks of every kind, as
report.json and report.md."""

from __future__ import annotations

import json
import platform
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from mistral_build.verify.config import VerifyOptions
from mistral_build.verify.results import KindReport


def parse_gpu_query(text: str) -> list[dict[str, str]]:
    """`nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total
    --format=csv,noheader` -> one dict per GPU; lines that do not fit are skipped."""
    keys = ("name", "driver_version", "compute_cap", "memory_total")
    gpus = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == len(keys) and parts[0]:
            gpus.append(dict(zip(keys, parts, strict=True)))
    return gpus


def gpu_facts() -> list[dict[str, str]] | str:
    if shutil.which("nvidia-smi") is None:
        return "no nvidia-smi on PATH"
    try:
        out = subprocess.run(
            [
                "nvidia-smi",
                "--query-gpu=name,driver_version,compute_cap,memory.total",
                "--format=csv,noheader",
            ],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return f"nvidia-smi failed: {exc}"
    return parse_gpu_query(out.stdout) or f"nvidia-smi printed nothing usable: {out.stderr[:200]}"


def versions() -> dict[str, str | None]:
    from mistral_build.engine import package_version
    from mistral_build.verify.artifact import installed_trtllm_version

    found: dict[str, str | None] = {"python": platform.python_version()}
    for name in ("tensorrt_llm", "tensorrt", "torch", "transformers", "truss", "mistral_common"):
        found[name] = package_version(name, name.replace("_", "-"))
    if found["tensorrt_llm"] is None and (version := installed_trtllm_version()):
        # No package metadata but importable: a tree on PYTHONPATH (the test double in CI).
        found["tensorrt_llm"] = f"{version} (no package metadata: {trtllm_location()})"
    return found


def trtllm_location() -> str | None:
    import importlib.util

    spec = importlib.util.find_spec("tensorrt_llm")
    return spec.origin if spec else None


def report_dict(reports: list[KindReport], opts: VerifyOptions) -> dict[str, Any]:
    return {
        "passed": bool(reports) and all(r.passed for r in reports),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": shlex.join(sys.argv),
        "warnings": sum(r.warnings for r in reports),
        "kinds": [
            {"kind": r.kind, "passed": r.passed, "warnings": r.warnings}
            | asdict(r)
            | {"checks": [asdict(c) | {"verdict": c.verdict} for c in r.checks]}
            for r in reports
        ],
        "versions": versions(),
        "gpu": gpu_facts(),
        "options": {k: str(v) for k, v in asdict(opts).items()},
    }


def render_markdown(data: dict[str, Any]) -> str:
    lines = [
        f"# verify-gpu: {_headline(data['passed'], data.get('warnings', 0))}",
        "",
        f"`{data['command']}` at {data['created']}",
        "",
    ]
    gpu = data["gpu"]
    if isinstance(gpu, list):
        for g in gpu:
            lines.append(
                f"- GPU: {g['name']}, driver {g['driver_version']}, sm {g['compute_cap']}, "
                f"{g['memory_total']}"
            )
    else:
        lines.append(f"- GPU: {gpu}")
    lines.append(
        "- versions: " + ", ".join(f"{k} {v or 'absent'}" for k, v in data["versions"].items())
    )
    for kind in data["kinds"]:
        lines += _kind_markdown(kind)
    return "\n".join(lines) + "\n"


def _kind_markdown(kind: dict[str, Any]) -> list[str]:
    lines = ["", f"## {kind['kind']}: {_headline(kind['passed'], kind.get('warnings', 0))}", ""]
    build = kind["build"]
    lines.append(
        f"- artifact: {kind['artifact']} ({build.get('status')}"
        + (f": {build['reason']}" if build.get("reason") else "")
        + ")"
    )
    if kind["server"]:
        lines.append(f"- server log: {kind['server']['log']}")
    lines += ["", "| check | result | seconds | detail |", "| --- | --- | --- | --- |"]
    for c in kind["checks"]:
        detail = c["detail"].replace("|", "\\|").replace("\n", " / ")
        verdict = "**FAIL**" if not c["passed"] else "WARN" if c.get("warned") else "pass"
        lines.append(f"| {c['name']} | {verdict} | {c['seconds']} | {detail} |")
    points = (kind.get("bench") or {}).get("points") or []
    if points:
        lines += ["", f"Benchmark: {kind['bench']['tool']}", ""]
        cols = [k for k in points[0] if points[0][k] is not None]
        lines += ["| " + " | ".join(cols) + " |", "|" + " --- |" * len(cols)]
        for p in points:
            lines.append("| " + " | ".join(_fmt(p.get(c)) for c in cols) + " |")
    return lines


def _headline(passed: bool, warnings: int) -> str:
    if not passed:
        return "FAILED"
    return f"PASSED with {warnings} WARN" if warnings else "PASSED"


def _fmt(v: Any) -> str:
    return f"{v:.2f}" if isinstance(v, float) else str(v)


def write_report(data: dict[str, Any], out: Path) -> tuple[Path, Path]:
    out.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out / "report.json", out / "report.md"
    json_path.write_text(json.dumps(data, indent=2, default=str) + "\n")
    md_path.write_text(render_markdown(data))
    return json_path, md_path
