"""engines/pytorch/weights.py: shards copied into preallocated tensors through small reused
buffers give exactly safetensors' own tensors (pieces crossing buffer boundaries, several
readers, empty tensors, dtype conversion); malformed headers are a ValueError naming the
file, never anything else."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file

from mistral_gpu_fallback.static.weights import copy_shards, parse_header, read_header


def shards(root: Path) -> list[Path]:
    g = torch.Generator().manual_seed(0)
    save_file(
        {
            "a.weight": torch.randn(37, 11, generator=g).to(torch.bfloat16),
            "b.bias": torch.randn(5, generator=g),
            "empty": torch.zeros(0),
            "c.weight": torch.randn(3, 129, generator=g).to(torch.float16),
        },
        root / "one.safetensors",
    )
    save_file(
        {"d.table": torch.randint(0, 1000, (17, 3), generator=g), "e.flag": torch.tensor([True])},
        root / "two.safetensors",
    )
    return sorted(root.glob("*.safetensors"))


def empty_like_files(files: list[Path], convert: dict[str, torch.dtype]) -> dict:
    out = {}
    for f in files:
        for name, t in load_file(f).items():
            out[name] = torch.full(t.shape, 7, dtype=convert.get(name, t.dtype))
    return out


@pytest.mark.parametrize("chunk", [7, 64, 1000, 2**20])
@pytest.mark.parametrize("readers", [1, 2, 3])
def test_every_tensor_arrives_whole_across_buffer_boundaries(
    tmp_path: Path, chunk: int, readers: int
) -> None:
    files = shards(tmp_path)
    convert = {"b.bias": torch.bfloat16}  # stored float32, wanted bf16: converted
    targets = empty_like_files(files, convert)
    copy_shards({f: read_header(f) for f in files}, targets, chunk_bytes=chunk, readers=readers)
    for f in files:
        for name, t in load_file(f).items():
            assert torch.equal(targets[name], t.to(targets[name].dtype)), name


def test_a_tensor_the_model_lacks_is_refused(tmp_path: Path) -> None:
    files = shards(tmp_path)
    targets = empty_like_files(files, {})
    del targets["d.table"]
    with pytest.raises(ValueError, match="two.safetensors: tensor 'd.table' is not in the model"):
        copy_shards({f: read_header(f) for f in files}, targets)


def test_header_offsets_are_absolute_and_sorted(tmp_path: Path) -> None:
    (f,) = shards(tmp_path)[:1]
    entries = read_header(f)
    assert [e.begin for e in entries] == sorted(e.begin for e in entries)
    raw = f.read_bytes()
    for e in entries:
        t = load_file(f)[e.name]
        assert raw[e.begin : e.end] == t.contiguous().view(-1).view(torch.uint8).numpy().tobytes()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "shorter than a safetensors header"),
        ((10**9).to_bytes(8, "little") + b"{}", "does not fit the file"),
        ((2).to_bytes(8, "little") + b"[]", "not a JSON object"),
        ((3).to_bytes(8, "little") + b"{x}", "not JSON"),
    ],
)
def test_malformed_files_are_refused_by_name(tmp_path: Path, content: bytes, message: str) -> None:
    f = tmp_path / "bad.safetensors"
    f.write_bytes(content)
    with pytest.raises(ValueError, match=f"bad.safetensors: .*{message}"):
        read_header(f)


specs = st.one_of(
    st.none(),
    st.integers(),
    st.text(max_size=5),
    st.fixed_dictionaries(
        {
            "dtype": st.one_of(st.sampled_from(["BF16", "F32", "U8"]), st.integers()),
            "shape": st.one_of(st.lists(st.integers(-2, 50), max_size=3), st.text(max_size=3)),
            "data_offsets": st.one_of(
                st.lists(st.integers(-5, 200), min_size=0, max_size=3), st.none()
            ),
        }
    ),
)


@settings(max_examples=300, deadline=None)
@given(header=st.dictionaries(st.text(max_size=8), specs, max_size=4), data=st.integers(0, 150))
def test_any_header_parses_in_bounds_or_is_a_value_error(header: dict, data: int) -> None:
    raw = json.dumps(header).encode()
    try:
        entries = parse_header(raw, data, "x.safetensors")
    except ValueError as exc:
        assert str(exc).startswith("x.safetensors: ")
        return
    for e in entries:
        assert 8 + len(raw) <= e.begin <= e.end <= 8 + len(raw) + data


@settings(max_examples=300, deadline=None)
@given(raw=st.binary(max_size=64))
def test_any_bytes_parse_or_are_a_value_error(raw: bytes) -> None:
    try:
        entries = parse_header(raw, 0, "x.safetensors")
    except ValueError as exc:
        assert str(exc).startswith("x.safetensors: ")
        return
    assert all(e.begin == e.end for e in entries)  # no data section: only empty tensors
