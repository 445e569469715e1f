"""Echo with prompt logprobs on /v1/completions, through the real server: the exact
loglikelihood request lm-evaluation-harness's `local-completions` model sends
(`_create_payload(generate=False)`), read the way its `parse_logprobs` reads it, checked
against a separate HF forward pass of the dev model; and `max_tokens: 0` through the
openai SDK."""

from __future__ import annotations

from pathlib import Path

import pytest
import requests
import torch
from openai import OpenAI
from transformers import AutoModelForCausalLM

from mistral_serving.text.tokenizer import load_tokenizer

pytestmark = pytest.mark.e2e

CONTEXT = "Question: which wind blows down the Rhone valley? Answer:"
CONTINUATIONS = [" The mistral", " A gentle breeze from the sea"]
TOL = 1e-4


@pytest.fixture(scope="module")
def reference(dev_model: Path):
    return AutoModelForCausalLM.from_pretrained(dev_model, dtype=torch.float32).eval()


def hf_logprobs(model, ids: list[int]) -> list[float]:
    """log p(ids[i] | ids[:i]) for i >= 1, from one fp32 forward pass."""
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([ids])).logits[0, :-1].float(), -1)
    return logp.gather(1, torch.tensor(ids[1:])[:, None])[:, 0].tolist()


def lm_eval_parse(choice: dict, ctxlen: int) -> tuple[float, bool]:
    """`LocalCompletionsAPI.parse_logprobs` (lm_eval/models/openai_completions.py)."""
    token_logprobs = choice["logprobs"]["token_logprobs"][ctxlen:-1]
    top_logprobs = choice["logprobs"]["top_logprobs"][ctxlen:-1]
    greedy = all(tok == max(top.values()) for tok, top in zip(token_logprobs, top_logprobs))
    return sum(token_logprobs), greedy


@pytest.mark.parametrize("continuation", CONTINUATIONS)
def test_lm_evaluation_harness_loglikelihood_request(
    server_url: str, dev_model: Path, reference, continuation: str
) -> None:
    tok = load_tokenizer(dev_model)
    context_enc = tok.encode(CONTEXT, bos=True)
    continuation_enc = tok.encode(continuation)
    ids = context_enc + continuation_enc
    payload = {  # exactly what `_create_payload(..., generate=False)` builds
        "model": "model",
        "prompt": [ids],
        "temperature": 0,
        "max_tokens": 1,
        "logprobs": 1,
        "seed": 1234,
        "echo": True,
    }
    r = requests.post(f"{server_url}/v1/completions", json=payload, timeout=60)
    assert r.status_code == 200, r.text
    (choice,) = r.json()["choices"]
    logprobs = choice["logprobs"]
    # One entry per prompt token plus the generated one (a stop token included).
    assert len(logprobs["token_logprobs"]) == len(ids) + 1
    assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None
    total, greedy = lm_eval_parse(choice, len(context_enc))
    want = hf_logprobs(reference, ids)
    assert abs(total - sum(want[len(context_enc) - 1 :])) < TOL * len(continuation_enc)
    ref_greedy = True
    with torch.no_grad():
        logits = reference(torch.tensor([ids])).logits[0, :-1]
    for pos in range(len(context_enc) - 1, len(ids) - 1):
        ref_greedy &= int(logits[pos].argmax()) == ids[pos + 1]
    assert greedy == ref_greedy


def test_echo_with_max_tokens_0_through_the_openai_sdk(
    server_url: str, dev_model: Path, reference
) -> None:
    client = OpenAI(base_url=server_url + "/v1", api_key="unused", max_retries=0)
    prompt = CONTEXT + CONTINUATIONS[0]
    r = client.completions.create(model="m", prompt=prompt, echo=True, max_tokens=0, logprobs=2)
    (choice,) = r.choices
    assert choice.text == prompt and choice.finish_reason == "length"
    assert r.usage.completion_tokens == 0
    ids = load_tokenizer(dev_model).encode(prompt, bos=True)
    assert r.usage.prompt_tokens == len(ids)
    got = choice.logprobs.token_logprobs
    assert got[0] is None and len(got) == len(ids)
    for value, want in zip(got[1:], hf_logprobs(reference, ids)):
        assert abs(value - want) < TOL
    assert all(len(top) <= 2 for top in choice.logprobs.top_logprobs[1:])


def test_echo_with_stream_is_a_clear_400(server_url: str) -> None:
    r = requests.post(
        f"{server_url}/v1/completions",
        json={"prompt": "x", "echo": True, "stream": True, "max_tokens": 1},
        timeout=30,
    )
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "echo"
