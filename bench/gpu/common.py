"""What every part of the GPU benchmark shares: where its rows go, its deadline, the page
cache it may drop, and the prompts and sweep levels of a figure."""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from client.datasets import token_id_prompts
from client.metrics import summary_row

# Set once by the command line (cli.main) for the whole invocation.
OUT: Path | None = None  # every row is appended here as a JSON line (and printed)
DEADLINE = float("inf")  # unix time after which sweeps are skipped
DROP_CACHE: bool | str = False  # True: the whole page cache; "artifact": its files only
ARTIFACT = ""

LONG_INPUT = 1024  # --long's shape: 1024 in / 256 out


def emit(**row: object) -> None:
    line = json.dumps(row)
    print(line, flush=True)
    if OUT:
        with OUT.open("a") as f:
            f.write(line + "\n")


def time_left() -> float:
    return DEADLINE - time.time()


def id_prompts(n: int, length: int, seed: int = 0) -> list[list[int]]:
    return [item.prompt for item in token_id_prompts(n, length, seed=seed)]


def level_row(kind: str, concurrency: int, in_len: int, out_len: int, metrics: dict) -> dict:
    """One sweep point's figures, computed by client.metrics like every other benchmark."""
    return {
        "kind": kind,
        "concurrency": concurrency,
        "input_len": in_len,
        "output_len": out_len,
        **summary_row(metrics),
    }


def levels_for(args: argparse.Namespace, in_len: int) -> list[int]:
    """The concurrency levels of a shape: --long-concurrency for --long's, if given."""
    if in_len == LONG_INPUT and args.long_concurrency:
        return list(args.long_concurrency)
    return list(args.concurrency)


def drop_page_cache() -> bool:
    """Make 'from local disk' mean the disk, not the page cache (root on the GPU machine,
    with --drop-page-cache or --evict-artifact only: never on a shared machine)."""
    if not DROP_CACHE:
        return False
    try:
        os.sync()
        if DROP_CACHE == "artifact":  # only the artifact's pages: libraries stay cached
            for path in Path(ARTIFACT).iterdir():
                if path.is_file():
                    fd = os.open(path, os.O_RDONLY)
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                    os.close(fd)
            return True
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False
