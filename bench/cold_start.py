"""Where a cold start's seconds go: a fresh interpreter loads the PyTorch engine the way
the server's engine does (factory defaults), timing each phase from process start.

    python bench/cold_start.py ARTIFACT --evict all|artifact|none [--out results.jsonl]

--evict none: nothing evicted (what is cached stays). --evict all: `sync; echo 3 > /proc/sys/vm/drop_caches` first (root only: nothing is
cached, the Python packages and CUDA libraries included). --evict artifact: only the
artifact's pages leave the page cache (posix_fadvise DONTNEED), as on a node that has
run the image before. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "mistral-trt-truss/packages"), str(ROOT)]  # the serving code


def evict(artifact: Path, what: str) -> None:
    os.sync()
    if what == "all":
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return
    for path in artifact.iterdir():
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def child(artifact: str, t0: float, max_batch_size: int, max_seq_len: int, profile: int) -> None:
    marks = {}

    def mark(name: str) -> None:
        marks[name] = round(time.time() - t0, 2)

    mark("interpreter")
    stamp_engine_logs(t0)
    import torch

    mark("import torch")
    if torch.cuda.is_available():
        torch.zeros(1, device="cuda")
        torch.cuda.synchronize()
        mark("CUDA context")
    import transformers  # noqa: F401

    from mistral_serving.engines.factory import keep_compiled_kernels, start_torch_engine
    from mistral_serving.settings import Settings

    mark("import transformers + engine code")
    settings = Settings(artifact=artifact, max_batch_size=max_batch_size, max_seq_len=max_seq_len)
    keep_compiled_kernels(settings.cache_path)  # as the server's start_engine does
    if profile:  # where the load's seconds go, function by function (main thread only)
        import cProfile
        import pstats

        prof = cProfile.Profile()
        engine = prof.runcall(start_torch_engine, Path(artifact), settings, 2)
        mark("engine loaded")
        print_profile(pstats.Stats(prof), profile)
    else:
        engine = start_torch_engine(Path(artifact), settings, 2)
        mark("engine loaded")
    import asyncio

    from mistral_serving.engines.base import SamplingOptions

    async def first() -> None:
        async for _ in engine.generate("first", [1, 2, 3, 4], SamplingOptions(max_new_tokens=2)):
            pass

    asyncio.run(first())
    mark("first request done")
    print(json.dumps({"engine": type(engine).__name__, "marks_s": marks}), flush=True)
    engine.shutdown()


def stamp_engine_logs(t0: float) -> None:
    """The engine's own log lines on stderr, stamped with seconds since the process started."""
    import logging

    class Stamped(logging.Formatter):
        def format(self, record: logging.LogRecord) -> str:
            return f"[{time.time() - t0:6.2f} s] " + super().format(record)

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(Stamped("%(message)s"))
    logging.basicConfig(level=logging.INFO, handlers=[handler])


def print_profile(stats, top_n: int) -> None:
    """The `top_n` functions of the load by cumulative time, on stderr."""
    stats.sort_stats("cumulative")
    # The import machinery's frames repeat every import below them: left out.
    top = [f for f in stats.fcn_list if not f[0].startswith("<frozen") and f[0] != "~"]  # type: ignore[attr-defined]
    for func in top[:top_n]:
        cc, nc, tt, ct, _ = stats.stats[func]  # type: ignore[attr-defined]
        file, line, name = func
        print(
            f"[prof] {ct:7.2f} s cum {tt:6.2f} s self {nc:7d} x {name} {file}:{line}",
            file=sys.stderr,
        )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("artifact")
    ap.add_argument("--evict", choices=["all", "artifact", "none"], default="artifact")
    ap.add_argument("--max-batch-size", type=int, default=256)
    ap.add_argument("--max-seq-len", type=int, default=2048)
    ap.add_argument("--out")
    ap.add_argument("--profile", type=int, default=0, help="cProfile the load: top N functions")
    ap.add_argument("--child", type=float, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        child(args.artifact, args.child, args.max_batch_size, args.max_seq_len, args.profile)
        return 0
    # Compiled Triton kernels already there (the fused ops' start check reads them instead
    # of compiling): the start this row times depends on it.
    from mistral_serving.engines.factory import compiled_kernels_dir
    from mistral_serving.settings import Settings

    triton = compiled_kernels_dir(Settings(artifact=args.artifact).cache_path)
    kept = sum(len(files) for _, _, files in os.walk(triton))
    if args.evict != "none":
        evict(Path(args.artifact), args.evict)
    t0 = time.time()
    out = subprocess.run(
        [
            sys.executable,
            __file__,
            args.artifact,
            "--child",
            str(t0),
            "--max-batch-size",
            str(args.max_batch_size),
            "--max-seq-len",
            str(args.max_seq_len),
            "--profile",
            str(args.profile),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    row = json.loads(lines[-1]) if lines else {"error": out.stderr[-1500:]}
    row["log"] = [line for line in out.stderr.splitlines() if line.startswith("[")][
        -(40 + args.profile) :
    ]
    row = {"figure": "cold_start_phases", "evicted": args.evict, "triton_cache_files": kept, **row}
    print(json.dumps(row), flush=True)
    if args.out:
        with open(args.out, "a") as f:
            f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
