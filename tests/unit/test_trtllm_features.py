"""Penalties, EOS, min_tokens, logprobs, guided decoding. The TensorRT-LLM adapter against the `tensorrt_llm` test double (tests/doubles/fake_tensorrt_llm,
see its README; the fixture is tests/unit/conftest.py::fake_trtllm). Nothing of TensorRT-LLM runs here."""

from __future__ import annotations

import pytest

from mistral_serving.engines.base import (
    EngineRequestError,
    GuidedDecoding,
    SamplingOptions,
)
from mistral_serving.engines.trtllm.engine import to_sampling_params
from mistral_serving.settings import Settings
from tests.doubles.trtllm_helpers import (
    EOS,
    load,
    load_with_logits,
    run,
    tokens_of,
)

SERVES_LOGPROBS = Settings(trtllm_logprobs_abort_safe=True)


# -- penalties, EOS, min_tokens, logprobs, guided decoding ----------------------------------


@pytest.mark.parametrize(
    ("presence", "frequency", "expected"), [(0.0, 0.0, None), (0.5, 0.0, 3), (0.0, -0.3, 3)]
)
def test_prompt_ignore_length_is_the_prompt_when_penalties_apply(
    fake_trtllm, tmp_path, presence, frequency, expected
):
    # Upstream counts prompt tokens in presence/frequency penalties unless told to skip them.
    engine = load(tmp_path)
    opts = SamplingOptions(max_new_tokens=3, presence_penalty=presence, frequency_penalty=frequency)
    run(engine, opts, prompt=[1, 5, 6])
    assert engine.llm.requests[0].sampling_params.prompt_ignore_length == expected


def test_repetition_penalty_alone_leaves_prompt_ignore_length_unset(fake_trtllm):
    # Repetition penalty counts the prompt by contract (HF semantics); prompt_ignore_length
    # applies to presence/frequency only.
    opts = SamplingOptions(max_new_tokens=3, repetition_penalty=1.3)
    assert to_sampling_params(opts, EOS, 0, prompt_len=9).prompt_ignore_length is None


def test_ignore_eos_streams_the_eos_token_and_runs_to_length(fake_trtllm, tmp_path):
    engine = load(tmp_path)
    engine.llm.script = [10, EOS, 11, 12]
    deltas = run(engine, SamplingOptions(max_new_tokens=4, ignore_eos=True))
    assert engine.llm.requests[0].sampling_params.ignore_eos is True
    assert tokens_of(deltas) == [10, EOS, 11, 12]
    assert deltas[-1].finish_reason == "length"


def test_min_tokens_is_unset_when_zero(fake_trtllm):
    assert to_sampling_params(SamplingOptions(max_new_tokens=3), EOS, 0).min_tokens is None
    assert to_sampling_params(SamplingOptions(3, min_tokens=2), EOS, 0).min_tokens == 2


def test_logprobs_need_an_engine_that_gathers_generation_logits(fake_trtllm, tmp_path):
    # build.py engine's engines do not gather them: the refusal names the kind that serves
    # logprobs, and no setting (there is none that would help).
    engine = load(tmp_path)
    with pytest.raises(
        EngineRequestError, match=r"^logprobs need engine=trtllm_pytorch"
    ) as refused:
        run(engine, SamplingOptions(max_new_tokens=3, logprobs=2))
    assert "trtllm_logprobs_abort_safe" not in str(refused.value)
    assert engine.llm.requests == [] and engine.is_healthy()
    assert "gather_generation_logits" not in vars(engine.llm.args)


@pytest.mark.parametrize("k", [0, 1, 3])
def test_logprobs_stream_with_their_tokens(fake_trtllm, tmp_path, k):
    engine = load_with_logits(tmp_path, SERVES_LOGPROBS)
    assert engine.llm.args.gather_generation_logits is True
    engine.llm.tokens_per_step = 2
    engine.llm.script = [10, 11, 12, 13, EOS]
    deltas = run(engine, SamplingOptions(max_new_tokens=9, logprobs=k))
    sp = engine.llm.requests[0].sampling_params
    # logprobs=0 would mean "off" upstream: top-1 is asked for, the chosen token only kept.
    assert sp.logprobs == max(k, 1) and sp._generation_logits_auto_enabled
    assert tokens_of(deltas) == [10, 11, 12, 13]
    for delta in deltas:
        assert [lp.token_id for lp in delta.logprobs] == delta.token_ids
        for lp in delta.logprobs:
            assert lp.logprob == -0.25 and len(lp.top) == k
            assert all(a[1] >= b[1] for a, b in zip(lp.top, lp.top[1:], strict=False))
            if k:
                assert lp.top[0] == (lp.token_id, -0.25)


def test_logprobs_of_a_trimmed_stop_token_are_dropped(fake_trtllm, tmp_path):
    engine = load_with_logits(tmp_path, SERVES_LOGPROBS)
    engine.llm.script = [10, EOS]
    engine.llm.include_end_id_in_output = True  # the runtime returns the end token too
    deltas = run(engine, SamplingOptions(max_new_tokens=9, logprobs=1))
    assert [d.token_ids for d in deltas] == [[10], []]
    assert [len(d.logprobs) for d in deltas] == [1, 0]


def test_no_logprobs_when_not_asked(fake_trtllm, tmp_path):
    deltas = run(load_with_logits(tmp_path, SERVES_LOGPROBS), SamplingOptions(max_new_tokens=3))
    assert all(d.logprobs is None for d in deltas)


def test_guided_decoding_maps_to_guided_decoding_params(fake_trtllm, tmp_path):
    schema = '{"type": "object", "properties": {"a": {"type": "integer"}}}'
    engine = load(tmp_path)
    run(engine, SamplingOptions(max_new_tokens=3, guided=GuidedDecoding("json_object")))
    run(engine, SamplingOptions(3, guided=GuidedDecoding("json_schema", schema)), rid="r2")
    first, second = (r.sampling_params.guided_decoding for r in engine.llm.requests)
    assert first == fake_trtllm.sampling_params.GuidedDecodingParams(json_object=True)
    assert second == fake_trtllm.sampling_params.GuidedDecodingParams(json=schema)
    assert to_sampling_params(SamplingOptions(3), EOS, 0).guided_decoding is None


@pytest.mark.parametrize("policy", ["guaranteed_no_evict", "max_utilization", "static_batch"])
def test_capacity_scheduler_policy_setting(fake_trtllm, tmp_path, policy):
    engine = load(tmp_path, Settings(trtllm_capacity_scheduler_policy=policy))
    assert engine.llm.args.scheduler_config.capacity_scheduler_policy == policy.upper()
    assert engine.info.details["capacity_scheduler_policy"] == policy
