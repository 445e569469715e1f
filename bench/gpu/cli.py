"""`bench/gpu_bench.py STEP DIR [APP] [options]`: the subcommands and their options."""

from __future__ import annotations

import argparse
from pathlib import Path

from bench.gpu import common

STEPS = ("make-artifact", "prepare-verify", "engine", "service", "peer")


def parser(description: str) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("step", choices=STEPS)
    ap.add_argument("dir")
    ap.add_argument("app", nargs="?")
    ap.add_argument("--tokenizer-from", default=".cache/dev-model")
    ap.add_argument("--tiny", action="store_true", help="a tiny model (CPU check of the script)")
    ap.add_argument("--quick", action="store_true", help="fewer levels (CPU check)")
    ap.add_argument("--max-batch-size", type=int, default=256)
    ap.add_argument("--max-seq-len", type=int, default=2048)
    ap.add_argument(
        "--concurrency", type=int, nargs="*", default=[1, 16, 64, 256], help="none: no sweep"
    )
    ap.add_argument("--long", action="store_true", help="also 1024 in / 256 out")
    ap.add_argument(
        "--long-concurrency", type=int, nargs="+", help="--long's levels (default: --concurrency)"
    )
    ap.add_argument("--engine", default="pytorch")
    ap.add_argument("--port", type=int, default=8089)
    ap.add_argument("--log")
    ap.add_argument("--out")
    ap.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="engine/service: a setting for the engine or the server (MTT_KEY=VALUE)",
    )
    ap.add_argument(
        "--verify",
        metavar="CACHE_DIR",
        help="prepare-verify/service: verify_hashes on, markers under CACHE_DIR",
    )
    ap.add_argument(
        "--drop-page-cache",
        action="store_true",
        help="drop the OS page cache before a cold load (a machine of its own, as root)",
    )
    ap.add_argument(
        "--evict-artifact",
        action="store_true",
        help="before a cold load, evict only the artifact's pages (libraries stay cached)",
    )
    ap.add_argument("--deadline", type=float, help="unix time after which sweeps are skipped")
    engine_options(ap)
    service_options(ap)
    return ap


def engine_options(ap: argparse.ArgumentParser) -> None:
    ap.add_argument(
        "--skip-variants",
        action="store_true",
        help="engine: only the fast path (no eager / dynamic / HF generate runs)",
    )
    ap.add_argument("--repeat", type=int, default=1, help="engine: sweeps of the same engine")
    ap.add_argument("--gil-ab", action="store_true", help="engine: GIL switch 5 ms vs setting")
    ap.add_argument("--compare-loaders", action="store_true", help="engine: HF loader first")
    ap.add_argument("--correctness", action="store_true", help="engine: the fp32 check")
    ap.add_argument("--disk-test", action="store_true", help="engine: time cold disk reads first")


def service_options(ap: argparse.ArgumentParser) -> None:
    ap.add_argument(
        "--client",
        choices=["raw", "httpx"],
        default="raw",
        help="service: the transport of `python -m client bench` (raw: lean HTTP/1.1)",
    )
    ap.add_argument("--client-procs", type=int, default=4)
    ap.add_argument("--guidellm", action="store_true", help="service: guidellm at each level too")
    ap.add_argument("--aiperf", action="store_true", help="service: AIPerf at each level too")
    ap.add_argument(
        "--aiperf-token-ids",
        action="store_true",
        help="service: AIPerf sends our client's token-id bodies, not its synthetic text",
    )
    ap.add_argument(
        "--packages",
        help="service: the serving packages the server imports (default: this repo's; "
        "another checkout's to compare two versions under one benchmark)",
    )
    ap.add_argument(
        "--temperature",
        type=float,
        help="service: sample at this temperature, both clients (unset: greedy)",
    )
    ap.add_argument("--guided", type=int, default=0, help="service: N constrained vs N plain")
    ap.add_argument("--guided-rounds", type=int, default=2)
    ap.add_argument("--guided-max-tokens", type=int, default=128)
    ap.add_argument(
        "--suite",
        action="store_true",
        help="service: the schema suite (bench/schemas/) at --suite-levels, with the engine's "
        "structured-output timers on (GUIDED_PROFILE_OUT)",
    )
    ap.add_argument("--suite-levels", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--suite-modes", nargs="+", default=["plain", "schema", "tool"])
    ap.add_argument("--suite-schemas", type=int, default=0, help="the first N (0: all)")
    ap.add_argument("--suite-skip", type=int, default=0, help="start after the first N")
    ap.add_argument("--suite-aiperf", type=int, default=4, help="AIPerf for the first N schemas")
    ap.add_argument("--suite-max-tokens", type=int, default=128)
    ap.add_argument(
        "--text-levels",
        type=int,
        nargs="+",
        help="service/peer: concurrency levels with text prompts (the peer comparison)",
    )
    ap.add_argument(
        "--peer-flags", default="", help="peer: more `transformers serve` flags, one string"
    )
    ap.add_argument("--start-only", action="store_true", help="service: time the start, stop")
    ap.add_argument(
        "--burst",
        type=int,
        default=0,
        help="service: the server under bench/burst_probe.py, then N bursts of 16 request "
        "starts after the levels (bench/burst_ttft.py: where the time to first token goes)",
    )


def main(description: str, argv: list[str] | None = None) -> int:
    args = parser(description).parse_args(argv)
    common.OUT = Path(args.out) if args.out else None
    common.DEADLINE = args.deadline or float("inf")
    common.DROP_CACHE = "artifact" if args.evict_artifact else args.drop_page_cache
    common.ARTIFACT = args.dir
    # Each step imports only what it needs (torch, transformers or neither).
    if args.step == "make-artifact":
        from bench.gpu.artifact import make_artifact as step
    elif args.step == "prepare-verify":
        from bench.gpu.artifact import prepare_verify as step
    elif args.step == "engine":
        from bench.gpu.inprocess import engine_bench as step
    elif args.step == "service":
        from bench.gpu.server import service_bench as step
    else:
        from bench.gpu.peer import peer_bench as step
    step(args)
    return 0
