"""The static engine's element-wise chain, as torch ops or as fused Triton kernels.

Besides its matrix products, a decode layer ran ~35 small kernels (transformers' RMSNorm
as seven element-wise ops, twice; RoPE as cat/neg/mul/add for q and for k; the residual
adds; SiLU and the gate product), each a launch of its own even inside a CUDA graph: at
batch 1 they were a third of the step (docs/perf/history/round-07.md). `TritonOps` does
each group in one kernel:

- `add_rms_norm`: the residual add and the next RMSNorm (float32 variance, cast back,
  times the weight, as transformers computes it), returning both;
- `rope`: q's and k's neox-style half rotation in one launch;
- `act_mul`: silu(gate) * up;
- `decode_attention`: a decode step's attention, one query per row over the row's own
  columns of the KV cache. torch's SDPA takes a mask over the whole length bucket and
  reads every column of it; the kernel reads each row's keys and values up to its
  position only, once per KV head for all of that head's queries (GQA), with the online
  softmax of flash decoding. At 256 rows this was a third of the step.

`TorchOps` is the reference and the fallback (CPU, no Triton, `fused_kernels: off`): the
torch code the engine always ran, op for op, so that path's numbers do not change.
`choose` picks one at the engine's start; Triton is imported only then, and only for a
CUDA device (it is not torch.compile: no dynamo, no sympy).
"""

from __future__ import annotations

import importlib
import logging
import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

log = logging.getLogger(__name__)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE's half rotation of `x` [..., heads, head dim] (cos, sin broadcast over heads)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class TorchOps:
    """The element-wise chain as plain torch ops (the reference)."""

    name = "off"

    def rms_norm(self, x: torch.Tensor, norm: nn.Module) -> torch.Tensor:
        out: torch.Tensor = norm(x)
        return out

    def add_rms_norm(
        self, x: torch.Tensor, delta: torch.Tensor, norm: nn.Module
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(x + delta, norm(x + delta)): the new residual stream and its normed value."""
        residual = x + delta
        return residual, self.rms_norm(residual, norm)

    def rope(
        self, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """q [..., q heads, d] and k [..., kv heads, d] rotated; cos, sin [..., 1, d]."""
        return rotate(q, cos, sin), rotate(k, cos, sin)

    def act_mul(self, act: nn.Module, gate_up: torch.Tensor) -> torch.Tensor:
        """act(gate) * up of the fused [gate; up] projection's output [..., 2 x inner]."""
        gate, up = gate_up.chunk(2, dim=-1)
        out: torch.Tensor = act(gate) * up
        return out

    def decode_attention(
        self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor
    ) -> torch.Tensor:
        """One query per row: `q` [n, q heads, d] attends to its row's `keys`/`values`
        [n, kv heads, width, d] at columns 0..positions[r] (`positions` [n]; a position
        at or past the width: the whole width). Query head j reads KV head
        j // (q heads / kv heads). -> [n, q heads x d]."""
        n, hq, d = q.shape
        hkv, width = keys.shape[1], keys.shape[2]
        cols = torch.arange(width, device=q.device)
        mask = (cols[None, :] <= positions[:, None])[:, None, None, :]  # [n, 1, 1, width]
        # A KV head's queries folded into the query axis: plain multi-head attention.
        o = F.scaled_dot_product_attention(
            q.reshape(n, hkv, hq // hkv, d), keys, values, attn_mask=mask
        )
        return o.reshape(n, hq * d)


class TritonOps(TorchOps):
    """The same ops as fused Triton kernels (CUDA tensors). An input a kernel does not
    cover (another activation, mixed dtypes, an empty batch) takes the torch op."""

    name = "triton"

    def __init__(self) -> None:
        self._k = _kernels()

    def rms_norm(self, x: torch.Tensor, norm: nn.Module) -> torch.Tensor:
        if not _norm_fits(x, norm):
            return super().rms_norm(x, norm)
        return self._norm(x, None, norm)[1]

    def add_rms_norm(
        self, x: torch.Tensor, delta: torch.Tensor, norm: nn.Module
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not _norm_fits(x, norm) or delta.shape != x.shape or delta.dtype != x.dtype:
            return super().add_rms_norm(x, delta, norm)
        return self._norm(x, delta, norm)

    def _norm(
        self, x: torch.Tensor, delta: torch.Tensor | None, norm: nn.Module
    ) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = x.shape[-1]
        rows = x.reshape(-1, hidden)
        deltas = delta.reshape(-1, hidden) if delta is not None else rows
        weight = _weight(norm)
        residual = torch.empty_like(rows) if delta is not None else rows
        normed = torch.empty_like(rows)
        block = _pow2(hidden)
        self._k.add_rms_norm[(rows.shape[0],)](
            rows,
            deltas,
            weight,
            residual,
            normed,
            rows.stride(0),
            deltas.stride(0),
            hidden,
            _eps(norm),
            HAS_DELTA=delta is not None,
            BLOCK=block,
            num_warps=_warps(block),
        )
        return residual.view(x.shape), normed.view(x.shape)

    def rope(
        self, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        d = q.shape[-1]
        if q.numel() == 0 or d % 2 or not q.dtype == k.dtype == cos.dtype == sin.dtype:
            return super().rope(q, k, cos, sin)
        q3, k3 = _heads(q), _heads(k)
        tokens = q3.shape[0]
        cos2 = cos.expand(*q.shape[:-2], 1, d).reshape(tokens, d)
        sin2 = sin.expand(*q.shape[:-2], 1, d).reshape(tokens, d)
        if k3.shape[0] != tokens:
            return super().rope(q, k, cos, sin)
        q_out = torch.empty(q3.shape, dtype=q.dtype, device=q.device)
        k_out = torch.empty(k3.shape, dtype=k.dtype, device=k.device)
        heads = max(q3.shape[1], k3.shape[1])
        self._k.rope[(tokens, 2)](
            q3,
            k3,
            cos2,
            sin2,
            q_out,
            k_out,
            q3.stride(0),
            k3.stride(0),
            cos2.stride(0),
            sin2.stride(0),
            q3.shape[1],
            k3.shape[1],
            d // 2,
            BLOCK_H=_pow2(heads),
            BLOCK_D=_pow2(d // 2),
            num_warps=4,
        )
        return q_out.view(q.shape), k_out.view(k.shape)

    def act_mul(self, act: nn.Module, gate_up: torch.Tensor) -> torch.Tensor:
        if type(act) is not nn.SiLU or gate_up.numel() == 0 or gate_up.shape[-1] % 2:
            return super().act_mul(act, gate_up)
        inner = gate_up.shape[-1] // 2
        rows = gate_up.reshape(-1, 2 * inner)
        if rows.stride(-1) != 1:
            rows = rows.contiguous()
        out = torch.empty((rows.shape[0], inner), dtype=gate_up.dtype, device=gate_up.device)
        block = 1024
        grid = (rows.shape[0], -(-inner // block))
        self._k.silu_mul[grid](rows, out, rows.stride(0), inner, BLOCK=block, num_warps=4)
        return out.view(*gate_up.shape[:-1], inner)

    def decode_attention(
        self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor
    ) -> torch.Tensor:
        n, hq, d = q.shape
        hkv, width = keys.shape[1], keys.shape[2]
        if (
            n == 0
            or hq % hkv
            or not q.dtype == keys.dtype == values.dtype
            or q.dtype not in (torch.float32, torch.float16, torch.bfloat16)
            or keys.stride(-1) != 1
            or values.stride(-1) != 1
            or values.shape != keys.shape
        ):
            return super().decode_attention(q, keys, values, positions)
        if q.stride(-1) != 1 or q.stride(-2) != d:
            q = q.contiguous()
        group = hq // hkv
        out = torch.empty((n, hq * d), dtype=q.dtype, device=q.device)
        self._k.decode_attention[(n, hkv)](
            q,
            keys,
            values,
            positions,
            out,
            q.stride(0),
            *keys.stride()[:3],
            *values.stride()[:3],
            positions.stride(0),
            out.stride(0),
            width,
            group,
            d,
            1.0 / math.sqrt(d),
            BLOCK_G=max(16, _pow2(group)),
            BLOCK_D=max(16, _pow2(d)),
            BLOCK_N=64,
            PRECISION="ieee" if q.dtype == torch.float32 else "tf32",  # no TF32 for float32
            num_warps=4,
        )
        return out


def _weight(norm: nn.Module) -> torch.Tensor:
    weight = norm.weight
    assert isinstance(weight, torch.Tensor)
    return weight


def _norm_fits(x: torch.Tensor, norm: nn.Module) -> bool:
    weight = getattr(norm, "weight", None)
    return (
        x.numel() > 0
        and isinstance(weight, torch.Tensor)
        and weight.dtype == x.dtype
        and weight.shape == x.shape[-1:]
        and not math.isnan(_eps(norm))
    )


def _eps(norm: nn.Module) -> float:
    """The norm's epsilon: our RMSNorm's and transformers' `variance_epsilon` (NaN: none)."""
    eps = getattr(norm, "variance_epsilon", getattr(norm, "eps", None))
    return float(eps) if isinstance(eps, int | float) else math.nan


def _heads(x: torch.Tensor) -> torch.Tensor:
    """`x` as [tokens, heads, d] with unit column and head strides (a view where it can be:
    the projection's output split into q, k, v is one)."""
    x3 = x.reshape(-1, x.shape[-2], x.shape[-1])
    if x3.stride(2) != 1 or x3.stride(1) != x.shape[-1]:
        x3 = x3.contiguous()
    return x3


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _warps(block: int) -> int:
    return 4 if block <= 2048 else 8 if block <= 8192 else 16


_KERNELS: Any = None


def _kernels() -> Any:
    """The Triton kernels, defined on first use (importing triton costs a start time,
    so only an engine that uses them pays it)."""
    # One function on purpose: the kernels must be defined after the lazy triton import,
    # together, and each reads best whole; there is no logic here to split.
    global _KERNELS
    if _KERNELS is not None:
        return _KERNELS
    # Through importlib: triton ships no type information (its objects are Any here).
    triton = importlib.import_module("triton")
    tl = importlib.import_module("triton.language")

    @triton.jit  # type: ignore[untyped-decorator]
    def add_rms_norm(  # type: ignore[no-untyped-def]
        x_ptr, d_ptr, w_ptr, r_ptr, y_ptr, x_stride, d_stride, hidden, eps,
        HAS_DELTA: tl.constexpr, BLOCK: tl.constexpr,  # type: ignore[name-defined]
    ):  # fmt: skip
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        mask = cols < hidden
        x = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0)
        if HAS_DELTA:
            d = tl.load(d_ptr + row * d_stride + cols, mask=mask, other=0.0)
            # Rounded to the stream's dtype, as the torch add is, before the norm reads it.
            x = (x.to(tl.float32) + d.to(tl.float32)).to(r_ptr.dtype.element_ty)
            tl.store(r_ptr + row * hidden + cols, x, mask=mask)
        xf = x.to(tl.float32)
        variance = tl.sum(xf * xf, axis=0) / hidden
        normed = (xf * tl.rsqrt(variance + eps)).to(y_ptr.dtype.element_ty)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0)
        y = w.to(tl.float32) * normed.to(tl.float32)
        tl.store(y_ptr + row * hidden + cols, y.to(y_ptr.dtype.element_ty), mask=mask)

    @triton.jit  # type: ignore[untyped-decorator]
    def rope(  # type: ignore[no-untyped-def]
        q_ptr, k_ptr, cos_ptr, sin_ptr, qo_ptr, ko_ptr, q_stride, k_stride, cos_stride,
        sin_stride, q_heads, kv_heads, half, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,  # type: ignore[name-defined]
    ):  # fmt: skip
        # Program (token, 0) rotates the token's q heads, (token, 1) its k heads.
        tok = tl.program_id(0).to(tl.int64)
        if tl.program_id(1) == 0:
            src = q_ptr + tok * q_stride
            dst = qo_ptr + tok * q_heads * 2 * half
            heads = q_heads
        else:
            src = k_ptr + tok * k_stride
            dst = ko_ptr + tok * kv_heads * 2 * half
            heads = kv_heads
        c = tl.arange(0, BLOCK_D)[None, :]
        cm = c < half
        cos = cos_ptr + tok * cos_stride + c
        sin = sin_ptr + tok * sin_stride + c
        c1 = tl.load(cos, mask=cm, other=0.0).to(tl.float32)
        c2 = tl.load(cos + half, mask=cm, other=0.0).to(tl.float32)
        s1 = tl.load(sin, mask=cm, other=0.0).to(tl.float32)
        s2 = tl.load(sin + half, mask=cm, other=0.0).to(tl.float32)
        h = tl.arange(0, BLOCK_H)[:, None]
        mask = (h < heads) & cm
        at = h * (2 * half) + c
        x1 = tl.load(src + at, mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(src + at + half, mask=mask, other=0.0).to(tl.float32)
        tl.store(dst + at, (x1 * c1 - x2 * s1).to(dst.dtype.element_ty), mask=mask)
        tl.store(dst + at + half, (x2 * c2 + x1 * s2).to(dst.dtype.element_ty), mask=mask)

    @triton.jit  # type: ignore[untyped-decorator]
    def silu_mul(gu_ptr, out_ptr, gu_stride, inner, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def, name-defined]
        row = tl.program_id(0).to(tl.int64)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = cols < inner
        g = tl.load(gu_ptr + row * gu_stride + cols, mask=mask, other=0.0).to(tl.float32)
        u = tl.load(gu_ptr + row * gu_stride + inner + cols, mask=mask, other=0.0)
        # SiLU rounded to the dtype first, as torch's two ops round.
        s = (g / (1.0 + tl.exp(-g))).to(out_ptr.dtype.element_ty).to(tl.float32)
        out = (s * u.to(tl.float32)).to(out_ptr.dtype.element_ty)
        tl.store(out_ptr + row * inner + cols, out, mask=mask)

    @triton.jit  # type: ignore[untyped-decorator]
    def decode_attention(  # type: ignore[no-untyped-def]
        q_ptr, k_ptr, v_ptr, pos_ptr, o_ptr, q_stride, k_row, k_head, k_col, v_row, v_head,
        v_col, pos_stride, o_stride, width, group, head_dim, scale,
        BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,  # type: ignore[name-defined]
        PRECISION: tl.constexpr,  # type: ignore[name-defined]
    ):  # fmt: skip
        # Program (row, kv head): that head's `group` queries over the row's columns
        # 0..position, BLOCK_N at a time, with a running max and sum (flash decoding).
        row = tl.program_id(0).to(tl.int64)
        head = tl.program_id(1)
        length = tl.minimum(tl.load(pos_ptr + row * pos_stride) + 1, width)
        g = tl.arange(0, BLOCK_G)
        c = tl.arange(0, BLOCK_D)
        qm = (g < group)[:, None] & (c < head_dim)[None, :]
        at = (head * group + g)[:, None] * head_dim + c[None, :]
        q = tl.load(q_ptr + row * q_stride + at, mask=qm, other=0.0)
        keys = k_ptr + row * k_row + head * k_head
        values = v_ptr + row * v_row + head * v_head
        top = tl.full([BLOCK_G], float("-inf"), tl.float32)
        total = tl.zeros([BLOCK_G], tl.float32)
        acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
        for start in range(0, length, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            km = (cols < length)[:, None] & (c < head_dim)[None, :]
            k = tl.load(keys + cols[:, None] * k_col + c[None, :], mask=km, other=0.0)
            s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
            s = tl.where((cols < length)[None, :], s, float("-inf"))
            new_top = tl.maximum(top, tl.max(s, 1))
            p = tl.exp(s - new_top[:, None])
            shrink = tl.exp(top - new_top)
            total = total * shrink + tl.sum(p, 1)
            v = tl.load(values + cols[:, None] * v_col + c[None, :], mask=km, other=0.0)
            pv = tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
            acc = acc * shrink[:, None] + pv
            top = new_top
        out = acc / tl.where(total > 0, total, 1.0)[:, None]  # no column: zeros, not NaN
        tl.store(o_ptr + row * o_stride + at, out.to(o_ptr.dtype.element_ty), mask=qm)

    import types

    _KERNELS = types.SimpleNamespace(
        add_rms_norm=add_rms_norm, rope=rope, silu_mul=silu_mul, decode_attention=decode_attention
    )
    return _KERNELS


def choose(
    setting: str, device: torch.device, check: Any | None = None
) -> tuple[TorchOps, str | None]:
    """The ops for `fused_kernels` = auto|on|off on `device`, and why the Triton kernels
    are not used (None when they are). `check(ops)` runs them once on the model's shapes
    against the torch reference (it compiles them, off the first request's path) and
    raises if they fail or disagree: then the torch ops serve."""
    if setting == "off":
        return TorchOps(), "fused_kernels=off"
    if device.type != "cuda":
        return TorchOps(), f"no CUDA device ({device.type})"
    try:
        ops = TritonOps()
        if check is not None:
            check(ops)
    except Exception as exc:  # noqa: BLE001 - any failure: the torch ops, with the reason
        log.warning("fused kernels not used: %r", exc)
        return TorchOps(), f"triton unusable: {exc!r}"[:200]
    return ops, None


def self_check(
    ops: TorchOps,
    norm: nn.Module,
    act: nn.Module,
    heads: tuple[int, int, int],
    inner: int,
    rows: int = 3,
) -> None:
    """Raise unless `ops` agree with `TorchOps` on these shapes (hidden from `norm`'s
    weight, `heads` = (q heads, kv heads, head dim), MLP width `inner`) within the
    dtype's rounding: a kernel that compiled wrongly must not serve."""
    ref = TorchOps()
    weight = _weight(norm)
    dev, dtype = weight.device, weight.dtype
    hq, hkv, d = heads
    gen = torch.Generator(device=dev).manual_seed(0)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=gen, device=dev, dtype=torch.float32).to(dtype)

    x, delta = rand(rows, weight.shape[0]), rand(rows, weight.shape[0])
    pairs = [
        (ops.rms_norm(x, norm), ref.rms_norm(x, norm)),
        *zip(ops.add_rms_norm(x, delta, norm), ref.add_rms_norm(x, delta, norm)),
    ]
    qkv = rand(rows, (hq + 2 * hkv) * d)
    q, k, _ = torch.split(qkv, [hq * d, hkv * d, hkv * d], dim=-1)
    q, k = q.reshape(rows, hq, d), k.reshape(rows, hkv, d)
    half = torch.rand((rows, 1, d // 2), generator=gen, device=dev) * 100
    angle = torch.cat((half, half), dim=-1)
    cos, sin = angle.cos().to(dtype), angle.sin().to(dtype)
    pairs += list(zip(ops.rope(q, k, cos, sin), ref.rope(q, k, cos, sin)))
    gate_up = rand(rows, 2 * inner)
    pairs.append((ops.act_mul(act, gate_up), ref.act_mul(act, gate_up)))
    # Decode attention over a slice of a larger cache (the engine's strides), rows ending
    # at the first column, inside the width, and past it (clamped).
    width = 80
    cache = rand(2, rows + 1, hkv, width + 16, d)
    keys, values = cache[0, 1:, :, :width], cache[1, 1:, :, :width]
    positions = torch.tensor([0, width // 2, width + 3, width - 1][:rows], device=dev)
    positions = torch.cat([positions, positions[-1:].expand(rows - len(positions))])
    pairs.append(
        (
            ops.decode_attention(q, keys, values, positions),
            ref.decode_attention(q, keys, values, positions),
        )
    )
    for got, want in pairs:
        if got.shape != want.shape or not torch.allclose(
            got.float(), want.float(), rtol=0.02, atol=0.02
        ):
            raise RuntimeError("fused kernels disagree with the torch reference")
