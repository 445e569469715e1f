"""The KV-cache gauge. The TensorRT-LLM adapter against the `tensorrt_llm` test double (tests/doubles/fake_tensorrt_llm,
see its README; the fixture is tests/unit/conftest.py::fake_trtllm). Nothing of TensorRT-LLM runs here."""

from __future__ import annotations

import asyncio

import pytest

from mistral_serving.engines.base import (
    SamplingOptions,
)
from mistral_serving.engines.trtllm import engine as trtllm
from tests.doubles.trtllm_helpers import (
    load,
    settle,
    tokens_of,
)

# -- KV-cache usage ------------------------------------------------------------------------


@pytest.mark.parametrize("as_json", [False, True])
def test_kv_cache_usage_reads_the_iteration_stats(fake_trtllm, tmp_path, as_json):
    engine = load(tmp_path)
    engine.llm.stats_as_json = as_json
    engine.llm.tokens_per_block, engine.llm.max_num_blocks = 32, 64
    seen = []

    async def main():
        assert engine.kv_cache_usage() == 0.0  # nothing running
        async for delta in engine.generate("r1", [7] * 40, SamplingOptions(max_new_tokens=30)):
            if len(tokens_of([delta])) and delta.token_ids[0] == engine.llm.script[2]:
                await settle()
                seen.append(engine.kv_cache_usage())
        seen.append(engine.kv_cache_usage())

    asyncio.run(main())
    assert seen[0] == 2 / 64  # ceil((40 prompt + 3 generated) / 32) blocks of 64
    assert seen[-1] == 0.0  # idle again


def test_one_stats_reader_however_often_the_gauge_is_read(fake_trtllm, tmp_path):
    engine = load(tmp_path)

    async def main():
        stream = engine.generate("r1", [1, 2], SamplingOptions(max_new_tokens=50))
        for _ in range(3):
            await stream.__anext__()
            for _ in range(100):
                engine.kv_cache_usage()
            await asyncio.sleep(0)
        await stream.aclose()

    asyncio.run(main())
    assert engine.llm.stats_calls == 1


@pytest.mark.parametrize(
    ("stat", "expected"),
    [
        ({"kvCacheStats": {"usedNumBlocks": 3, "maxNumBlocks": 12}}, 0.25),
        ('{"kvCacheStats": {"usedNumBlocks": 12, "maxNumBlocks": 12}}', 1.0),
        ({"kvCacheStats": {"usedNumBlocks": 1, "maxNumBlocks": 0}}, None),
        ({"iter": 3}, None),
        ([], None),
    ],
)
def test_kv_usage_from_stat(stat, expected):
    assert trtllm.kv_usage_from_stat(stat) == expected
