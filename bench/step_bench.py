"""One decode step of the static PyTorch engine: timed, broken down by kernel kind, and
the matrix-vector products' bandwidth. Prints one JSON line per figure (and appends it to
--out).

The engine is the server's own (`StaticTorchEngine`: its forward pass, its fused weights,
its CUDA graphs, its choice of element-wise ops), built around a model of random weights
of a given shape (default Mistral-7B: 32 layers, hidden 4096, 32/8 heads, MLP 14336,
vocab 32000, bf16), so no artifact is read. For each row count (--rows) at one width
(--width columns of KV cache attended to):

  figure=step          the captured decode step (CUDA graph replay): median, p10 and p90
                       of --replays replays timed with CUDA events, once per path (`ops`:
                       `off`, torch's ops; `triton`, engines/pytorch/fused.py's kernels;
                       `triton-sdpa`, those with torch's SDPA for the decode attention).
                       On a CPU (--device cpu) the eager step, timed by the wall clock.
  figure=step_kernels  one eager step under torch.profiler, per path: each kernel's count
                       and total us by category (gemm, attention, norm = RMSNorm with the
                       residual add before it, rope, elementwise, index/copy, other). On a
                       CPU: the leaf operators' own CPU time.
  figure=linear        F.linear at M=1 for the five weight shapes (q/k/v fused, o, gate/up
                       fused, down, lm_head): us per call and GB/s of weights read (copies
                       cycled so none is served from L2).

  python bench/step_bench.py --out /tmp/step.jsonl           # on the GPU
  python bench/step_bench.py --tiny --device cpu --replays 5 # the CPU check
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "mistral-trt-truss/packages"), str(ROOT)]

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from mistral_gpu_fallback.static import fused, llama  # noqa: E402
from mistral_gpu_fallback.static.engine import (  # noqa: E402
    StaticOptions,  # noqa: E402
    StaticTorchEngine,
    light_config,
)
from mistral_serving.engines.base import EngineLimits  # noqa: E402

OUT: Path | None = None

MISTRAL_7B = {
    "layers": 32,
    "hidden": 4096,
    "heads": 32,
    "kv_heads": 8,
    "mlp": 14336,
    "vocab": 32000,
}
TINY = {"layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "mlp": 128, "vocab": 256}


def emit(**row: Any) -> None:
    line = json.dumps(row)
    print(line, flush=True)
    if OUT is not None:
        with OUT.open("a") as f:
            f.write(line + "\n")


def shape_config(shape: dict[str, int], positions: int) -> Any:
    """A Mistral config.json of this shape, read as the server reads one (`light_config`)."""
    raw = {
        "architectures": ["MistralForCausalLM"],
        "model_type": "mistral",
        "hidden_act": "silu",
        "hidden_size": shape["hidden"],
        "intermediate_size": shape["mlp"],
        "num_attention_heads": shape["heads"],
        "num_key_value_heads": shape["kv_heads"],
        "num_hidden_layers": shape["layers"],
        "rms_norm_eps": 1e-5,
        "rope_theta": 1e6,
        "vocab_size": shape["vocab"],
        "max_position_embeddings": positions,
        "tie_word_embeddings": False,
        "sliding_window": None,
    }
    config = light_config(raw)
    assert config is not None, "light_config refused the bench's config"
    return config


@torch.no_grad()
def random_model(
    config: Any, device: torch.device, dtype: torch.dtype, seed: int = 0
) -> torch.nn.Module:
    """The static engine's modules (`llama.CausalLM`) with random weights: projections
    scaled by 1/sqrt(fan-in) so activations stay O(1) through the layers and greedy
    tokens depend on the numbers, norm weights near 1."""
    model = llama.CausalLM(config, "meta", dtype)
    llama.allocate(model, device)
    gen = torch.Generator(device=device).manual_seed(seed)
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            p.normal_(1.0, 0.1, generator=gen)
        elif "embed_tokens" in name:
            p.normal_(0.0, 1.0, generator=gen)
        else:
            p.normal_(0.0, p.shape[-1] ** -0.5, generator=gen)
    return model.eval()


def idle_engine(model: torch.nn.Module, rows: int, width: int, fused_kernels: str) -> Any:
    """The static engine around `model` for `rows` slots of `width` columns, its step
    thread stopped once its buffers are made (so this thread drives its methods alone)."""
    cuda = next(model.parameters()).device.type == "cuda"
    options = StaticOptions(cuda_graphs=cuda, fused_kernels=fused_kernels)
    engine = StaticTorchEngine(model, 2, EngineLimits(width - 1, width, rows), options)
    for _ in range(600):  # the thread makes the KV cache first, then idles
        if engine._k is not None or engine._fatal is not None:
            break
        time.sleep(0.05)
    engine._closing.set()
    engine._wake.set()
    engine._thread.join()
    if engine._fatal is not None:
        raise engine._fatal
    return engine


class TritonWithTorchAttention(fused.TritonOps):
    """The fused kernels with torch's decode attention (SDPA over the masked length
    bucket): the decode-attention kernel's own share of the step, by difference."""

    name = "triton, sdpa attention"
    decode_attention = fused.TorchOps.decode_attention


def variants(engine: Any, which: str) -> list[tuple[str, fused.TorchOps]]:
    """The paths to time: torch's ops, and where the engine chose the Triton kernels,
    those with torch's decode attention and the engine's own."""
    chosen = engine._ops
    out: list[tuple[str, fused.TorchOps]] = []
    if which in ("both", "off") or not isinstance(chosen, fused.TritonOps):
        out.append(("off", fused.TorchOps()))
    if which == "both" and isinstance(chosen, fused.TritonOps):
        out.append(("triton-sdpa", TritonWithTorchAttention()))
    if which in ("both", "on", "auto") and isinstance(chosen, fused.TritonOps):
        out.append(("triton", chosen))
    return out


def use_ops(engine: Any, ops: fused.TorchOps) -> None:
    engine._ops = ops
    engine._graphs.clear()  # captured with the other ops
    engine._pool = None  # their memory pool went with them: a new capture takes a new one


def time_step(engine: Any, rows: int, width: int, replays: int) -> dict[str, Any]:
    engine._posv[:rows] = width - 1  # every row attends to all `width` columns
    if engine._use_graphs:
        graph, _ = engine._capture(rows, width)
        for _ in range(5):
            graph.replay()
        pairs = [
            (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            for _ in range(replays)
        ]
        for start, end in pairs:
            start.record()
            graph.replay()
            end.record()
        torch.cuda.synchronize()
        ms = [s.elapsed_time(e) for s, e in pairs]
        mode = "cuda graph"
    else:
        engine._decode_logits(rows, width)
        ms = []
        for _ in range(replays):
            t = time.perf_counter()
            engine._decode_logits(rows, width)
            ms.append((time.perf_counter() - t) * 1e3)
        mode = "eager"
    ms.sort()
    q = statistics.quantiles(ms, n=10) if len(ms) > 1 else [ms[0]] * 9
    median = statistics.median(ms)
    return {
        "mode": mode,
        "ms_p50": round(median, 4),
        "ms_p10": round(q[0], 4),
        "ms_p90": round(q[-1], 4),
        "tok_s": round(rows * 1e3 / median, 1),
        "replays": replays,
    }


# ---- the kernel breakdown ----

LABEL = "step_bench:"  # record_function ranges around the element-wise ops
CATEGORIES = ("gemm", "attention", "norm", "rope", "elementwise", "index/copy", "other")
_OPS_BY_CATEGORY = {
    "attention": ("aten::scaled_dot_product_attention",),
    "gemm": ("aten::linear", "aten::mm", "aten::addmm", "aten::matmul", "aten::bmm"),
    "index/copy": ("aten::index_put_", "aten::index", "aten::embedding", "aten::copy_"),
}


def labelled(ops: fused.TorchOps) -> fused.TorchOps:
    """`ops` with each op inside a profiler range naming its category (the torch ops'
    add_rms_norm calls rms_norm inside: both are `norm`)."""
    base = type(ops)

    def wrap(name: str, category: str) -> Any:
        def method(self: Any, *args: Any) -> Any:
            with torch.profiler.record_function(LABEL + category):
                return getattr(base, name)(self, *args)

        return method

    methods = {
        "rms_norm": wrap("rms_norm", "norm"),
        "add_rms_norm": wrap("add_rms_norm", "norm"),
        "rope": wrap("rope", "rope"),
        "act_mul": wrap("act_mul", "elementwise"),
        "decode_attention": wrap("decode_attention", "attention"),
    }
    cls = type("Labelled" + base.__name__, (base,), methods)
    copy: fused.TorchOps = cls.__new__(cls)
    copy.__dict__.update(ops.__dict__)  # the Triton ops' kernels
    return copy


def category(event: Any) -> str:
    """The category of a profiler event: the innermost labelled range around it, else the
    innermost operator of a known kind (attention and GEMM by their kernels' operators),
    else elementwise for any other aten operator."""
    chain = []
    e = event
    while e is not None:
        chain.append(e.name)
        e = e.cpu_parent
    for name in chain:
        if name.startswith(LABEL):
            return name[len(LABEL) :]
    for name in chain:
        for cat, names in _OPS_BY_CATEGORY.items():
            if name in names:
                return cat
    return "elementwise" if chain[0].startswith("aten::") else "other"


def breakdown(engine: Any, rows: int, width: int) -> dict[str, Any]:
    from torch.profiler import ProfilerActivity, profile

    engine._posv[:rows] = width - 1
    engine._decode_logits(rows, width)  # warm (kernels loaded, allocator primed)
    cuda = engine._device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    if cuda:
        torch.cuda.synchronize()
    with profile(activities=activities) as prof:
        engine._decode_logits(rows, width)
        if cuda:
            torch.cuda.synchronize()
    totals = {c: {"count": 0, "us": 0.0} for c in CATEGORIES}
    events = prof.events()
    if cuda:
        for evt in events:
            for kernel in getattr(evt, "kernels", []):
                cat = category(evt)
                totals[cat]["count"] += 1
                totals[cat]["us"] += kernel.duration
        device_kernels = sum(
            1 for evt in events if getattr(evt.device_type, "name", "") in ("CUDA",)
        )
        linked = sum(v["count"] for v in totals.values())
        totals["other"]["count"] += max(0, device_kernels - linked)  # kernels of no operator
    else:
        for evt in events:
            if evt.cpu_children or evt.name.startswith(LABEL):
                continue
            cat = category(evt)
            totals[cat]["count"] += 1
            totals[cat]["us"] += evt.self_cpu_time_total
    for v in totals.values():
        v["us"] = round(v["us"], 1)
    return {
        "unit": "kernels (device us)" if cuda else "leaf operators (self CPU us)",
        "total_count": sum(v["count"] for v in totals.values()),
        "total_us": round(sum(v["us"] for v in totals.values()), 1),
        "categories": totals,
    }


# ---- F.linear at M=1 ----


def linear_bandwidth(config: Any, device: torch.device, dtype: torch.dtype, iters: int) -> None:
    hidden, inner = config.hidden_size, config.intermediate_size
    d = llama.head_dim_of(config)
    q, kv = config.num_attention_heads * d, llama.kv_heads_of(config) * d
    shapes = {
        "qkv": (q + 2 * kv, hidden),
        "o_proj": (hidden, q),
        "gate_up": (2 * inner, hidden),
        "down_proj": (hidden, inner),
        "lm_head": (config.vocab_size, hidden),
    }
    cuda = device.type == "cuda"
    l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) if cuda else 0
    for name, (out_f, in_f) in shapes.items():
        size = out_f * in_f * torch.empty((), dtype=dtype).element_size()
        copies = max(2, math.ceil(3 * max(l2, 1) / size)) if cuda else 2
        ws = [torch.randn(out_f, in_f, device=device, dtype=dtype) for _ in range(copies)]
        x = torch.randn(1, in_f, device=device, dtype=dtype)
        for w in ws:
            F.linear(x, w)
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            for j in range(iters):
                F.linear(x, ws[j % copies])
            end.record()
            torch.cuda.synchronize()
            us = start.elapsed_time(end) * 1e3 / iters
        else:
            t = time.perf_counter()
            for j in range(iters):
                F.linear(x, ws[j % copies])
            us = (time.perf_counter() - t) * 1e6 / iters
        emit(
            figure="linear",
            weight=name,
            shape=[out_f, in_f],
            mb=round(size / 1e6, 2),
            copies=copies,
            us=round(us, 2),
            gb_s=round(size / us / 1e3, 1),
        )
        del ws


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--tiny", action="store_true", help="a 2-layer, hidden-64 model (the CPU check)")
    p.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"])
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--rows", default="1,16,64,256", help="decode rows, comma-separated")
    p.add_argument(
        "--width", type=int, default=256, help="KV columns attended to (multiple of 256)"
    )
    p.add_argument(
        "--replays", type=int, default=100, help="timed replays per figure (>= 50 on a GPU)"
    )
    p.add_argument("--fused", default="both", choices=["both", "auto", "on", "off"])
    p.add_argument("--linear-iters", type=int, default=200)
    p.add_argument("--skip-profile", action="store_true")
    p.add_argument("--skip-linear", action="store_true")
    for key, value in MISTRAL_7B.items():
        p.add_argument(
            f"--{key.replace('_', '-')}", type=int, default=None, help=f"default {value}"
        )
    p.add_argument("--out", type=Path, default=None)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    global OUT
    args = parse_args(argv)
    OUT = args.out
    shape = dict(TINY if args.tiny else MISTRAL_7B)
    shape.update({k: getattr(args, k) for k in shape if getattr(args, k) is not None})
    device = torch.device(
        ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    )
    dtype = getattr(torch, args.dtype)
    rows = sorted(int(r) for r in args.rows.split(","))
    width = args.width
    config = shape_config(shape, max(width, 256))
    t = time.perf_counter()
    model = random_model(config, device, dtype)
    weights_gb = sum(p.numel() * p.element_size() for p in model.parameters()) / 1e9
    with torch.inference_mode():
        engine = idle_engine(model, max(rows), width, "on" if args.fused == "on" else "auto")
        emit(
            figure="engine",
            shape=shape,
            device=str(device),
            gpu=torch.cuda.get_device_name(device) if device.type == "cuda" else None,
            torch=torch.__version__,
            dtype=args.dtype,
            width=width,
            weights_gb=round(weights_gb, 2),
            build_s=round(time.perf_counter() - t, 1),
            details=engine.info.details,
        )
        for name, ops in variants(engine, args.fused):
            time_variant(engine, name, ops, rows, width, weights_gb, args)
        if not args.skip_linear:
            linear_bandwidth(config, device, dtype, args.linear_iters)


def time_variant(
    engine: Any,
    name: str,
    ops: fused.TorchOps,
    rows: list[int],
    width: int,
    weights_gb: float,
    args: argparse.Namespace,
) -> None:
    """One variant of the ops: its step time per row count, then (unless --skip-profile)
    each step's kernels."""
    use_ops(engine, ops)
    for n in rows:
        row = time_step(engine, n, width, args.replays)
        emit(
            figure="step",
            ops=name,
            rows=n,
            width=width,
            **row,
            weight_gb_s=round(weights_gb / row["ms_p50"] * 1e3, 1),
        )
    engine._graphs.clear()
    if not args.skip_profile:
        for n in rows:
            use_ops(engine, labelled(ops))
            emit(
                figure="step_kernels",
                ops=name,
                rows=n,
                width=width,
                **breakdown(engine, n, width),
            )
    use_ops(engine, ops)


if __name__ == "__main__":
    main()
