"""The static engine's direct safetensors loader: the same model as transformers'
`from_pretrained`, and a logged fallback to it for checkpoints it does not recognise."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoConfig, AutoModelForCausalLM

from mistral_serving.engines.pytorch_static import load_safetensors_direct

CPU = torch.device("cpu")


def reference(model_dir: Path):
    return AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()


def load(model_dir: Path, dtype=torch.float32):
    config = AutoConfig.from_pretrained(str(model_dir))
    return load_safetensors_direct(model_dir, config, dtype, CPU).eval()


@pytest.mark.parametrize("seed", [0, 1])
def test_the_direct_loader_builds_the_same_model(dev_model, seed):
    ours, ref = load(dev_model), reference(dev_model)
    assert list(ours.state_dict()) == list(ref.state_dict())
    for (name, a), b in zip(ours.state_dict().items(), ref.state_dict().values()):
        assert torch.equal(a, b), name
    assert torch.equal(ours.model.rotary_emb.inv_freq, ref.model.rotary_emb.inv_freq)
    ids = torch.randint(100, 31000, (2, 9), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        assert torch.equal(ours(ids).logits, ref(ids).logits)


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
    caplog.set_level(logging.INFO, logger="mistral_serving.engines.pytorch_static")
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
    caplog.set_level(logging.INFO, logger="mistral_serving.engines.pytorch_static")
    loaded = load(model)
    assert "no safetensors files" in caplog.text
    assert torch.equal(loaded.lm_head.weight, ref.lm_head.weight)
