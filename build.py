#!/usr/bin/env python3
"""Build everything the service needs: `python build.py --help`.

The implementation lives in `mistral_build/` beside this file. It is build tooling, so
it stays out of the serving image; engines are built from a checkout of this repository
inside NVIDIA's TensorRT-LLM release container (docs/tensorrt-llm.md).
"""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
sys.path[:0] = [str(ROOT), str(ROOT / "mistral-trt-truss" / "packages")]

MISSING = (
    "error: {name} is not installed here. build.py runs where the project's packages are: "
    "`make venv` (its .venv), or, for verify-gpu on a GPU, the verify image "
    "(docker run --rm --gpus all --ipc=host IMAGE:TAG-verify; docs/verify-on-gpu.md)"
)

if __name__ == "__main__":
    try:
        from mistral_build.cli import main

        code = main()
    except ModuleNotFoundError as exc:  # e.g. a bare TensorRT-LLM release container
        print(MISSING.format(name=exc.name), file=sys.stderr)
        code = 2
    sys.exit(code)
