"""Peak RSS growth of one prefill in the dynamic PyTorch engine (dev model, CPU): 8 short
greedy requests and one echo (prompt logprobs) request of N prompt tokens, submitted
together while a running request keeps the engine busy (so they share a step where the
admission rule lets them).

    PYTHONPATH=mistral-trt-truss/packages .venv/bin/python bench/prefill_peak.py \\
        2000 .cache/dev-model [PREFILL_LOGITS_BYTES]
"""

from __future__ import annotations

import asyncio
import resource
import sys
from pathlib import Path

from mistral_serving.engines.base import SamplingOptions, TokenDelta
from mistral_serving.engines.factory import start_torch_engine
from mistral_serving.settings import Settings


def main(n: int, dev: Path, logits_bytes: int | None) -> None:
    extra = {"prefill_logits_bytes": logits_bytes} if logits_bytes else {}
    engine = start_torch_engine(dev, Settings(artifact=str(dev), device="cpu", **extra), 2)
    echo_ids = [1, *[(i * 7919) % 30000 + 1000 for i in range(n - 1)]]

    async def drain(rid: str, prompt: list[int], opts: SamplingOptions) -> list[TokenDelta]:
        return [d async for d in engine.generate(rid, prompt, opts)]

    async def run() -> None:
        await drain("warm", [1, 2, 3], SamplingOptions(4, top_k=1))
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        busy_opts = SamplingOptions(30, top_k=1, ignore_eos=True)
        busy = asyncio.ensure_future(drain("busy", [1, 5, 6], busy_opts))
        await asyncio.sleep(0.05)
        jobs = [
            drain(f"s{i}", [1, 100 + i, 200 + i], SamplingOptions(4, top_k=1)) for i in range(8)
        ]
        echo_opts = SamplingOptions(1, top_k=1, logprobs=1, prompt_logprobs=1)
        jobs.append(drain("echo", echo_ids, echo_opts))
        out = await asyncio.gather(*jobs, busy)
        after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        got = out[8][0].prompt_logprobs or []
        print(
            f"N={n} prefill_logits_bytes={logits_bytes or 'default'}: peak RSS "
            f"{before / 1024:.0f} -> {after / 1024:.0f} MB (+{(after - before) / 1024:.0f} MB); "
            f"{len(got)} prompt logprobs"
        )

    try:
        asyncio.run(run())
    finally:
        engine.shutdown()


if __name__ == "__main__":
    main(int(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else None)
