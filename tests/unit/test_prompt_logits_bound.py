"""The prompt logits an echo request holds on the TensorRT-LLM kinds ([prompt, vocab]
float32 context logits, handed over whole), bounded by prefill_logits_bytes as the
PyTorch engines bound theirs: refused alone past it, queued together (through the double)."""

from __future__ import annotations

import asyncio
import json

import pytest

from mistral_serving.engines.base import EngineRequestError, SamplingOptions
from mistral_serving.engines.trtllm.engine import PromptLogitsBudget, TrtLlmEngine
from mistral_serving.settings import Settings
from tests.doubles.trtllm_helpers import EOS, H100, load_pytorch_kind, make_engine_dir

# -- the prompt logits an echo request holds --------------------------------------------


def echo(max_new: int) -> SamplingOptions:
    return SamplingOptions(max_new_tokens=max_new, top_k=1, logprobs=1, prompt_logprobs=1)


def engine_with_context_logits(tmp_path, limit_bytes: int) -> TrtLlmEngine:
    engine_dir = make_engine_dir(tmp_path)
    config = json.loads((engine_dir / "config.json").read_text())
    config["build_config"] |= {"gather_context_logits": True, "gather_generation_logits": True}
    (engine_dir / "config.json").write_text(json.dumps(config))
    settings = Settings(trtllm_logprobs_abort_safe=True, prefill_logits_bytes=limit_bytes)
    return TrtLlmEngine.load(engine_dir, settings, eos_token_id=EOS, gpu=H100)


async def drain(engine, rid: str, prompt: list[int], opts: SamplingOptions) -> list:
    return [d async for d in engine.generate(rid, prompt, opts)]


def test_an_echo_prompt_whose_logits_exceed_the_bound_is_refused(fake_trtllm, tmp_path):
    per_token = 32000 * 4  # the engine's vocabulary, float32
    engine = engine_with_context_logits(tmp_path, limit_bytes=10 * per_token)
    with pytest.raises(EngineRequestError, match="prefill_logits_bytes"):
        asyncio.run(drain(engine, "big", list(range(1, 12)), echo(2)))
    assert engine.llm.requests == []  # refused before the executor saw it
    deltas = asyncio.run(drain(engine, "fits", list(range(1, 11)), echo(2)))
    assert len(deltas[0].prompt_logprobs) == 9
    # Without echo the same long prompt is not bounded: no logits are asked for.
    plain = asyncio.run(drain(engine, "plain", list(range(1, 12)), SamplingOptions(2, top_k=1)))
    assert plain[-1].finish_reason == "length"


def test_the_pytorch_kind_bounds_them_too(fake_trtllm, tmp_path):
    engine = load_pytorch_kind(tmp_path, Settings(trtllm_sampler="torch", prefill_logits_bytes=1))
    with pytest.raises(EngineRequestError, match="prefill_logits_bytes"):
        asyncio.run(drain(engine, "r", [1, 5, 9], echo(0)))


def test_echo_requests_wait_for_room_and_the_room_is_given_back(fake_trtllm, tmp_path):
    per_token = 32000 * 4
    engine = engine_with_context_logits(tmp_path, limit_bytes=12 * per_token)
    engine.llm.step_delay = 0.01

    async def main() -> list[int]:
        seen: list[int] = []

        async def one(rid: str) -> None:
            async for _ in engine.generate(rid, list(range(1, 9)), echo(3)):  # 8 tokens each
                seen.append(engine._prompt_logits.held // per_token)

        await asyncio.gather(one("a"), one("b"))
        seen.append(engine._prompt_logits.held)
        return seen

    seen = asyncio.run(main())
    assert max(seen[:-1]) == 8 and seen[-1] == 0  # never both at once; all given back


def test_a_closed_echo_stream_gives_its_room_back_and_aborts(fake_trtllm, tmp_path):
    engine = engine_with_context_logits(tmp_path, limit_bytes=20 * 32000 * 4)
    engine.llm.step_delay = 0.01

    async def main() -> None:
        stream = engine.generate("r", [1, 2, 3], echo(50))
        await anext(stream)
        await stream.aclose()

    asyncio.run(main())
    assert engine._prompt_logits.held == 0 and engine.num_running() == 0


def test_the_budget_refuses_alone_and_queues_together():
    budget = PromptLogitsBudget(limit_bytes=100 * 4 * 10, vocab_size=10)
    with pytest.raises(EngineRequestError):
        budget.bytes_for(101)

    async def main() -> list[str]:
        order: list[str] = []
        need = budget.bytes_for(60)
        await budget.acquire(need)
        waiting = asyncio.ensure_future(budget.acquire(need))
        await asyncio.sleep(0)
        order.append(f"waiting={not waiting.done()}")
        budget.release(need)
        await waiting
        order.append(f"held={budget.held}")
        budget.release(need)
        return order

    assert asyncio.run(main()) == ["waiting=True", f"held={60 * 40}"]
    assert budget.held == 0
