"""Where a warm engine start's seconds go: `start_torch_engine` under cProfile, and which
heavy modules the load imports.

    python bench/start_profile.py ARTIFACT [--device cuda] [--kv-cache static] [--top 35]

Imports torch and transformers and sets up the device first (not counted), then loads the
engine the way the server does. Prints the load time, the modules it imported (how many,
and whether torch._dynamo, sympy, scikit-learn or transformers' model classes are among
them: the import chain that took most of a warm start), then cProfile's top functions by
cumulative time. docs/perf/history/round-03.md, section 5.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "mistral-trt-truss/packages"), str(ROOT)]

HEAVY = (
    "torch._dynamo",
    "sympy",
    "sklearn",
    "torch.distributed.tensor",
    "transformers.generation.utils",
    "transformers.models.mistral.modeling_mistral",
    "transformers.models.llama.modeling_llama",
)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("artifact")
    ap.add_argument("--device", default="cuda", choices=["cpu", "cuda"])
    ap.add_argument("--kv-cache", default="static", choices=["auto", "static", "dynamic"])
    ap.add_argument("--max-batch-size", type=int, default=256)
    ap.add_argument("--max-seq-len", type=int, default=2048)
    ap.add_argument("--top", type=int, default=35)
    args = ap.parse_args()

    import torch
    import transformers  # noqa: F401 - imported before the clock, as the server has it

    if args.device == "cuda":
        torch.zeros(1, device="cuda")
        torch.cuda.synchronize()
    from mistral_serving.engines.factory import start_torch_engine
    from mistral_serving.settings import Settings

    settings = Settings(
        artifact=args.artifact,
        device=args.device,
        pytorch_kv_cache=args.kv_cache,
        max_batch_size=args.max_batch_size,
        max_seq_len=args.max_seq_len,
    )
    before = set(sys.modules)
    profile = cProfile.Profile()
    started = time.perf_counter()
    profile.enable()
    engine = start_torch_engine(Path(args.artifact), settings, 2)
    profile.disable()
    seconds = time.perf_counter() - started
    new = set(sys.modules) - before
    print(f"start_torch_engine: {seconds:.2f} s, {type(engine).__name__}")
    print(f"modules imported by the load: {len(new)}; heavy: {sorted(new & set(HEAVY))}")
    out = io.StringIO()
    pstats.Stats(profile, stream=out).sort_stats("cumulative").print_stats(args.top)
    print(out.getvalue())
    engine.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
