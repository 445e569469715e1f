"""`make test-stress`: the end-to-end suite, several times in a row, while CPU hogs keep
every core busy (what a loaded CI machine or a noisy neighbour does to the server).

Prints one line per run and exits non-zero if any run failed.
"""

from __future__ import annotations

import argparse
import multiprocessing
import subprocess
import sys
import time


def hog() -> None:
    while True:
        pass


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--hogs", type=int, default=multiprocessing.cpu_count())
    parser.add_argument(
        "pytest_args", nargs="*", default=["tests/e2e", "-q", "-p", "no:cacheprovider"]
    )
    args = parser.parse_args()
    hogs = [multiprocessing.Process(target=hog, daemon=True) for _ in range(args.hogs)]
    for p in hogs:
        p.start()
    failed = 0
    try:
        for run in range(1, args.runs + 1):
            started = time.monotonic()
            status = subprocess.call([sys.executable, "-m", "pytest", *args.pytest_args])
            print(
                f"stress run {run}/{args.runs} with {args.hogs} CPU hogs: "
                f"{'passed' if status == 0 else f'FAILED ({status})'} in {time.monotonic() - started:.0f}s",
                flush=True,
            )
            failed += status != 0
    finally:
        for p in hogs:
            p.terminate()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
