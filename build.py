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

from mistral_build.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
