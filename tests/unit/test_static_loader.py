"""The static engine's direct safetensors loader: transformers' parameters (names, values)
and rotary tables in our own modules (engines/pytorch/llama.py, which the static engine's forward
reads: its tokens equal HF generate's in test_pytorch_static_engine.py), without importing
transformers' modeling code; a logged fallback to `from_pretrained` for checkpoints it does
not recognise."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file
from transformers import AutoConfig, AutoModelForCausalLM

from mistral_gpu_fallback.static import llama
from mistral_gpu_fallback.static.engine import light_config, load_static_model
from mistral_serving.settings import Settings

CPU = torch.device("cpu")
ROOT = Path(__file__).resolve().parents[2]


def reference(model_dir: Path):
    return AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()


def load(model_dir: Path, dtype=torch.float32):
    """As the static engine loads: the direct loader, or transformers' when it declines."""
    settings = Settings(artifact=str(model_dir), device="cpu", torch_dtype=str(dtype)[6:])
    raw = json.loads((model_dir / "config.json").read_text())
    return load_static_model(model_dir, settings, raw).model


def test_the_direct_loader_holds_transformers_parameters(dev_model):
    ours, ref = load(dev_model), reference(dev_model)
    assert isinstance(ours, llama.CausalLM)
    assert list(ours.state_dict()) == list(ref.state_dict())
    for (name, a), b in zip(ours.state_dict().items(), ref.state_dict().values()):
        assert a.dtype == b.dtype and torch.equal(a, b), name
    assert torch.equal(ours.model.rotary_emb.inv_freq, ref.model.rotary_emb.inv_freq)
    assert ours.model.rotary_emb.attention_scaling == ref.model.rotary_emb.attention_scaling
    assert ours.get_input_embeddings().num_embeddings == ref.config.vocab_size


@pytest.mark.parametrize("seed", [0, 1])
def test_its_modules_compute_what_transformers_modules_do(dev_model, seed):
    ours, ref = load(dev_model), reference(dev_model)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(3, 5, ref.config.hidden_size, generator=g)
    a, b = ours.model.layers[0], ref.model.layers[0]
    with torch.no_grad():
        assert torch.equal(a.input_layernorm(x), b.input_layernorm(x))
        assert torch.equal(ours.model.norm(x.bfloat16()), ref.model.norm(x.bfloat16()))
        assert torch.equal(a.mlp.act_fn(x), b.mlp.act_fn(x))
        ids = torch.randint(0, ref.config.vocab_size, (2, 7), generator=g)
        assert torch.equal(ours.model.embed_tokens(ids), ref.model.embed_tokens(ids))


@pytest.mark.parametrize(
    "rope",
    [
        {"rope_type": "linear", "factor": 4.0},
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    ],
)
def test_scaled_rotary_tables_are_transformers_own(dev_model, tmp_path, rope):
    model = tmp_path / "rope"
    shutil.copytree(dev_model, model)
    config = json.loads((model / "config.json").read_text())
    config["rope_scaling"] = rope
    config.pop("rope_parameters", None)
    (model / "config.json").write_text(json.dumps(config))
    ours, ref = load(model), reference(model)
    assert ours.model.rotary_emb.rope_type == rope["rope_type"]
    assert torch.equal(ours.model.rotary_emb.inv_freq, ref.model.rotary_emb.inv_freq)
    assert ours.model.rotary_emb.attention_scaling == ref.model.rotary_emb.attention_scaling


def test_loading_does_not_import_transformers_modeling_code(dev_model):
    # transformers' model classes, nn.Embedding's init and Module.to_empty on the meta
    # device (torch._dynamo, sympy, scikit-learn) cost ~6 s of a warm start on the H200.
    script = (
        "import sys, torch; from pathlib import Path\n"
        "from transformers import AutoConfig\n"
        "from mistral_gpu_fallback.static.engine import load_static_model\n"
        "from mistral_serving.settings import TorchEngineSettings\n"
        f"d = Path({str(dev_model)!r})\n"
        "import json; raw = json.loads((d / 'config.json').read_text())\n"
        "load_static_model(d, TorchEngineSettings(device='cpu', max_seq_len=64), raw)\n"
        # transformers' auto model classes: in 5.17 importing them imports the modeling stack.
        "print(sorted(m for m in sys.modules if m.startswith(('transformers.models.mistral.m', "
        "'transformers.generation.utils', 'transformers.modeling_utils', 'sklearn', "
        "'transformers.models.auto.modeling_auto', 'torch._dynamo', 'sympy'))))\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT / "mistral-trt-truss/packages"))
    out = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip().splitlines()[-1] == "[]"


def _with_config(dev_model: Path, where: Path, change) -> Path:
    where.mkdir(parents=True, exist_ok=True)
    config = json.loads((dev_model / "config.json").read_text())
    change(config)
    (where / "config.json").write_text(json.dumps(config))
    return where


@hsettings(max_examples=25)
@given(
    theta=st.floats(min_value=10.0, max_value=1e7, allow_nan=False),
    old_layout=st.booleans(),
    kv_heads=st.sampled_from([1, 2, 4]),
    tied=st.booleans(),
)
def test_the_light_config_reads_what_the_model_class_reads(
    dev_model, tmp_path_factory, theta, old_layout, kv_heads, tied
):
    def change(config):
        config.update(num_key_value_heads=kv_heads, tie_word_embeddings=tied)
        if old_layout:  # transformers 4.x / Mistral-7B-v0.2's config.json: rope_theta on top
            del config["rope_parameters"]
            config["rope_theta"] = theta
        else:
            config["rope_parameters"] = {"rope_type": "default", "rope_theta": theta}

    model = _with_config(dev_model, tmp_path_factory.mktemp("light"), change)
    raw = json.loads((model / "config.json").read_text())
    light, full = light_config(raw), AutoConfig.from_pretrained(model)
    assert light is not None
    for key in ("hidden_size", "num_hidden_layers", "rms_norm_eps", "vocab_size",
                "max_position_embeddings", "tie_word_embeddings", "sliding_window", "hidden_act"):  # fmt: skip
        assert getattr(light, key) == getattr(full, key), key
    assert llama.kv_heads_of(light) == llama.kv_heads_of(full) == kv_heads
    assert llama.head_dim_of(light) == llama.head_dim_of(full)
    assert llama.unsupported(light) == llama.unsupported(full)
    a, b = llama.RotaryTables(light), llama.RotaryTables(full)
    assert torch.equal(a.inv_freq, b.inv_freq) and a.attention_scaling == b.attention_scaling


@pytest.mark.parametrize(
    "change",
    [
        lambda c: c.pop("num_key_value_heads"),  # Mistral's default (8) is the model class's
        lambda c: c.pop("sliding_window"),  # Mistral's default is 4096
        lambda c: c.pop("hidden_act"),  # the model classes' default (silu); the base has none
        lambda c: c.pop("tie_word_embeddings"),  # the base class's default is True
        lambda c: c.update(
            rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}
        ),
    ],
)
def test_the_light_config_declines_what_only_the_model_class_knows(dev_model, tmp_path, change):
    model = _with_config(dev_model, tmp_path / "m", change)
    assert light_config(json.loads((model / "config.json").read_text())) is None


def test_an_activation_it_lacks_falls_back_to_transformers(dev_model, tmp_path, caplog):
    model = tmp_path / "gelu"
    shutil.copytree(dev_model, model)
    config = json.loads((model / "config.json").read_text())
    config["hidden_act"] = "gelu"
    (model / "config.json").write_text(json.dumps(config))
    caplog.set_level(logging.INFO, logger="mistral_gpu_fallback.static.engine")
    loaded = load(model)
    assert "from_pretrained: activation gelu" in caplog.text
    assert not isinstance(loaded, llama.CausalLM)


def test_the_direct_loader_converts_to_the_requested_dtype(dev_model):
    ours = load(dev_model, torch.bfloat16)
    ref = reference(dev_model)
    weight = "model.layers.0.mlp.down_proj.weight"
    assert ours.state_dict()[weight].dtype == torch.bfloat16
    assert torch.equal(ours.state_dict()[weight], ref.state_dict()[weight].to(torch.bfloat16))


def test_unknown_tensor_names_fall_back_to_transformers(dev_model, tmp_path, caplog):
    model = tmp_path / "extra"
    shutil.copytree(dev_model, model)
    shard = next(model.glob("*.safetensors"))
    tensors = load_file(shard)
    tensors["model.extra.weight"] = torch.zeros(2)  # a name the model does not have
    save_file(tensors, shard, metadata={"format": "pt"})
    caplog.set_level(logging.INFO, logger="mistral_gpu_fallback.static.engine")
    loaded = load(model)
    assert "from_pretrained: checkpoint names differ" in caplog.text
    assert "model.extra.weight" in caplog.text
    assert torch.equal(loaded.lm_head.weight, reference(dev_model).lm_head.weight)


def test_a_checkpoint_without_safetensors_falls_back(dev_model, tmp_path, caplog):
    model = tmp_path / "bin"
    shutil.copytree(dev_model, model)
    ref = reference(dev_model)
    for shard in model.glob("*.safetensors"):
        shard.unlink()
    torch.save(ref.state_dict(), model / "pytorch_model.bin")
    caplog.set_level(logging.INFO, logger="mistral_gpu_fallback.static.engine")
    loaded = load(model)
    assert "no safetensors files" in caplog.text
    assert torch.equal(loaded.lm_head.weight, ref.lm_head.weight)


def test_a_llama_config_needs_no_sliding_window_key(dev_model):
    # LlamaConfig has no sliding_window field: its config.json never carries the key.
    raw = json.loads((dev_model / "config.json").read_text())
    raw.pop("sliding_window")
    assert light_config(raw) is None  # Mistral: the model class's default (4096) applies
    raw.update(model_type="llama", architectures=["LlamaForCausalLM"])
    light = light_config(raw)
    assert light is not None and getattr(light, "sliding_window", None) is None
