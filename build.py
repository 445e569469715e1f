#!/usr/bin/env python3
"""Build everything the service needs: `python build.py --help`.

The implementation lives in `mistral-trt-truss/packages/mistral_build/` so that the same
code also runs inside the TensorRT-LLM release image, where engines must be built.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "mistral-trt-truss" / "packages"))

from mistral_build.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
