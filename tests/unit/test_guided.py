"""Structured output with xgrammar on the dev model: every constrained generation parses
and validates against its schema, greedy and sampled; bad schemas are the client's error."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoModelForCausalLM

from mistral_serving.engines.base import EngineRequestError
from mistral_serving.engines.pytorch.guided import GuidedDecoder
from mistral_serving.structured.constraint import GuidedDecoding
from mistral_serving.text.detokenizer import IncrementalDetokenizer
from mistral_serving.text.tokenizer import Tokenizer

# Bounded schemas: a random-weight model cannot loop forever inside them.
SCHEMAS = [
    {
        "type": "object",
        "properties": {
            "answer": {"type": "string", "enum": ["yes", "no"]},
            "ok": {"type": "boolean"},
        },
        "required": ["answer", "ok"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {
            "n": {"type": "integer", "minimum": 0, "maximum": 99},
            "c": {"enum": ["a", "b", None]},
        },
        "required": ["n", "c"],
        "additionalProperties": False,
    },
    {"type": "array", "items": {"type": "boolean"}, "minItems": 1, "maxItems": 3},
]


@pytest.fixture(scope="module")
def model(dev_model: Path):
    return AutoModelForCausalLM.from_pretrained(dev_model).eval()


@pytest.fixture(scope="module")
def decoder(tok: Tokenizer, model) -> GuidedDecoder:
    return GuidedDecoder(tok, model.config.vocab_size)


def generate(
    model, tok: Tokenizer, decoder: GuidedDecoder, guided: GuidedDecoding, seed: int | None
) -> str:
    matcher = decoder.matcher(guided)
    ids = tok.encode("Answer in JSON:", bos=True)
    out: list[int] = []
    gen = torch.Generator().manual_seed(seed or 0)
    for _ in range(64):
        with torch.no_grad():
            logits = model(torch.tensor([ids + out])).logits[0, -1].float()
        matcher.mask(logits)
        if seed is None:
            token = int(logits.argmax())
        else:
            token = int(torch.multinomial(torch.softmax(logits, -1), 1, generator=gen))
        if token == tok.eos_id:
            break
        matcher.accept(token)
        out.append(token)
    detok = IncrementalDetokenizer(tok.table)
    return detok.push(out) + detok.flush()


@pytest.mark.parametrize("schema", SCHEMAS)
def test_greedy_output_validates(model, tok, decoder, schema) -> None:
    text = generate(model, tok, decoder, GuidedDecoding("json_schema", json.dumps(schema)), None)
    jsonschema.validate(json.loads(text), schema)


@settings(max_examples=6, deadline=None)
@given(schema=st.sampled_from(SCHEMAS), seed=st.integers(0, 2**31))
def test_sampled_output_validates(model, tok, decoder, schema, seed) -> None:
    text = generate(model, tok, decoder, GuidedDecoding("json_schema", json.dumps(schema)), seed)
    jsonschema.validate(json.loads(text), schema)


def test_the_mask_only_allows_what_the_grammar_allows(tok, decoder) -> None:
    matcher = decoder.matcher(GuidedDecoding("json_object"))
    logits = torch.zeros(decoder.vocab_size)
    matcher.mask(logits)
    allowed = [i for i in range(decoder.vocab_size) if logits[i] > float("-inf")]
    assert allowed and len(allowed) < decoder.vocab_size // 10
    for token in allowed:
        text = (tok.table.token_bytes[token] or b"").decode("utf-8", "replace").lstrip()
        assert text.startswith("{"), text  # a JSON object starts with {


def test_a_schema_xgrammar_cannot_use_is_a_request_error(decoder) -> None:
    with pytest.raises(EngineRequestError, match="response_format"):
        decoder.matcher(GuidedDecoding("json_schema", "{not json"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("schema", SCHEMAS)
def test_the_mask_equals_xgrammars_own_kernel(tok, schema, dtype) -> None:
    """Our bit unpacking (numpy in place for float32, a device mask otherwise) blocks
    exactly the tokens xgrammar's kernel blocks, at every step of a walk through the
    grammar, with a model vocabulary padded beyond the tokenizer's."""
    import xgrammar as xgr

    padded = GuidedDecoder(tok, len(tok.table.token_bytes) + 17)
    guided = GuidedDecoding("json_schema", json.dumps(schema))
    ours, reference = padded.matcher(guided), padded.matcher(guided)
    gen = torch.Generator().manual_seed(0)
    for _ in range(40):
        logits = torch.randn(padded.vocab_size, generator=gen).to(dtype)
        expected = logits.float().view(1, -1)
        reference._matcher.fill_next_token_bitmask(reference._bitmask)
        xgr.apply_token_bitmask_inplace(expected, reference._bitmask, vocab_size=padded.vocab_size)
        ours.mask(logits)
        assert torch.equal(logits.float(), expected[0])
        assert torch.isinf(logits[len(tok.table.token_bytes) :]).all()  # padding: never
        token = int(logits.float().argmax())
        if token == tok.eos_id:
            break
        ours.accept(token)
        reference.accept(token)


def test_xgrammar_is_loaded_at_the_first_structured_request_not_at_start(dev_model) -> None:
    import os
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from mistral_serving.engines.pytorch.guided import GuidedDecoder\n"
        "from mistral_serving.text.tokenizer import load_tokenizer\n"
        f"decoder = GuidedDecoder(load_tokenizer(Path({str(dev_model)!r})))\n"
        "assert 'xgrammar' not in sys.modules, 'imported at start-up'\n"
        "from mistral_serving.structured.constraint import GuidedDecoding\n"
        "decoder.matcher(GuidedDecoding('json_object'))\n"
        "assert 'xgrammar' in sys.modules\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stderr
