"""The start-up phases that are ours when a TensorRT-LLM kind serves (no GPU, no
TensorRT-LLM needed): each in a fresh interpreter, `--repeat` times (the median and the
range printed):

1. imports: the serving core and the Truss server stack the launcher loads before the
   engine (`mistral_serving.http.server`, the TensorRT-LLM engine module without
   tensorrt_llm itself, `truss_server` from the app folder), and the slowest modules;
2. artifact verification: the manifest's size check of the dev model, and sha256's
   throughput over a `--hash-mb` file in the page cache (`manifest.sha256_file`, what
   `verify_hashes` runs once per download), extrapolated to `--artifact-gb` (a 7B bf16
   engine: 14.5 GB); from a cold disk the read bounds it instead (disk GB/s);
3. the tokenizer: `load_tokenizer` of the dev model (Mistral-7B's tokenizer files).

    python bench/trt_start_phases.py --context .benchcarry/ctx [--repeat 3] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ROOT / "mistral-trt-truss" / "packages"

IMPORTS = """
import time
t0 = time.perf_counter()
import mistral_serving.http.server
t1 = time.perf_counter()
import mistral_serving.engines.trtllm.engine
t2 = time.perf_counter()
import truss_server
t3 = time.perf_counter()
print({"serving_core_s": t1 - t0, "trtllm_engine_module_s": t2 - t1, "truss_server_s": t3 - t2,
       "imports_s": t3 - t0})
"""
VERIFY = """
import time
from pathlib import Path
from mistral_serving.artifacts import manifest as m
t0 = time.perf_counter()
d = Path(DIR)
man = m.read_manifest(d)
t1 = time.perf_counter()
m.verify_files(d, man, hashes=False)
t2 = time.perf_counter()
m.sha256_file(Path(BIG))  # once to warm the page cache and the code
t3 = time.perf_counter()
m.sha256_file(Path(BIG))
t4 = time.perf_counter()
print({"manifest_load_s": t1 - t0, "size_check_s": t2 - t1, "hash_s": t4 - t3,
       "hash_gb_s": SIZE / 1e9 / (t4 - t3)})
"""
TOKENIZER = """
import time
from pathlib import Path
t0 = time.perf_counter()
from mistral_serving.text.tokenizer import load_tokenizer
t1 = time.perf_counter()
tok = load_tokenizer(Path(DIR))
t2 = time.perf_counter()
print({"tokenizer_import_s": t1 - t0, "tokenizer_load_s": t2 - t1})
"""


def run(code: str, cwd: Path, env: dict[str, str]) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, check=True
    )
    return dict(eval(done.stdout.strip().splitlines()[-1]))  # noqa: S307 - our own print


def slowest_imports(cwd: Path, env: dict[str, str], n: int = 12) -> list[str]:
    """`python -X importtime`'s top self times of the launcher's imports."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c",
         "import mistral_serving.http.server, truss_server"],
        cwd=cwd, env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    rows = []
    for line in done.stderr.splitlines():
        if line.startswith("import time:") and "|" in line and "self" not in line:
            self_us, _, name = (p.strip() for p in line.removeprefix("import time:").split("|"))
            rows.append((int(self_us), name))
    return [f"{us / 1e3:7.1f} ms  {name}" for us, name in sorted(rows, reverse=True)[:n]]


def main() -> int:
    from mistral_build.dev_model import build_dev_model

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--context", type=Path, default=ROOT / ".benchcarry" / "ctx")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--hash-mb", type=int, default=512)
    ap.add_argument("--artifact-gb", type=float, default=14.5)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    dev = build_dev_model()
    app = (args.context / "app").resolve()
    path = [str(PACKAGES), str(app), os.environ.get("PYTHONPATH", "")]
    env = os.environ | {"PYTHONPATH": os.pathsep.join(p for p in path if p)}
    big = Path(tempfile.mkdtemp()) / "hash.bin"
    size = args.hash_mb * 2**20
    with big.open("wb") as f:
        for _ in range(args.hash_mb):
            f.write(os.urandom(2**20))
    runs: dict[str, list[dict]] = {"imports": [], "verify": [], "tokenizer": []}
    try:
        for _ in range(args.repeat):
            runs["imports"].append(run(IMPORTS, app, env))
            runs["verify"].append(run(
                VERIFY.replace("DIR", repr(str(dev))).replace("BIG", repr(str(big)))
                .replace("SIZE", str(size)), app, env))  # fmt: skip
            runs["tokenizer"].append(run(TOKENIZER.replace("DIR", repr(str(dev))), app, env))
    finally:
        big.unlink()
    out: dict = {"figure": "trt_start_phases", "repeat": args.repeat,
                 "load_average": round(os.getloadavg()[0], 2)}  # fmt: skip
    for rows in runs.values():
        for key in rows[0]:
            values = [r[key] for r in rows]
            out[key] = {"median": round(statistics.median(values), 3),
                        "min": round(min(values), 3), "max": round(max(values), 3)}  # fmt: skip
    gbs = [r["hash_gb_s"] for r in runs["verify"]]
    out["hash_artifact_s"] = {
        "median": round(args.artifact_gb / statistics.median(gbs), 1),
        "min": round(args.artifact_gb / max(gbs), 1),
        "max": round(args.artifact_gb / min(gbs), 1),
    }
    out["artifact_gb"] = args.artifact_gb
    out["slowest_imports"] = slowest_imports(app, env)
    print(json.dumps(out, indent=1))
    if args.out:
        with args.out.open("a") as f:
            f.write(json.dumps(out) + "\n")
    return 0


if __name__ == "__main__":
    sys.path[:0] = [str(ROOT), str(PACKAGES)]
    raise SystemExit(main())
