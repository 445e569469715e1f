"""config.json's architecture fields are validated at load (engines/factory.ModelConfig):
an absurd value refuses the load in one line naming the field, before any engine sizes a
tensor or a limit from it; real configs pass. Fuzzed with hypothesis: any JSON object
either validates or gets that one-line ArtifactError, never another exception."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mistral_serving.artifacts.manifest import ArtifactError
from mistral_serving.engines.factory import check_model_config, start_engine, start_torch_engine
from mistral_serving.settings import Settings

WHERE = "ckpt/config.json"
FIELDS = [
    "max_position_embeddings",
    "num_hidden_layers",
    "hidden_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "intermediate_size",
    "vocab_size",
    "rms_norm_eps",
    "rope_theta",
    "sliding_window",
    "tie_word_embeddings",
    "architectures",
]
# Published checkpoints' values (Mistral-7B-Instruct-v0.2, SmolLM2-135M, Llama-3.1-8B).
REAL = [
    {"max_position_embeddings": 32768, "num_hidden_layers": 32, "hidden_size": 4096,
     "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
     "vocab_size": 32000, "rms_norm_eps": 1e-05, "rope_theta": 1000000.0,
     "sliding_window": None, "tie_word_embeddings": False,
     "architectures": ["MistralForCausalLM"]},
    {"max_position_embeddings": 8192, "num_hidden_layers": 30, "hidden_size": 576,
     "num_attention_heads": 9, "num_key_value_heads": 3, "intermediate_size": 1536,
     "vocab_size": 49152, "rms_norm_eps": 1e-05, "rope_theta": 100000,
     "tie_word_embeddings": True, "architectures": ["LlamaForCausalLM"]},
    {"max_position_embeddings": 131072, "num_hidden_layers": 32, "hidden_size": 4096,
     "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
     "intermediate_size": 14336, "vocab_size": 128256, "rope_theta": 500000.0,
     "rope_scaling": {"rope_type": "llama3", "factor": 8.0}},
]  # fmt: skip


def test_the_dev_model_and_real_configs_pass(dev_model: Path) -> None:
    check_model_config(json.loads((dev_model / "config.json").read_text()), WHERE)
    for config in REAL:
        assert (
            check_model_config(config, WHERE).max_position_embeddings
            == (config["max_position_embeddings"])
        )


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_position_embeddings", 1e12),
        ("max_position_embeddings", 10**12),
        ("max_position_embeddings", 1),
        ("num_hidden_layers", -1),
        ("num_hidden_layers", 0),
        ("num_hidden_layers", True),
        ("hidden_size", "4096"),
        ("hidden_size", 2**40),
        ("num_attention_heads", 0),
        ("vocab_size", 10**9),
        ("intermediate_size", -5),
        ("head_dim", 0),
        ("rms_norm_eps", 0),
        ("rms_norm_eps", float("nan")),
        ("rope_theta", -1.0),
        ("sliding_window", 0),
        ("tie_word_embeddings", "yes"),
        ("architectures", "MistralForCausalLM"),
    ],
)
def test_an_absurd_field_is_refused_in_one_line_naming_it(field: str, value: object) -> None:
    config = dict(REAL[0], **{field: value})
    with pytest.raises(ArtifactError) as err:
        check_model_config(config, WHERE)
    message = str(err.value)
    assert message.startswith(f"{WHERE}: {field}") and "\n" not in message


def test_heads_that_do_not_divide_are_refused() -> None:
    with pytest.raises(ArtifactError, match="num_key_value_heads 7"):
        check_model_config(dict(REAL[0], num_key_value_heads=7), WHERE)
    with pytest.raises(ArtifactError, match="hidden_size 4095"):
        check_model_config(dict(REAL[0], hidden_size=4095), WHERE)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)  # fmt: skip


@settings(max_examples=500, deadline=None)
@given(
    config=st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=12), JSON, max_size=10) | JSON
)
def test_fuzzed_configs_validate_or_get_one_line(config: object) -> None:
    try:
        checked = check_model_config(config, WHERE)
    except ArtifactError as exc:
        message = str(exc)
        assert message.startswith(WHERE + ": ") and "\n" not in message and len(message) < 500
        return
    # What passed is within the bounds the engines rely on.
    assert (
        checked.max_position_embeddings is None or 2 <= checked.max_position_embeddings <= 1 << 24
    )
    assert checked.num_hidden_layers is None or 1 <= checked.num_hidden_layers <= 1024


def test_the_engines_refuse_an_absurd_config_at_load(tmp_path: Path, dev_model: Path) -> None:
    """`start_torch_engine` (what the engine process runs too) refuses before loading."""
    (tmp_path / "config.json").write_text(json.dumps(dict(REAL[0], num_hidden_layers=-1)))
    with pytest.raises(ArtifactError, match="num_hidden_layers"):
        start_torch_engine(tmp_path, Settings(artifact=str(tmp_path), device="cpu"), 2)


def test_start_engine_refuses_an_absurd_checkpoint_config(tmp_path: Path) -> None:
    from mistral_serving.artifacts.artifact import Artifact

    artifact = Artifact(
        path=tmp_path,
        kind="hf_checkpoint",
        manifest=None,
        config=dict(REAL[0], max_position_embeddings=10**12),
    )
    settings_ = Settings(artifact=str(tmp_path), device="cpu", engine="trtllm_pytorch")
    with pytest.raises(ArtifactError, match="max_position_embeddings"):
        start_engine(artifact, settings_, tokenizer=None)  # type: ignore[arg-type]
