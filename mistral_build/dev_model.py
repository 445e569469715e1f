"""`python build.py dev-model`: a tiny random-weight Mistral with the real Mistral-7B
tokenizer, laid out as the same kind of artifact `load()` pulls (a Hugging Face
checkpoint with tokenizer files and a build manifest). It produces meaningless text;
it exists so that the whole service runs, deterministically, on a CPU."""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

from mistral_build.paths import DEV_MODEL_DIR
from mistral_build.publish import finish_artifact
from mistral_serving.manifest import BuildManifest, read_manifest

SEED = 0
DEV_CONFIG = dict(
    vocab_size=32000,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=4096,
    rope_theta=1e6,
    sliding_window=None,
    tie_word_embeddings=False,
    bos_token_id=1,
    eos_token_id=2,
)
DEV_MODEL_NAME = "dev/tiny-random-mistral"


def mistral_tokenizer_model() -> Path:
    """The real Mistral-7B SentencePiece model, shipped inside `mistral-common`."""
    import mistral_common

    path = Path(mistral_common.__file__).parent / "data" / "tokenizer.model.v1"
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: install mistral-common>=1.8")
    return path


def write_tokenizer(out: Path) -> None:
    """tokenizer.model (SentencePiece, used for exact encoding) plus the Hugging Face
    files converted from it (tokenizer.json etc.), as a Hugging Face repo ships them."""
    from transformers import LlamaTokenizer

    shutil.copyfile(mistral_tokenizer_model(), out / "tokenizer.model")
    tok = LlamaTokenizer.from_pretrained(out, legacy=False, clean_up_tokenization_spaces=False)
    tok.save_pretrained(out)
    # transformers 5 writes `extra_special_tokens` as a list (here only <s> and </s>
    # again); 4.57 (the TensorRT-LLM image's pin) expects a dict and fails to load it.
    config_path = out / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    if isinstance(config.get("extra_special_tokens"), list):
        del config["extra_special_tokens"]
        config_path.write_text(json.dumps(config, indent=2) + "\n")


def build_dev_model(out: Path = DEV_MODEL_DIR, force: bool = False) -> Path:
    if not force and read_manifest(out) is not None:
        print(f"dev model: up to date at {out}")
        return out
    import torch
    import transformers
    from transformers import GenerationConfig, MistralConfig, MistralForCausalLM

    started = time.monotonic()
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    torch.manual_seed(SEED)
    config = MistralConfig(**DEV_CONFIG)
    model = MistralForCausalLM(config).to(torch.float32).eval()
    model.save_pretrained(tmp, safe_serialization=True)
    GenerationConfig(bos_token_id=1, eos_token_id=2).save_pretrained(tmp)
    write_tokenizer(tmp)
    # The same finishing code as a TensorRT-LLM engine (tokenizer check + manifest), so the
    # dev artifact is published and pulled exactly like a production one.
    finish_artifact(
        tmp,
        tmp,
        BuildManifest(
            kind="hf_checkpoint",
            source_model=DEV_MODEL_NAME,
            versions={"transformers": transformers.__version__, "torch": torch.__version__},
            build_options={"seed": SEED, "dtype": "float32", **DEV_CONFIG},
        ),
    )
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    print(f"dev model: built at {out} in {time.monotonic() - started:.1f}s")
    return out


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("dev-model", help="Build the tiny random-weight dev model (CPU).")
    p.add_argument("--out", type=Path, default=DEV_MODEL_DIR, help="Output directory.")
    p.add_argument("--force", action="store_true", help="Rebuild even if present.")
    p.set_defaults(func=lambda a: build_dev_model(a.out, a.force) and 0)
