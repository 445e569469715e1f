"""The fused Triton kernels (engines/pytorch/fused.py) compiled on a CUDA GPU: each against
the torch ops over random shapes within bf16 rounding, and the static engine's greedy
decode (prefill, then captured CUDA graphs) with them on against off on a small random
model. Skipped without CUDA. Run on the GPU machine (no conftest: the device image lacks
the server's packages):

  python3 -m pytest -q -p no:cacheprovider --noconftest tests/gpu/test_fused_kernels.py
"""

from __future__ import annotations

import asyncio

import pytest
import torch
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from torch import nn

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

DEV = torch.device("cuda")
BF16 = torch.bfloat16


def ops_pair():
    from mistral_gpu_fallback.static import fused

    pytest.importorskip("triton")
    return fused.TritonOps(), fused.TorchOps()


def close(got: torch.Tensor, want: torch.Tensor, ulps: float = 2.0) -> None:
    """Within a few bf16 roundings of the reference's magnitude."""
    assert got.shape == want.shape and got.dtype == want.dtype
    scale = want.float().abs().amax().clamp_min(1e-3)
    err = (got.float() - want.float()).abs().amax()
    assert err <= ulps * 2**-8 * scale + 1e-3, (err.item(), scale.item())


@hsettings(max_examples=30, deadline=None)
@given(
    lead=st.lists(st.integers(1, 7), min_size=1, max_size=2),
    hidden=st.sampled_from([64, 96, 4096, 5120, 33]),
    seed=st.integers(0, 999),
)
def test_add_rms_norm_and_rms_norm(lead, hidden, seed) -> None:
    from mistral_gpu_fallback.static import llama

    ops, ref = ops_pair()
    torch.manual_seed(seed)
    norm = llama.RMSNorm(hidden, 1e-5, device=DEV, dtype=BF16)
    with torch.no_grad():
        norm.weight.normal_(1.0, 0.2)
    x = torch.randn(*lead, hidden, device=DEV).to(BF16)
    delta = torch.randn(*lead, hidden, device=DEV).to(BF16)
    with torch.inference_mode():
        close(ops.rms_norm(x, norm), ref.rms_norm(x, norm))
        (r1, y1), (r2, y2) = ops.add_rms_norm(x, delta, norm), ref.add_rms_norm(x, delta, norm)
    assert torch.equal(r1, r2)  # the residual add rounds exactly as torch's
    close(y1, y2)


@hsettings(max_examples=30, deadline=None)
@given(
    lead=st.sampled_from([(1,), (16,), (3, 5), (256,), (2, 1)]),
    heads=st.sampled_from([(32, 8, 128), (8, 8, 64), (6, 2, 80), (4, 1, 16)]),
    seed=st.integers(0, 999),
)
def test_rope_of_q_and_k(lead, heads, seed) -> None:
    ops, ref = ops_pair()
    hq, hkv, d = heads
    torch.manual_seed(seed)
    qkv = torch.randn(*lead, (hq + 2 * hkv) * d, device=DEV).to(BF16)
    q, k, _ = torch.split(qkv, [hq * d, hkv * d, hkv * d], dim=-1)  # views, as the engine's
    q, k = q.reshape(*lead, hq, d), k.reshape(*lead, hkv, d)
    angle = torch.rand(*lead, 1, d // 2, device=DEV) * 4096
    emb = torch.cat((angle, angle), dim=-1)
    cos, sin = emb.cos().to(BF16), emb.sin().to(BF16)
    with torch.inference_mode():
        (q1, k1), (q2, k2) = ops.rope(q, k, cos, sin), ref.rope(q, k, cos, sin)
    close(q1, q2, ulps=3)  # the reference rounds x*cos and rot*sin before adding
    close(k1, k2, ulps=3)


@hsettings(max_examples=20, deadline=None)
@given(
    lead=st.sampled_from([(1,), (64,), (2, 3)]),
    inner=st.sampled_from([14336, 1024, 1000, 7]),
    seed=st.integers(0, 999),
)
def test_silu_times_up(lead, inner, seed) -> None:
    ops, ref = ops_pair()
    torch.manual_seed(seed)
    gate_up = (torch.randn(*lead, 2 * inner, device=DEV) * 3).to(BF16)
    with torch.inference_mode():
        close(ops.act_mul(nn.SiLU(), gate_up), ref.act_mul(nn.SiLU(), gate_up))
    gelu = nn.GELU()  # not fused: the torch op, unchanged
    assert torch.equal(ops.act_mul(gelu, gate_up), ref.act_mul(gelu, gate_up))


@hsettings(max_examples=30, deadline=None)
@given(
    n=st.sampled_from([1, 3, 16, 256]),
    heads=st.sampled_from([(32, 8, 128), (8, 8, 64), (6, 2, 80), (4, 1, 16)]),
    width=st.sampled_from([1, 64, 256, 1280]),
    seed=st.integers(0, 999),
)
def test_decode_attention(n, heads, width, seed) -> None:
    ops, ref = ops_pair()
    hq, hkv, d = heads
    torch.manual_seed(seed)
    cache = torch.randn(2, n + 1, hkv, width + 64, d, device=DEV).to(BF16)
    keys, values = cache[0, 1:, :, :width], cache[1, 1:, :, :width]  # the engine's strides
    q = torch.randn(n, hq + 2 * hkv, d, device=DEV).to(BF16)[:, :hq]
    positions = torch.randint(0, width + 4, (n,), device=DEV)
    positions[0] = 0
    with torch.inference_mode():
        close(ops.decode_attention(q, keys, values, positions),
              ref.decode_attention(q, keys, values, positions), ulps=4)  # fmt: skip


def test_decode_attention_reads_the_positions_at_each_graph_replay() -> None:
    ops, ref = ops_pair()
    n, (hq, hkv, d), width = 8, (32, 8, 128), 512
    torch.manual_seed(0)
    keys, values = (torch.randn(n, hkv, width, d, device=DEV).to(BF16) for _ in range(2))
    q = torch.randn(n, hq, d, device=DEV).to(BF16)
    positions = torch.full((n,), 5, device=DEV)
    with torch.inference_mode():
        ops.decode_attention(q, keys, values, positions)  # compiled outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = ops.decode_attention(q, keys, values, positions)
        for pos in ([5] * n, [0, 1, 100, 511, 600, 7, 255, 256]):
            positions.copy_(torch.tensor(pos, device=DEV))
            graph.replay()
            close(out, ref.decode_attention(q, keys, values, positions), ulps=4)


SMALL = {"layers": 4, "hidden": 512, "heads": 8, "kv_heads": 2, "mlp": 1536, "vocab": 2048}


def small_engines(rows: int):
    from bench.step_bench import idle_engine, random_model, shape_config

    config = shape_config(SMALL, 256)
    model = random_model(config, DEV, BF16, seed=1)
    with torch.inference_mode():
        on = idle_engine(model, rows, 256, "on")
        off = idle_engine(model, rows, 256, "off")
    return on, off


def test_greedy_decode_with_the_kernels_on_and_off() -> None:
    # Teacher-forced on the torch path's tokens, so one near-tie cannot make the two
    # sequences diverge: the prefill and 32 captured decode steps' logits must agree.
    rows, prompt_len, steps, width = 4, 17, 32, 256
    on, off = small_engines(rows)
    assert on.info.details["fused_kernels"] == "triton"
    assert off.info.details["fused_kernels"] == "off: fused_kernels=off"
    torch.manual_seed(0)
    ids = torch.randint(0, SMALL["vocab"], (rows, prompt_len), device=DEV)
    positions = torch.arange(prompt_len, device=DEV)[None].expand(rows, prompt_len)
    agree = 0
    with torch.inference_mode():
        logits = []
        for eng in (on, off):
            hidden = eng._forward(ids, positions, 0, prompt_len, False)
            logits.append(eng._model.lm_head(hidden[:, -1]))
        for step in range(steps + 1):
            got, want = logits
            rel = (got.float() - want.float()).norm() / want.float().norm()
            assert rel < 0.03, (step, rel.item())
            agree += int(torch.equal(got.argmax(-1), want.argmax(-1)))
            token = want.argmax(-1)
            logits = []
            for eng in (on, off):
                eng._tok[:rows] = token
                eng._posv[:rows] = prompt_len + step
                logits.append(eng._replay(rows, width)[:rows].clone())
    assert on._graphs and off._graphs  # the steps were graph replays
    assert agree >= steps // 2  # near-ties aside, the same greedy tokens


def test_the_engine_serves_with_the_kernels() -> None:
    from bench.step_bench import random_model, shape_config
    from mistral_gpu_fallback.static.engine import StaticOptions, StaticTorchEngine
    from mistral_serving.engines.base import EngineLimits, SamplingOptions

    model = random_model(shape_config(SMALL, 256), DEV, BF16, seed=2)
    options = StaticOptions(fused_kernels="on")
    engine = StaticTorchEngine(model, 2, EngineLimits(255, 256, 8), options)

    async def one(i: int) -> list[int]:
        tokens: list[int] = []
        sampling = SamplingOptions(max_new_tokens=32, top_k=1)
        async for delta in engine.generate(f"r{i}", [1, 5 + i, 9, 200 + i], sampling):
            tokens += delta.token_ids
        return tokens

    async def every() -> list[list[int]]:
        return await asyncio.gather(*(one(i) for i in range(3)))

    try:
        assert engine.info.details["fused_kernels"] == "triton"
        assert [len(t) for t in asyncio.run(every())] == [32, 32, 32]
    finally:
        engine.shutdown()
