"""Upstream behaviours of TensorRT-LLM that break a naive adapter on first contact, each
mirrored by the double (tests/doubles/fake_tensorrt_llm, see its README and module
docstrings for the upstream function each copies) and handled by the adapter."""

from __future__ import annotations

import asyncio
import time

import pytest

from mistral_serving.engines.base import (
    EngineError,
    EngineRequestError,
    GuidedDecoding,
    SamplingOptions,
)
from mistral_serving.engines.trtllm import engine as trtllm
from mistral_serving.settings import Settings
from tests.doubles.trtllm_helpers import (
    load,
    load_pytorch_kind,
    load_with_logits,
    run,
    settle,
    tokens_of,
)

HANG_GUARD_S = 60.0  # only turns a hang into a failure; never reached when the code is right


# -- the sampler of the PyTorch-backend kind ---------------------------------------------


def test_the_sampler_setting_picks_the_sampler_type(fake_trtllm, tmp_path):
    assert load_pytorch_kind(tmp_path / "a").llm.args.sampler_type == "TRTLLMSampler"
    torch_kind = load_pytorch_kind(tmp_path / "b", Settings(trtllm_sampler="torch"))
    assert torch_kind.llm.args.sampler_type == "TorchSampler"
    assert torch_kind.info.details["sampler"] == "torch"


@pytest.mark.parametrize("k", [1, 5])
def test_trtllm_sampler_refuses_top_logprobs_it_cannot_rank(fake_trtllm, tmp_path, k):
    # TRTLLMSampler.update_requests returns the sampled token alone, rank 1: k > 0 would come
    # back as one entry claiming to be the best.
    engine = load_pytorch_kind(tmp_path)
    with pytest.raises(EngineRequestError, match="TRTLLMSampler.*trtllm_sampler=torch"):
        run(engine, SamplingOptions(max_new_tokens=3, logprobs=k))
    assert engine.llm.requests == [] and engine.is_healthy()


def test_trtllm_sampler_gives_the_chosen_tokens_logprob(fake_trtllm, tmp_path):
    engine = load_pytorch_kind(tmp_path)
    deltas = run(engine, SamplingOptions(max_new_tokens=3, logprobs=0))
    lps = [lp for d in deltas for lp in d.logprobs]
    assert [lp.token_id for lp in lps] == tokens_of(deltas)
    assert all(lp.logprob == -0.25 and lp.top == () for lp in lps)


def test_torch_sampler_gives_top_k_and_refuses_penalties(fake_trtllm, tmp_path):
    engine = load_pytorch_kind(tmp_path, Settings(trtllm_sampler="torch"))
    deltas = run(engine, SamplingOptions(max_new_tokens=3, logprobs=3))
    assert all(len(lp.top) == 3 for d in deltas for lp in d.logprobs)
    for penalty in (
        {"repetition_penalty": 1.2},
        {"presence_penalty": 0.5},
        {"frequency_penalty": -0.5},
    ):
        with pytest.raises(EngineRequestError, match="TorchSampler.*trtllm_sampler=trtllm"):
            run(engine, SamplingOptions(max_new_tokens=3, **penalty), rid="p")
    assert len(engine.llm.requests) == 1


# -- the KV-cache gauge and the sticky stats iterator ------------------------------------


def _blocks(engine, tokens: int) -> float:
    return -(-tokens // engine.llm.tokens_per_block) / engine.llm.max_num_blocks


def test_the_kv_gauge_survives_a_step_longer_than_a_stats_timeout(fake_trtllm, tmp_path):
    """A step longer than a stats read's timeout (a long prefill) leaves upstream's one
    IterationResult done until the next submission: a poller would freeze the gauge."""
    engine = load(tmp_path)
    prompt = [7] * 40

    async def main() -> tuple[float, float]:
        stream = engine.generate("r1", prompt, SamplingOptions(max_new_tokens=60))
        await anext(stream)
        await settle()
        first = engine.kv_cache_usage()
        engine.llm.step_delay = 0.3  # no iteration for a while
        engine.kv_cache_usage()
        await anext(stream)
        engine.llm.step_delay = 0.0
        for _ in range(40):
            await anext(stream)
            engine.kv_cache_usage()
            await settle()
        last = engine.kv_cache_usage()
        await stream.aclose()
        return first, last

    first, last = asyncio.run(main())
    assert first == _blocks(engine, 41)
    assert last == _blocks(engine, 40 + 42) != first


def test_the_stats_reader_restarts_after_a_submission(fake_trtllm, tmp_path, monkeypatch):
    """Idle longer than the read timeout: the iterator is done; the next request's
    generate_async marks it undone, and the reader must start reading again."""
    monkeypatch.setattr(trtllm, "STATS_TIMEOUT_S", 0.2)
    engine = load(tmp_path)

    async def main() -> tuple[float | None, float, int]:
        during_r1 = None
        async for _ in engine.generate("r1", [7] * 100, SamplingOptions(max_new_tokens=5)):
            await settle()
            during_r1 = engine.kv_cache_usage() if during_r1 is None else during_r1
        await asyncio.sleep(0.6)  # idle: the read times out, the iterator is done
        calls = engine.llm.stats_calls
        for _ in range(50):  # a finished iterator is not polled in a loop
            engine.kv_cache_usage()
            await settle()
        idle_calls = engine.llm.stats_calls - calls
        stream = engine.generate("r2", [7] * 10, SamplingOptions(max_new_tokens=5))
        await anext(stream)
        await settle()
        during_r2 = engine.kv_cache_usage()
        await stream.aclose()
        return during_r1, during_r2, idle_calls

    during_r1, during_r2, idle_calls = asyncio.run(main())
    assert during_r1 == _blocks(engine, 104)
    assert during_r2 == _blocks(engine, 11) != during_r1
    assert idle_calls == 0


# -- min_tokens: upstream holds back end_id only -----------------------------------------


def test_min_tokens_holds_back_eos_but_a_stop_token_ends_earlier(fake_trtllm, tmp_path):
    engine = load(tmp_path)
    engine.llm.script = [10, 13, 11, 2, 12, 2]
    deltas = run(engine, SamplingOptions(max_new_tokens=9, stop_token_ids=(13,), min_tokens=4))
    assert engine.llm.requests[0].sampling_params.min_tokens == 4
    # The stop token (a stop word upstream) ends it at once; vLLM would have held it back.
    assert tokens_of(deltas) == [10] and deltas[-1].finish_reason == "stop"
    deltas = run(engine, SamplingOptions(max_new_tokens=9, min_tokens=4), rid="r2")
    assert tokens_of(deltas) == [10, 13, 11, 2, 12]  # EOS (2) waited for 4 tokens


# -- one request's fatal error, another's refused grammar --------------------------------


def test_a_fatal_error_ends_every_running_stream(fake_trtllm, tmp_path):
    """Upstream raises a background error in one stream (`_handle_background_error`); the
    others wait on queues nothing fills. The adapter ends them all."""
    engine = load(tmp_path)

    async def consume(rid: str) -> BaseException | None:
        try:
            async for _ in engine.generate(rid, [1, 2], SamplingOptions(max_new_tokens=500)):
                await asyncio.sleep(0)
        except (EngineError, EngineRequestError) as exc:
            return exc
        return None

    async def main() -> list[BaseException | None]:
        tasks = [asyncio.create_task(consume(f"r{i}")) for i in range(3)]
        await settle()
        engine.llm.fail_background(RuntimeError("CUDA error: an illegal memory access"))
        return await asyncio.wait_for(asyncio.gather(*tasks), HANG_GUARD_S)

    errors = asyncio.run(main())
    assert all(isinstance(e, EngineError) and "illegal memory access" in str(e) for e in errors)
    assert not engine.is_healthy() and engine.num_running() == 0


def test_a_refused_grammar_is_the_clients_error_and_a_bystanders_engine_error(
    fake_trtllm, tmp_path
):
    """The grammar is compiled inside the executor loop, which fails every active request
    with its error: 400 for the request that sent the schema, 500 for the others."""
    engine = load(tmp_path)
    bad = GuidedDecoding("json_schema", '{"type": "frobnicate"}')

    async def consume(rid: str, opts: SamplingOptions) -> BaseException | None:
        try:
            async for _ in engine.generate(rid, [1, 2], opts):
                await asyncio.sleep(0)
        except (EngineError, EngineRequestError) as exc:
            return exc
        return None

    async def main():
        bystander = asyncio.create_task(consume("ok", SamplingOptions(max_new_tokens=500)))
        await settle()
        guided = asyncio.create_task(consume("bad", SamplingOptions(50, guided=bad)))
        return await asyncio.wait_for(asyncio.gather(bystander, guided), HANG_GUARD_S)

    bystander_error, guided_error = asyncio.run(main())
    assert isinstance(guided_error, EngineRequestError)
    assert "response_format" in str(guided_error) and "frobnicate" in str(guided_error)
    assert isinstance(bystander_error, EngineError)
    assert not isinstance(bystander_error, EngineRequestError)
    assert engine.is_healthy()


def test_a_request_error_without_a_grammar_stays_an_engine_error(fake_trtllm, tmp_path):
    engine = load(tmp_path)
    engine.llm.next_request_error = "Failed to compile the JSON schema grammar: odd"
    with pytest.raises(EngineError) as info:
        run(engine, SamplingOptions(max_new_tokens=3))
    assert not isinstance(info.value, EngineRequestError)


# -- abort of a logprobs request kills the executor (upstream issue 10810) ----------------


def test_logprobs_are_refused_where_an_abort_would_kill_the_executor(fake_trtllm, tmp_path):
    engine = load_with_logits(tmp_path)
    with pytest.raises(EngineRequestError, match="trtllm_logprobs_abort_safe"):
        run(engine, SamplingOptions(max_new_tokens=3, logprobs=1))
    assert engine.llm.requests == [] and engine.is_healthy()
    assert engine.info.details["logprobs"] is False


def test_with_the_setting_on_an_abort_with_logprobs_is_what_verify_gpu_must_check(
    fake_trtllm, tmp_path
):
    """What the setting risks on 1.1.0 / 1.2.0rc7: one client gone, the executor dead."""
    engine = load_with_logits(tmp_path, Settings(trtllm_logprobs_abort_safe=True))
    assert engine.info.details["logprobs"] is True

    async def main() -> None:
        stream = engine.generate("r1", [1, 2], SamplingOptions(max_new_tokens=50, logprobs=1))
        await anext(stream)
        await stream.aclose()  # the client went away: abort
        other = engine.generate("r2", [1, 2], SamplingOptions(max_new_tokens=50))
        with pytest.raises(EngineError):
            await asyncio.wait_for(anext(other), HANG_GUARD_S)

    asyncio.run(main())
    assert not engine.is_healthy()


# -- the heartbeat: stalled_for ----------------------------------------------------------


def test_stalled_for_is_zero_when_idle_and_grows_while_the_executor_hangs(fake_trtllm, tmp_path):
    engine = load(tmp_path)
    assert engine.stalled_for() == 0.0

    async def main() -> tuple[float, float, float, float]:
        stream = engine.generate("r1", [1, 2], SamplingOptions(max_new_tokens=50))
        await anext(stream)
        progressing = engine.stalled_for()
        engine.llm.hang = True  # the executor stops answering
        waiter = asyncio.ensure_future(anext(stream))
        await asyncio.sleep(0.05)
        first = engine.stalled_for()
        await asyncio.sleep(0.05)
        second = engine.stalled_for()
        waiter.cancel()
        await asyncio.gather(waiter, return_exceptions=True)
        await stream.aclose()
        return progressing, first, second, engine.stalled_for()

    started = time.monotonic()
    progressing, first, second, after = asyncio.run(main())
    assert 0.0 < first < second <= time.monotonic() - started
    assert progressing < first
    assert after == 0.0  # nothing pending any more


def test_stalled_for_counts_from_the_submission_when_nothing_came_yet(fake_trtllm, tmp_path):
    engine = load(tmp_path)
    engine.llm.hang = True

    async def main() -> float:
        task = asyncio.ensure_future(anext(engine.generate("r1", [1], SamplingOptions(5))))
        await asyncio.sleep(0.05)
        stalled = engine.stalled_for()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return stalled

    assert asyncio.run(main()) >= 0.05
    assert engine.stalled_for() == 0.0
