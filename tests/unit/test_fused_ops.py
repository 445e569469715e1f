"""engines/pytorch/fused.py on the CPU: the torch ops (the fallback) compute exactly what
the static engine's forward computed before them, the `fused_kernels` setting, the choice
at start, and the Triton kernels themselves under Triton's interpreter (TRITON_INTERPRET=1
runs them on CPU tensors; tests/gpu/test_fused_kernels.py runs them compiled)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from torch import nn

from mistral_gpu_fallback.static import fused, llama
from mistral_gpu_fallback.static.engine import StaticOptions
from mistral_serving.engines.base import EngineError
from mistral_serving.engines.factory import start_torch_engine
from mistral_serving.settings import Settings, SettingsError

ROOT = Path(__file__).resolve().parents[2]
DTYPES = st.sampled_from([torch.float32, torch.bfloat16])


def before_norm(norm: llama.RMSNorm, x: torch.Tensor) -> torch.Tensor:
    """transformers' RMSNorm formula, as the static forward computed it."""
    dtype = x.dtype
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
    return norm.weight * h.to(dtype)


def before_rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


@hsettings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 5), hidden=st.integers(1, 96), dtype=DTYPES, seed=st.integers(0, 99))
def test_the_torch_norms_equal_the_forward_before(rows, hidden, dtype, seed) -> None:
    torch.manual_seed(seed)
    norm = llama.RMSNorm(hidden, 1e-5, dtype=dtype)
    with torch.no_grad():
        norm.weight.normal_(1.0, 0.2)
    x, delta = torch.randn(rows, hidden).to(dtype), torch.randn(rows, hidden).to(dtype)
    ops = fused.TorchOps()
    assert torch.equal(ops.rms_norm(x, norm), before_norm(norm, x))
    residual, normed = ops.add_rms_norm(x, delta, norm)
    assert torch.equal(residual, x + delta)
    assert torch.equal(normed, before_norm(norm, x + delta))


@hsettings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 3),
    t=st.integers(1, 4),
    kv_heads=st.integers(1, 3),
    group=st.integers(1, 3),
    half=st.integers(1, 8),
    dtype=DTYPES,
    seed=st.integers(0, 99),
)
def test_the_torch_rope_equals_the_forward_before(n, t, kv_heads, group, half, dtype, seed):
    # Before: q and k [n, heads, T, d] (transposed), cos/sin [n, 1, T, d]. Now: [n, T,
    # heads, d] straight from the projection's split, cos/sin [n, T, 1, d]. Same numbers.
    torch.manual_seed(seed)
    hq, d = kv_heads * group, 2 * half
    qkv = torch.randn(n, t, (hq + 2 * kv_heads) * d).to(dtype)
    q, k, _ = torch.split(qkv, [hq * d, kv_heads * d, kv_heads * d], dim=-1)
    angle = torch.rand(n, t, half) * 50
    emb = torch.cat((angle, angle), dim=-1)
    cos, sin = emb.cos().to(dtype), emb.sin().to(dtype)
    q4, k4 = q.reshape(n, t, hq, d), k.reshape(n, t, kv_heads, d)
    new_q, new_k = fused.TorchOps().rope(q4, k4, cos.unsqueeze(-2), sin.unsqueeze(-2))
    old_q = before_rotate(q4.transpose(1, 2), cos[:, None], sin[:, None]).transpose(1, 2)
    old_k = before_rotate(k4.transpose(1, 2), cos[:, None], sin[:, None]).transpose(1, 2)
    assert torch.equal(new_q, old_q) and torch.equal(new_k, old_k)


@hsettings(max_examples=30, deadline=None)
@given(rows=st.integers(1, 4), inner=st.integers(1, 64), dtype=DTYPES, seed=st.integers(0, 99))
def test_the_torch_act_mul_equals_the_forward_before(rows, inner, dtype, seed) -> None:
    torch.manual_seed(seed)
    gate_up = torch.randn(rows, 2 * inner).to(dtype)
    gate, up = gate_up.chunk(2, dim=-1)
    assert torch.equal(fused.TorchOps().act_mul(nn.SiLU(), gate_up), nn.SiLU()(gate) * up)


@hsettings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 4),
    kv_heads=st.integers(1, 3),
    group=st.integers(1, 3),
    d=st.sampled_from([2, 8, 16]),
    width=st.integers(1, 40),
    dtype=DTYPES,
    data=st.data(),
)
def test_the_torch_decode_attention_equals_the_forward_before(
    n, kv_heads, group, d, width, dtype, data
) -> None:
    # Before: q [n, 1, hq, d] from RoPE, transposed, folded per KV head; the mask from the
    # engine's column range and each row's position; keys/values a slice of the cache.
    torch.manual_seed(data.draw(st.integers(0, 99)))
    hq = kv_heads * group
    q4 = torch.randn(n, 1, hq, d).to(dtype)
    cache = torch.randn(2, n, kv_heads, width + 3, d).to(dtype)
    keys, values = cache[0, :, :, :width], cache[1, :, :, :width]
    positions = torch.tensor(data.draw(st.lists(st.integers(0, width - 1), min_size=n, max_size=n)))
    mask = (torch.arange(width + 3)[:width][None, :] <= positions[:, None])[:, None, None, :]
    before = F.scaled_dot_product_attention(
        q4.transpose(1, 2).reshape(n, kv_heads, group, d), keys, values, attn_mask=mask
    ).reshape(n, 1, hq * d)
    now = fused.TorchOps().decode_attention(q4.reshape(n, hq, d), keys, values, positions)
    assert torch.equal(now.reshape(n, 1, hq * d), before)


@hsettings(max_examples=30, deadline=None)
@given(
    n=st.integers(1, 3),
    kv_heads=st.integers(1, 3),
    group=st.integers(1, 4),
    width=st.integers(1, 30),
    data=st.data(),
)
def test_decode_attention_is_each_rows_softmax_over_its_own_columns(
    n, kv_heads, group, width, data
) -> None:
    # The meaning, from scratch in float64: query head j reads KV head j // group, over
    # columns 0..position (a position past the width means the whole width).
    torch.manual_seed(data.draw(st.integers(0, 99)))
    d, hq = 4, kv_heads * group
    q = torch.randn(n, hq, d, dtype=torch.float64)
    keys = torch.randn(n, kv_heads, width, d, dtype=torch.float64)
    values = torch.randn(n, kv_heads, width, d, dtype=torch.float64)
    positions = data.draw(st.lists(st.integers(0, width + 2), min_size=n, max_size=n))
    got = fused.TorchOps().decode_attention(q, keys, values, torch.tensor(positions))
    for r, pos in enumerate(positions):
        seen = min(pos, width - 1) + 1
        for j in range(hq):
            k, v = keys[r, j // group, :seen], values[r, j // group, :seen]
            weights = torch.softmax(k @ q[r, j] / d**0.5, dim=0)
            assert torch.allclose(got[r, j * d : (j + 1) * d], weights @ v, atol=1e-9)


@pytest.mark.parametrize("value", ["auto", "on", "off"])
def test_the_setting_reaches_the_engine_options(value: str) -> None:
    from_env = Settings.load(None, env={"MTT_FUSED_KERNELS": value})
    from_meta = Settings.load({"fused_kernels": value}, env={})
    assert from_env.fused_kernels == from_meta.fused_kernels == value
    assert StaticOptions.from_settings(from_env).fused_kernels == value
    assert Settings().fused_kernels == "auto"


@given(raw=st.text(max_size=12))
def test_any_other_value_is_refused_in_one_line(raw: str) -> None:
    if raw in ("auto", "on", "off"):
        assert Settings.load(None, env={"MTT_FUSED_KERNELS": raw}).fused_kernels == raw
        return
    with pytest.raises(SettingsError) as info:
        Settings.load(None, env={"MTT_FUSED_KERNELS": raw})
    assert "fused_kernels" in str(info.value) and "\n" not in str(info.value)


def test_the_choice_falls_back_to_the_torch_ops_and_says_why() -> None:
    ops, why = fused.choose("off", torch.device("cuda"))
    assert type(ops) is fused.TorchOps and why == "fused_kernels=off"
    ops, why = fused.choose("auto", torch.device("cpu"))
    assert type(ops) is fused.TorchOps and why == "no CUDA device (cpu)"
    pytest.importorskip("triton")

    def disagrees(ops: fused.TorchOps) -> None:
        raise RuntimeError("fused kernels disagree with the torch reference")

    ops, why = fused.choose("auto", torch.device("cuda"), disagrees)
    assert type(ops) is fused.TorchOps and why is not None and "disagree" in why


def test_the_engine_says_which_ops_it_runs_and_on_refuses_to_start_without(dev_model) -> None:
    base = {"artifact": str(dev_model), "device": "cpu", "pytorch_kv_cache": "static"}
    eng = start_torch_engine(dev_model, Settings(**base, max_seq_len=256), 2)
    try:
        assert eng.info.details["fused_kernels"] == "off: no CUDA device (cpu)"
    finally:
        eng.shutdown()
    with pytest.raises(EngineError, match="fused_kernels=on"):
        start_torch_engine(dev_model, Settings(**base, max_seq_len=256, fused_kernels="on"), 2)


# Run in a child: the interpreter is chosen when triton is first imported.
INTERPRETED = r"""
import json, sys, torch
from torch import nn
from mistral_gpu_fallback.static import fused, llama
torch.manual_seed(0)
ops, ref = fused.TritonOps(), fused.TorchOps()
worst = {}
def diff(name, got, want):
    assert got.shape == want.shape and got.dtype == want.dtype, (name, got.shape, want.shape)
    scale = want.float().abs().max().item() or 1.0
    worst[name] = max(worst.get(name, 0.0), (got.float() - want.float()).abs().max().item() / scale)
for dtype in (torch.float32, torch.bfloat16):
    for lead, hidden, (hq, hkv, d), inner in [
        ((1,), 64, (4, 2, 16), 40), ((3,), 96, (6, 2, 20), 1100), ((2, 3), 33, (8, 8, 8), 7),
    ]:
        key = str(dtype)
        norm = llama.RMSNorm(hidden, 1e-5, dtype=dtype)
        with torch.no_grad():
            norm.weight.normal_(1.0, 0.2)
        x, delta = torch.randn(*lead, hidden).to(dtype), torch.randn(*lead, hidden).to(dtype)
        diff(key + " rms_norm", ops.rms_norm(x, norm), ref.rms_norm(x, norm))
        for name, got, want in zip(("residual", "add_rms_norm"), ops.add_rms_norm(x, delta, norm),
                                   ref.add_rms_norm(x, delta, norm)):
            diff(key + " " + name, got, want)
        qkv = torch.randn(*lead, (hq + 2 * hkv) * d).to(dtype)
        q, k, _ = torch.split(qkv, [hq * d, hkv * d, hkv * d], dim=-1)
        q, k = q.reshape(*lead, hq, d), k.reshape(*lead, hkv, d)
        emb = torch.rand(*lead, 1, d // 2) * 50
        emb = torch.cat((emb, emb), dim=-1)
        cos, sin = emb.cos().to(dtype), emb.sin().to(dtype)
        for name, got, want in zip(("rope q", "rope k"), ops.rope(q, k, cos, sin), ref.rope(q, k, cos, sin)):
            diff(key + " " + name, got, want)
        gate_up = torch.randn(*lead, 2 * inner).to(dtype)
        diff(key + " act_mul", ops.act_mul(nn.SiLU(), gate_up), ref.act_mul(nn.SiLU(), gate_up))
# Decode attention: float16 stands in for bfloat16, whose tl.dot the interpreter gets wrong
# (it multiplies the raw bits); tests/gpu runs it compiled in bfloat16.
for dtype in (torch.float32, torch.float16):
    for n, (hq, hkv, d), width, extra in [
        (1, (4, 4, 16), 1, 0), (3, (4, 2, 16), 80, 16), (2, (6, 2, 20), 130, 126), (4, (8, 1, 32), 64, 0),
    ]:
        key = str(dtype) + " decode_attention"
        cache = torch.randn(2, n + 1, hkv, width + extra, d).to(dtype)  # the engine's strides
        keys, values = cache[0, 1:, :, :width], cache[1, 1:, :, :width]
        q = torch.randn(n, hq + 2 * hkv, d).to(dtype)[:, :hq]  # a view of the projection
        positions = torch.randint(0, width + 4, (n,))
        positions[0] = 0
        diff(key, ops.decode_attention(q, keys, values, positions),
             ref.decode_attention(q, keys, values, positions))
print(json.dumps(worst))
"""


def test_the_triton_kernels_match_the_torch_ops_under_the_interpreter() -> None:
    pytest.importorskip("triton")
    env = dict(
        os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT / "mistral-trt-truss/packages")
    )
    out = subprocess.run(
        [sys.executable, "-c", INTERPRETED], env=env, capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr[-3000:]
    worst = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(worst) == 14  # 6 outputs x 2 dtypes, decode attention x 2 dtypes
    for name, err in worst.items():
        # float32: the kernels' own arithmetic (order of the variance sum, rsqrt, the
        # online softmax). bfloat16: a few roundings (the interpreter truncates to bf16,
        # the GPU rounds); float16: the probabilities rounded before their product with V.
        assert err < (1e-5 if "float32" in name else 0.03), (name, err)


ENGINE_INTERPRETED = r"""
import sys, torch
from bench.step_bench import idle_engine, random_model, shape_config
from mistral_gpu_fallback.static import fused
shape = {"layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "mlp": 96, "vocab": 300}
model = random_model(shape_config(shape, 256), torch.device("cpu"), torch.float32, seed=3)
with torch.inference_mode():
    eng = idle_engine(model, 4, 256, "off")
    ids = torch.randint(0, 300, (3, 9))
    outs = []
    for ops in (fused.TorchOps(), fused.TritonOps()):
        eng._ops = ops
        prefill = eng._forward(ids, torch.arange(9)[None].expand(3, 9), 0, 9, False)
        eng._tok[:3], eng._posv[:3] = ids[:, -1], 9
        outs.append((prefill, eng._decode_logits(3, 256)))
(p0, d0), (p1, d1) = outs
print((p0 - p1).abs().max().item(), (d0 - d1).abs().max().item())
"""


def test_the_engine_forward_with_the_triton_kernels_equals_the_torch_ops() -> None:
    # The static engine's prefill and decode passes (float32, interpreted): the kernels
    # see the engine's own shapes and strides (q/k views of the fused projection, [n, T]).
    pytest.importorskip("triton")
    paths = [str(ROOT / "mistral-trt-truss/packages"), str(ROOT)]
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.pathsep.join(paths))
    out = subprocess.run(
        [sys.executable, "-c", ENGINE_INTERPRETED],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    prefill, decode = map(float, out.stdout.split())
    assert prefill < 1e-4 and decode < 1e-4
