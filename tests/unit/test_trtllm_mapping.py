"""SamplingOptions -> SamplingParams. The TensorRT-LLM adapter against the `tensorrt_llm` test double (tests/doubles/fake_tensorrt_llm,
see its README; the fixture is tests/unit/conftest.py::fake_trtllm). Nothing of TensorRT-LLM runs here."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hyp_settings
from hypothesis import strategies as st

from mistral_serving.engines.base import (
    EngineRequestError,
    SamplingOptions,
)
from mistral_serving.engines.trtllm.engine import to_sampling_params
from tests.doubles.trtllm_helpers import (
    EOS,
    REPO,
)

# -- import without tensorrt_llm -------------------------------------------------------


def test_module_imports_without_tensorrt_llm():
    # Importing must not import tensorrt_llm (absent here; slow to import where present).
    code = (
        "import sys, mistral_serving.engines.trtllm.engine, mistral_serving.engines.trtllm.checks\n"
        "assert 'tensorrt_llm' not in sys.modules, 'tensorrt_llm imported eagerly'\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO / "mistral-trt-truss" / "packages")}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


# -- sampling mapping ------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 31, 33, 512, 4096])
def test_max_tokens_is_always_set(fake_trtllm, n):
    sp = to_sampling_params(SamplingOptions(max_new_tokens=n), EOS, None)
    assert sp.max_tokens == n
    assert fake_trtllm.SamplingParams().max_tokens == 32  # the default we must never keep


options_strategy = st.builds(
    SamplingOptions,
    max_new_tokens=st.integers(1, 32768),
    temperature=st.floats(0.0, 2.0),
    top_k=st.integers(0, 200),
    top_p=st.floats(0.0, 1.0, exclude_min=True),  # SamplingOptions' range: 1.0 is off
    seed=st.none() | st.integers(0, 2**31 - 1),
    repetition_penalty=st.floats(0.5, 2.0),
    presence_penalty=st.floats(-2.0, 2.0),
    frequency_penalty=st.floats(-2.0, 2.0),
    stop_token_ids=st.lists(st.integers(0, 31999), max_size=4).map(tuple),
    ignore_eos=st.booleans(),
    min_tokens=st.integers(0, 64),
    logprobs=st.none() | st.integers(0, 20),
)


@hyp_settings(suppress_health_check=[HealthCheck.function_scoped_fixture], max_examples=200)
@given(
    opts=options_strategy, pad=st.none() | st.integers(0, 31999), prompt_len=st.integers(1, 4096)
)
def test_mapping_invariants(fake_trtllm, opts, pad, prompt_len):
    sp = to_sampling_params(opts, EOS, pad, prompt_len=prompt_len)
    penalised = opts.presence_penalty != 0 or opts.frequency_penalty != 0
    assert sp.prompt_ignore_length == (prompt_len if penalised else None)
    assert sp.ignore_eos == opts.ignore_eos
    assert (sp.min_tokens or 0) == opts.min_tokens
    assert sp.logprobs == (None if opts.logprobs is None else max(opts.logprobs, 1))
    assert isinstance(sp, fake_trtllm.SamplingParams)
    assert sp.max_tokens == opts.max_new_tokens
    assert sp.end_id == EOS
    assert sp.pad_id == (EOS if pad is None else pad)
    assert sp.detokenize is False
    assert sp.n == 1 and not sp.use_beam_search
    assert sp._greedy_decoding == opts.greedy
    if opts.seed is not None:
        assert sp.seed == opts.seed
    if not opts.greedy:
        assert isinstance(sp.seed, int)


def test_greedy_by_top_k_one(fake_trtllm):
    sp = to_sampling_params(SamplingOptions(max_new_tokens=8, temperature=0.9, top_k=1), EOS, 0)
    assert (sp.top_k, sp.top_p, sp.temperature) == (1, None, None)
    assert sp._greedy_decoding


def test_greedy_by_zero_temperature(fake_trtllm):
    sp = to_sampling_params(SamplingOptions(max_new_tokens=8, temperature=0.0, top_k=50), EOS, 0)
    assert sp.top_k == 1 and sp.temperature is None
    assert sp._greedy_decoding


def test_sampling_sets_every_knob_explicitly(fake_trtllm):
    sp = to_sampling_params(
        SamplingOptions(max_new_tokens=8, temperature=0.7, top_k=40, top_p=0.9), EOS, 0
    )
    assert (sp.temperature, sp.top_k, sp.top_p) == (0.7, 40, 0.9)
    assert not sp._greedy_decoding


def test_sampling_off_switches_map_to_explicit_values(fake_trtllm):
    # top_k 0 and top_p 1.0 are "off": all logits, full nucleus, not the C++ defaults.
    sp = to_sampling_params(SamplingOptions(max_new_tokens=8, temperature=0.8), EOS, 0)
    assert (sp.top_k, sp.top_p, sp.temperature) == (0, 1.0, 0.8)
    assert not sp._greedy_decoding


def test_top_p_zero_means_off_not_greedy(fake_trtllm):
    # "0 is off" is the predict route's spelling, mapped where the route is parsed.
    from mistral_serving.protocols import ParseContext
    from mistral_serving.protocols.predict import PredictFormat

    body = {"prompt": "hi", "max_new_tokens": 8, "temperature": 0.8, "top_k": 0, "top_p": 0}
    options = PredictFormat().parse(body, ParseContext(default_max_tokens=16)).gen.sampling
    sp = to_sampling_params(options, EOS, 0)
    assert sp.top_p == 1.0 and not sp._greedy_decoding


def test_seed_is_passed_through(fake_trtllm):
    sp = to_sampling_params(SamplingOptions(max_new_tokens=8, temperature=0.8, seed=1234), EOS, 0)
    assert sp.seed == 1234


def test_unseeded_sampling_gets_a_fresh_seed_per_request(fake_trtllm):
    opts = SamplingOptions(max_new_tokens=8, temperature=0.8)
    seeds = {to_sampling_params(opts, EOS, 0).seed for _ in range(5)}
    assert None not in seeds and len(seeds) > 1


def test_neutral_penalties_stay_unset(fake_trtllm):
    sp = to_sampling_params(SamplingOptions(max_new_tokens=8), EOS, 0)
    assert (sp.repetition_penalty, sp.presence_penalty, sp.frequency_penalty) == (None,) * 3


def test_penalties_are_passed_through(fake_trtllm):
    opts = SamplingOptions(
        max_new_tokens=8, repetition_penalty=1.2, presence_penalty=0.5, frequency_penalty=-0.3
    )
    sp = to_sampling_params(opts, EOS, 0)
    assert (sp.repetition_penalty, sp.presence_penalty, sp.frequency_penalty) == (1.2, 0.5, -0.3)


def test_stop_token_ids_deduplicated_without_eos(fake_trtllm):
    opts = SamplingOptions(max_new_tokens=8, stop_token_ids=(13, EOS, 13, 7))
    assert to_sampling_params(opts, EOS, 0).stop_token_ids == [13, 7]
    assert to_sampling_params(SamplingOptions(max_new_tokens=8), EOS, 0).stop_token_ids is None


@pytest.mark.parametrize(
    "opts",
    [
        SamplingOptions(max_new_tokens=0),
        SamplingOptions(max_new_tokens=8, temperature=0.8, top_p=1.5),
        SamplingOptions(max_new_tokens=8, temperature=0.8, top_p=-0.1),
        SamplingOptions(max_new_tokens=8, repetition_penalty=0.0),
    ],
)
def test_invalid_options_are_request_errors(fake_trtllm, opts):
    with pytest.raises(EngineRequestError):
        to_sampling_params(opts, EOS, 0)
