"""Copy safetensors shards into preallocated tensors with large sequential reads.

`safe_open(...).get_tensor()` copies each tensor out of a memory map (page faults, one
tensor at a time) into a new CPU tensor, which is then copied again to the GPU from
pageable memory: slow even with every page cached (docs/perf/history/round-03.md).
Here each shard is read front to back with `preadv` into two pinned buffers per reader
thread, and every piece of a tensor in a buffer is copied asynchronously into its place
in the target (the GPU tensor's own bytes) while the next piece is read. Tensors whose
file dtype differs from the target's are converted the slow way (`get_tensor`).

The header is parsed here (8-byte little-endian length, then JSON: name -> dtype, shape,
data_offsets), and anything out of bounds or malformed is a `ValueError` naming the file.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import threading
from dataclasses import dataclass
from pathlib import Path

import torch

CHUNK_BYTES = 64 * 2**20
READERS = 4
MAX_HEADER_BYTES = 100 * 2**20  # safetensors' own limit
DTYPES = {
    "BF16": torch.bfloat16,
    "F16": torch.float16,
    "F32": torch.float32,
    "F64": torch.float64,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


@dataclass(frozen=True)
class Entry:
    """One tensor of a shard: where its bytes are in the file (absolute offsets)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


def read_header(path: Path) -> list[Entry]:
    """The tensors of one safetensors file, by file offset; ValueError if malformed."""
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ValueError(f"{path.name}: shorter than a safetensors header")
        n = int.from_bytes(head, "little")
        if n > MAX_HEADER_BYTES or 8 + n > size:
            raise ValueError(f"{path.name}: header length {n} does not fit the file")
        raw = f.read(n)
    return parse_header(raw, size - 8 - n, path.name)


def parse_header(raw: bytes, data_bytes: int, where: str) -> list[Entry]:
    """Entries from the JSON header of a file whose data section is `data_bytes` long."""
    try:
        header = json.loads(raw)
    except (ValueError, RecursionError):  # bad UTF-8 or JSON; absurdly deep nesting
        raise ValueError(f"{where}: the header is not JSON") from None
    if not isinstance(header, dict):
        raise ValueError(f"{where}: the header is not a JSON object")
    start = 8 + len(raw)
    entries = []
    for name, spec in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (begin, end) = spec["dtype"], spec["shape"], spec["data_offsets"]
        except (TypeError, KeyError, ValueError):
            raise ValueError(f"{where}: tensor {name[:80]!r} has no dtype/shape/offsets") from None
        ints = [*shape, begin, end]
        if (
            not isinstance(dtype, str)
            or not isinstance(shape, list)
            or not all(type(v) is int and v >= 0 for v in ints)
            or not begin <= end <= data_bytes
        ):
            raise ValueError(f"{where}: tensor {name[:80]!r} has bad dtype, shape or offsets")
        entries.append(Entry(name, dtype, tuple(shape), start + begin, start + end))
    return sorted(entries, key=lambda e: e.begin)


def copies_directly(entry: Entry, target: torch.Tensor) -> bool:
    """Its file bytes are the target's bytes: same dtype and shape, contiguous target."""
    return (
        DTYPES.get(entry.dtype) == target.dtype
        and tuple(target.shape) == entry.shape
        and target.is_contiguous()
        and target.numel() * target.element_size() == entry.end - entry.begin
    )


def copy_shards(
    shards: dict[Path, list[Entry]],
    targets: dict[str, torch.Tensor],
    chunk_bytes: int = CHUNK_BYTES,
    readers: int = READERS,
) -> None:
    """Fill `targets` (name -> preallocated tensor, all on one device) from the shards
    (path -> its `read_header` entries, read once by the caller). Every tensor of the
    shards must have a target of its shape (the caller checks)."""
    work: queue.SimpleQueue[tuple[Path, list[Entry]]] = queue.SimpleQueue()
    for shard in shards.items():
        work.put(shard)
    errors: list[BaseException] = []

    def reader() -> None:
        try:
            with torch.no_grad():
                _Reader(targets, chunk_bytes).drain(work)
        except BaseException as exc:  # noqa: BLE001 - re-raised on the calling thread
            errors.append(exc)

    threads = [
        threading.Thread(target=reader, name=f"load-shard-{i}")
        for i in range(max(1, min(readers, len(shards))))
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


class _Reader:
    """One reader thread: its buffers, and on a GPU its own stream and buffer events."""

    def __init__(self, targets: dict[str, torch.Tensor], chunk_bytes: int) -> None:
        self.targets = targets
        device = next(iter(targets.values())).device if targets else torch.device("cpu")
        self.cuda = device.type == "cuda"
        self.buffers = [
            torch.empty(chunk_bytes, dtype=torch.uint8, pin_memory=self.cuda) for _ in range(2)
        ]
        self.views = [b.numpy().data for b in self.buffers]  # the buffers' own bytes
        # torch.cuda.Stream/Event's constructors are unannotated in torch's own code.
        self.stream = torch.cuda.Stream(device) if self.cuda else None  # type: ignore[no-untyped-call]
        self.done: list[torch.cuda.Event | None] = [None, None]  # last copy out of buffer i

    def drain(self, work: queue.SimpleQueue[tuple[Path, list[Entry]]]) -> None:
        while True:
            try:
                shard, entries = work.get_nowait()
            except queue.Empty:
                break
            self.copy(shard, entries)
        if self.stream is not None:
            self.stream.synchronize()

    def copy(self, shard: Path, entries: list[Entry]) -> None:
        unknown = [e.name for e in entries if e.name not in self.targets]
        if unknown:
            raise ValueError(f"{shard.name}: tensor {unknown[0][:80]!r} is not in the model")
        direct: list[Entry] = []
        converted: list[Entry] = []
        for e in entries:
            (direct if copies_directly(e, self.targets[e.name]) else converted).append(e)
        if direct:
            fd = os.open(shard, os.O_RDONLY)
            try:
                self._stream_file(fd, shard, direct)
            finally:
                os.close(fd)
        if converted:  # another dtype: safetensors converts (rare: a float32 checkpoint)
            from safetensors import safe_open

            with safe_open(str(shard), framework="pt") as f:
                for e in converted:
                    self.targets[e.name].copy_(f.get_tensor(e.name))

    def _stream_file(self, fd: int, shard: Path, entries: list[Entry]) -> None:
        chunk = len(self.views[0])
        offset, end = entries[0].begin, max(e.end for e in entries)
        first = 0  # entries before this one are copied completely
        i = 0
        while offset < end:
            length = min(chunk, end - offset)
            slot = i % 2
            previous = self.done[slot]
            if previous is not None:
                previous.synchronize()  # its previous copies have left the buffer
            _read_fully(fd, self.views[slot][:length], offset, shard)
            buffer = self.buffers[slot]
            stop = offset + length
            with torch.cuda.stream(self.stream) if self.cuda else contextlib.nullcontext():
                for e in entries[first:]:
                    if e.begin >= stop:
                        break
                    lo, hi = max(e.begin, offset), min(e.end, stop)
                    if lo < hi:
                        dst = self.targets[e.name].view(-1).view(torch.uint8)
                        dst[lo - e.begin : hi - e.begin].copy_(
                            buffer[lo - offset : hi - offset], non_blocking=self.cuda
                        )
                if self.cuda:
                    event = torch.cuda.Event()  # type: ignore[no-untyped-call]
                    event.record(self.stream)
                    self.done[slot] = event
            while first < len(entries) and entries[first].end <= stop:
                first += 1
            offset, i = stop, i + 1


def _read_fully(fd: int, view: memoryview, offset: int, shard: Path) -> None:
    got = 0
    while got < len(view):
        n = os.preadv(fd, [view[got:]], offset + got)
        if n == 0:
            raise ValueError(f"{shard.name}: ends before its tensors' data (truncated file?)")
        got += n
