"""Prompt logprobs (echo on /v1/completions) through every engine kind and the layers
above: the PyTorch engines (dynamic, static KV, in their own process) against a separate
HF forward pass of the dev model; the replay engine (zeros); the TensorRT-LLM adapters
through the double (context logits); the service (the prompt's entries lead); the OpenAI
format (lm-evaluation-harness's exact request and OpenAI's/vLLM's answer shape)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import torch
from prometheus_client import CollectorRegistry

from mistral_gpu_fallback.process.client import ProcessEngine
from mistral_gpu_fallback.replay import ReplayEngine
from mistral_serving.engines.base import (
    EngineLimits,
    EngineRequestError,
    SamplingOptions,
    TokenDelta,
    TokenLogprob,
)
from mistral_serving.engines.factory import start_torch_engine
from mistral_serving.errors import RequestError
from mistral_serving.generation.service import GenerationService
from mistral_serving.ops.metrics import Metrics
from mistral_serving.ops.record import RequestRecord
from mistral_serving.protocols import ParseContext
from mistral_serving.protocols.openai.chat import ChatCompletionsFormat
from mistral_serving.protocols.openai.completions import CompletionsFormat
from mistral_serving.settings import Settings
from mistral_serving.text.tokenizer import Tokenizer, load_tokenizer
from tests.doubles.scripted_engine import ScriptedEngine

EOS = 2
TOL = 1e-4
# Different lengths, so the dynamic engine's left padding and the static one's right
# padding both matter; the one-token prompt has no prompt logprobs at all.
PROMPTS = [[1, 415, 5565, 302, 4843, 349], [1, 22557], [1, 3195, 28723, 9, 77, 12, 500, 31999], [1]]


def reference(model, prompt: list[int]) -> torch.Tensor:
    """log-softmax of a separate fp32 forward pass, positions 0..n-2 ([n-1, vocab])."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt])).logits[0, :-1].float()
    return torch.log_softmax(logits, -1)


def check_against_hf(hf_model, prompt: list[int], got: list[TokenLogprob], k: int) -> None:
    assert len(got) == len(prompt) - 1
    if len(prompt) < 2:
        return
    ref = reference(hf_model, prompt)
    for pos, entry in enumerate(got):
        want = prompt[pos + 1]
        assert entry.token_id == want
        assert abs(entry.logprob - ref[pos, want].item()) < TOL
        values, ids = torch.topk(ref[pos], k)
        assert len(entry.top) == k
        for (tid, lp), rid, rv in zip(entry.top, ids.tolist(), values.tolist()):
            assert abs(lp - rv) < TOL
            assert tid == rid or abs(ref[pos, tid].item() - rv) < TOL  # a tie may swap ids


async def drain(engine, rid: str, prompt: list[int], opts: SamplingOptions) -> list[TokenDelta]:
    return [d async for d in engine.generate(rid, prompt, opts)]


def run_all(engine, opts_for) -> list[list[TokenDelta]]:
    """Every prompt at once (one prefill batch), plus a plain request beside them."""

    async def main():
        plain = SamplingOptions(max_new_tokens=4, top_k=1)
        jobs = [drain(engine, f"r{i}", p, opts_for(i)) for i, p in enumerate(PROMPTS)]
        jobs.append(drain(engine, "plain", PROMPTS[0], plain))
        return await asyncio.gather(*jobs)

    return asyncio.run(main())[:-1]


def echo(max_new: int, k: int = 2, **kw) -> SamplingOptions:
    return SamplingOptions(max_new_tokens=max_new, top_k=1, logprobs=k, prompt_logprobs=k, **kw)


KINDS = {
    "dynamic": {},
    "static": {"pytorch_kv_cache": "static", "max_seq_len": 512},
}


def settings_for(dev_model: Path, **values) -> Settings:
    return Settings(artifact=str(dev_model), device="cpu", **values)


@pytest.fixture(scope="module", params=list(KINDS))
def torch_engine(request, dev_model: Path):
    engine = start_torch_engine(dev_model, settings_for(dev_model, **KINDS[request.param]), EOS)
    yield engine
    engine.shutdown()


@pytest.mark.parametrize("max_new", [0, 3])
def test_pytorch_engines_match_a_separate_hf_forward_pass(torch_engine, hf_model, max_new):
    results = run_all(torch_engine, lambda i: echo(max_new, k=1 + i % 3))
    for i, (prompt, deltas) in enumerate(zip(PROMPTS, results)):
        assert deltas[0].prompt_logprobs is not None
        assert all(d.prompt_logprobs is None for d in deltas[1:])  # the first delta only
        check_against_hf(hf_model, prompt, deltas[0].prompt_logprobs, k=1 + i % 3)
        tokens = [t for d in deltas for t in d.token_ids]
        if max_new == 0:
            assert tokens == [] and [d.finish_reason for d in deltas] == ["length"]
        else:
            assert len(tokens) <= max_new and deltas[-1].finish_reason in ("length", "stop")


def test_a_prefill_only_request_does_not_disturb_its_batch(torch_engine):
    async def main():
        alone = await drain(torch_engine, "a", PROMPTS[0], SamplingOptions(6, top_k=1))
        with_echo = await asyncio.gather(
            drain(torch_engine, "b", PROMPTS[0], SamplingOptions(6, top_k=1)),
            drain(torch_engine, "c", PROMPTS[2], echo(0)),
        )
        return alone, with_echo[0]

    alone, beside = asyncio.run(main())
    assert [t for d in alone for t in d.token_ids] == [t for d in beside for t in d.token_ids]


def test_echo_keeps_the_logprob_of_the_stop_token(torch_engine, hf_model):
    """lm-evaluation-harness drops the last entry (`[ctxlen:-1]`) as the generated token's:
    when greedy decoding stops at once, that entry must still be there."""
    prompt = PROMPTS[0]
    with torch.no_grad():
        first = int(hf_model(torch.tensor([prompt])).logits[0, -1].argmax())
    opts = echo(1, k=1, stop_token_ids=(first,))
    deltas = asyncio.run(drain(torch_engine, "s", prompt, opts))
    assert [t for d in deltas for t in d.token_ids] == [] and deltas[-1].finish_reason == "stop"
    (stop,) = [lp for d in deltas for lp in d.logprobs or []]
    assert stop.token_id == first
    # Without echo the stop token stays out, as before.
    plain = SamplingOptions(1, top_k=1, logprobs=1, stop_token_ids=(first,))
    assert all(not d.logprobs for d in asyncio.run(drain(torch_engine, "t", prompt, plain)))


def test_the_engine_process_carries_prompt_logprobs(dev_model, hf_model):
    engine = ProcessEngine.start(dev_model, settings_for(dev_model), EOS)
    try:
        results = run_all(engine, lambda i: echo(i % 2, k=2))
    finally:
        engine.shutdown()
    for prompt, deltas in zip(PROMPTS, results):
        check_against_hf(hf_model, prompt, deltas[0].prompt_logprobs, k=2)


def test_replay_engine_reports_zeros(dev_model):
    tok = load_tokenizer(dev_model)
    engine = ReplayEngine.for_tokenizer(tok, max_batch_size=4, step_ms=1)
    try:
        for max_new in (0, 2):
            deltas = asyncio.run(drain(engine, "r", PROMPTS[0], echo(max_new, k=1)))
            got = deltas[0].prompt_logprobs
            assert [(lp.token_id, lp.logprob) for lp in got] == [(t, 0.0) for t in PROMPTS[0][1:]]
            assert sum(len(d.token_ids) for d in deltas) == max_new
            assert deltas[-1].finish_reason == "length"
    finally:
        engine.shutdown()


# ---- TensorRT-LLM adapters, through the double ----

# `fake_trtllm`: tests/unit/conftest.py.


def trt_engine(tmp_path: Path, gather_context: bool):
    from mistral_serving.engines.trtllm.engine import TrtLlmEngine
    from tests.doubles.trtllm_helpers import H100, make_engine_dir

    engine_dir = make_engine_dir(tmp_path)
    config = json.loads((engine_dir / "config.json").read_text())
    config["build_config"]["gather_context_logits"] = gather_context
    config["build_config"]["gather_generation_logits"] = True
    (engine_dir / "config.json").write_text(json.dumps(config))
    settings = Settings(trtllm_logprobs_abort_safe=True)  # logprobs served from this engine
    return TrtLlmEngine.load(engine_dir, settings, eos_token_id=EOS, gpu=H100)


@pytest.mark.parametrize("max_new", [0, 3])
def test_trtllm_prompt_logprobs_come_from_the_context_logits(fake_trtllm, tmp_path, max_new):
    engine = trt_engine(tmp_path, gather_context=True)
    prompt = [1, 5, 9, 33, 2]
    deltas = asyncio.run(drain(engine, "r", prompt, echo(max_new, k=2)))
    params = engine.llm.requests[-1].sampling_params
    assert params.return_context_logits and params.max_tokens == max(max_new, 1)
    expected = torch.log_softmax(engine.llm.context_logits_for(prompt)[:-1], -1)
    got = deltas[0].prompt_logprobs
    assert [lp.token_id for lp in got] == prompt[1:]
    for pos, lp in enumerate(got):
        assert abs(lp.logprob - expected[pos, prompt[pos + 1]].item()) < 1e-6
        assert [t for t, _ in lp.top] == torch.topk(expected[pos], 2).indices.tolist()
    assert sum(len(d.token_ids) for d in deltas) == max_new
    assert deltas[-1].finish_reason == "length"


def test_trtllm_echo_keeps_the_stop_tokens_logprob(fake_trtllm, tmp_path):
    engine = trt_engine(tmp_path, gather_context=True)
    engine.llm.script = [7]  # then end_id
    engine.llm.include_end_id_in_output = True
    deltas = asyncio.run(drain(engine, "r", [1, 5], echo(4, k=1)))
    assert [t for d in deltas for t in d.token_ids] == [7]
    assert [lp.token_id for d in deltas for lp in d.logprobs or []] == [7, EOS]


def test_trtllm_engine_without_context_logits_refuses_echo(fake_trtllm, tmp_path):
    engine = trt_engine(tmp_path, gather_context=False)
    with pytest.raises(EngineRequestError, match="gather_context_logits"):
        asyncio.run(drain(engine, "r", [1, 5], echo(0)))
    # Echo without logprobs needs no logits: it works on any engine.
    deltas = asyncio.run(drain(engine, "r2", [1, 5], SamplingOptions(0)))
    assert [(d.token_ids, d.finish_reason) for d in deltas] == [([], "length")]


def test_trtllm_pytorch_kind_asks_for_context_logits(fake_trtllm, tmp_path):
    from tests.doubles.trtllm_helpers import load_pytorch_kind

    engine = load_pytorch_kind(tmp_path, Settings(trtllm_sampler="torch"))  # top-k logprobs
    deltas = asyncio.run(drain(engine, "r", [1, 5, 9], echo(0, k=1)))
    assert engine.llm.requests[-1].sampling_params.return_context_logits
    assert [lp.token_id for lp in deltas[0].prompt_logprobs] == [5, 9]


# ---- the service and the OpenAI format ----


LIMITS = EngineLimits(max_input_len=48, max_seq_len=96, max_batch_size=4)
CTX = ParseContext(default_max_tokens=2048)


def comp_fmt(tok: Tokenizer) -> CompletionsFormat:
    return CompletionsFormat("m", lambda t: tok.table.token_bytes[t] or b"")


def answer(tok: Tokenizer, body: dict, script: list) -> dict:
    """Parse, prepare and complete `body` on a scripted engine; the JSON answer."""
    fmt = comp_fmt(tok)
    engine = ScriptedEngine(script, limits=LIMITS)
    service = GenerationService(Settings(), tok, engine, metrics=Metrics(CollectorRegistry()))
    call = fmt.parse(body, CTX)

    async def main():
        prepared = await service.prepare(call.gen)
        record = RequestRecord("req", "completions", engine_id="e")
        outcome = await service.generate(prepared, record).complete()
        return fmt.response_body(call, outcome, record.engine_id)

    body = asyncio.run(main())
    json.dumps(body, allow_nan=False)
    return body


def lp(token: int, value: float, alt: int = 1000) -> TokenLogprob:
    return TokenLogprob(token, value, ((token, value), (alt, value - 1)))


def test_lm_evaluation_harness_request_and_parse(tok: Tokenizer):
    """local-completions' loglikelihood call (`_create_payload(generate=False)`) and its
    `parse_logprobs`: sum(token_logprobs[ctxlen:-1]) and the greedy check over top_logprobs."""
    context, continuation = [1, 415, 5565], [302, 4843]
    ids = context + continuation
    body = {
        "model": "m",
        "prompt": [ids],
        "temperature": 0,
        "max_tokens": 1,
        "logprobs": 1,
        "seed": 1234,
        "echo": True,
    }
    prompt_lps = [lp(415, -1.0), lp(5565, -2.0), lp(302, -0.5), lp(4843, -0.25)]
    script = [TokenDelta([28723], "length", [lp(28723, -3.0)], prompt_lps)]
    out = answer(tok, body, script)
    choice = out["choices"][0]
    logprobs = choice["logprobs"]
    n = len(logprobs["token_logprobs"])
    assert n == len(ids) + 1 and logprobs["token_logprobs"][0] is None
    assert logprobs["top_logprobs"][0] is None
    ctxlen = len(context)
    assert sum(logprobs["token_logprobs"][ctxlen:-1]) == -0.75
    for value, top in zip(
        logprobs["token_logprobs"][ctxlen:-1], logprobs["top_logprobs"][ctxlen:-1]
    ):
        assert value == max(top.values())  # is_greedy
    assert out["usage"] == {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}
    assert len(logprobs["tokens"]) == len(logprobs["text_offset"]) == n


def test_echo_with_max_tokens_0_is_the_prompt_and_its_logprobs(tok: Tokenizer):
    prompt = "Hello world"
    ids = tok.encode(prompt, bos=True)
    prompt_lps = [lp(t, -0.5 * (i + 1)) for i, t in enumerate(ids[1:])]
    body = {"prompt": prompt, "echo": True, "max_tokens": 0, "logprobs": 1}
    out = answer(tok, body, [TokenDelta([], "length", prompt_logprobs=prompt_lps)])
    choice = out["choices"][0]
    assert choice["text"] == prompt and choice["finish_reason"] == "length"
    assert out["usage"]["completion_tokens"] == 0
    assert choice["logprobs"] == {
        "tokens": ["", " Hello", " world"],
        "token_logprobs": [None, -0.5, -1.0],
        "top_logprobs": [
            None,
            {" Hello": -0.5, tok.table.token_bytes[1000].decode(): -1.5},
            {" world": -1.0, tok.table.token_bytes[1000].decode(): -2.0},
        ],
        "text_offset": [0, 0, 6],
    }


def test_echo_text_and_offsets_with_output(tok: Tokenizer):
    ids = tok.encode("Hello", bos=True)  # token ids: echoed as their texts joined
    body = {"prompt": ids, "echo": True, "max_tokens": 2, "logprobs": 0}
    script = [
        TokenDelta([1526], None, [lp(1526, -1.0)], [lp(ids[1], -2.0)]),
        TokenDelta([28723], "length", [lp(28723, -0.5)]),
    ]
    choice = answer(tok, body, script)["choices"][0]
    assert choice["text"] == " Hello world."
    assert choice["logprobs"]["tokens"] == ["", " Hello", " world", "."]
    assert choice["logprobs"]["text_offset"] == [0, 0, 6, 12]  # the output's, into `text`


def test_echo_without_logprobs_prepends_the_prompt_only(tok: Tokenizer):
    engine_script = [TokenDelta([1526], "length")]
    body = {"prompt": "Hello", "echo": True, "max_tokens": 1}
    out = answer(tok, body, engine_script)
    assert out["choices"][0]["text"] == "Hello world" and out["choices"][0]["logprobs"] is None


def test_echo_parse_rules(tok: Tokenizer):
    fmt = comp_fmt(tok)
    call = fmt.parse({"prompt": [[1, 2, 3]], "echo": True, "max_tokens": 0, "logprobs": 3}, CTX)
    s = call.gen.sampling
    assert call.echo and call.gen.prompt_ids == (1, 2, 3)
    assert (s.max_new_tokens, s.logprobs, s.prompt_logprobs) == (0, 3, 3)
    assert fmt.parse({"prompt": "x", "echo": True}, CTX).gen.sampling.prompt_logprobs is None
    assert fmt.parse({"prompt": "x", "logprobs": 2}, CTX).gen.sampling.prompt_logprobs is None
    for body, param in [
        ({"prompt": "x", "max_tokens": 0}, "max_tokens"),  # 0 only with echo
        ({"prompt": "x", "echo": True, "stream": True}, "echo"),
        ({"prompt": "x", "echo": 1}, "echo"),
        ({"prompt": [[1, 2], [3]]}, "prompt"),  # batches of more than one
        ({"prompt": [[]]}, "prompt"),
        ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, "max_tokens"),
    ]:
        target = fmt if "prompt" in body else ChatCompletionsFormat("m", lambda t: b"")
        with pytest.raises(RequestError) as err:
            target.parse(body, CTX)
        assert err.value.param is not None and err.value.param.startswith(param), body
