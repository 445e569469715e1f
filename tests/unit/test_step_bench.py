"""bench/step_bench.py on the CPU with the tiny shape: the engine it times is the static
engine (its own details), and every figure comes out as a JSON line with its keys."""

from __future__ import annotations

import json

import pytest

from bench import step_bench


def test_the_tiny_cpu_run_prints_every_figure(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--tiny", "--device", "cpu", "--rows", "1,3", "--replays", "3"]
    step_bench.main([*args, "--linear-iters", "2"])
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line]
    by_figure: dict[str, list[dict]] = {}
    for row in rows:
        by_figure.setdefault(row["figure"], []).append(row)
    (engine,) = by_figure["engine"]
    assert engine["details"]["kv_cache"] == "static"
    assert engine["details"]["fused_kernels"] == "off: no CUDA device (cpu)"
    steps = by_figure["step"]
    assert [(s["ops"], s["rows"], s["mode"]) for s in steps] == [
        ("off", 1, "eager"),
        ("off", 3, "eager"),
    ]
    assert all(s["ms_p50"] > 0 for s in steps)
    for kernels in by_figure["step_kernels"]:
        cats = kernels["categories"]
        assert set(cats) == set(step_bench.CATEGORIES)
        layers = step_bench.TINY["layers"]
        # Per layer: q/k/v, o, gate/up and down are linear layers; one attention; the
        # norms (one before the first layer, two per layer) and RoPE are labelled.
        assert cats["gemm"]["count"] >= 4 * layers and cats["attention"]["count"] >= layers
        assert cats["norm"]["count"] > 0 and cats["rope"]["count"] > 0
        assert cats["index/copy"]["count"] >= 2 * layers  # the KV writes
    assert [r["weight"] for r in by_figure["linear"]] == [
        "qkv",
        "o_proj",
        "gate_up",
        "down_proj",
        "lm_head",
    ]
