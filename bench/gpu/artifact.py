"""The artifact every GPU figure uses: a Mistral-7B-shaped bf16 checkpoint with random
weights (no download), and the time the server's hash check takes on it."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

from bench.gpu.common import drop_page_cache, emit

MISTRAL_7B = dict(
    vocab_size=32000,
    hidden_size=4096,
    intermediate_size=14336,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=8,
    max_position_embeddings=32768,
    rope_theta=1e6,
    sliding_window=None,
    bos_token_id=1,
    eos_token_id=2,
)
TINY = dict(  # --tiny: the same code on a CPU in seconds
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=4096,
)


def make_artifact(args) -> None:
    """DIR: the model saved as safetensors (5 GB shards), the dev tokenizer files beside it."""
    import torch
    from transformers import AutoModelForCausalLM, MistralConfig

    shape = MISTRAL_7B | (TINY if args.tiny else {})
    t = time.perf_counter()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(MistralConfig(**shape), dtype=torch.bfloat16)
    init_s = time.perf_counter() - t
    out = Path(args.dir)
    shutil.rmtree(out, ignore_errors=True)
    t = time.perf_counter()
    model.save_pretrained(out, max_shard_size="5GB")
    save_s = time.perf_counter() - t
    for name in ("tokenizer.model", "tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(Path(args.tokenizer_from) / name, out / name)
    size = sum(f.stat().st_size for f in out.glob("*.safetensors"))
    emit(
        figure="artifact",
        init_s=round(init_s, 1),
        save_s=round(save_s, 1),
        safetensors_GB=round(size / 1e9, 2),
    )


def prepare_verify(args) -> None:
    """Write DIR's build manifest (hashing the shards in parallel), then check the
    artifact as the server does, twice, with verify_hashes on: hashing (the first start
    after a download) and the verified marker (every later start)."""
    import hashlib
    from concurrent.futures import ThreadPoolExecutor

    from mistral_serving.artifacts.artifact import open_artifact
    from mistral_serving.artifacts.manifest import MANIFEST_NAME, BuildManifest, FileRecord
    from mistral_serving.settings import Settings

    artifact = Path(args.dir)

    def digest(path: Path) -> tuple[str, FileRecord]:
        h = hashlib.sha256()
        with path.open("rb") as f:
            while chunk := f.read(16 * 2**20):
                h.update(chunk)
        return path.name, FileRecord(size=path.stat().st_size, sha256=h.hexdigest())

    files = sorted(f for f in artifact.iterdir() if f.is_file() and f.name != MANIFEST_NAME)
    with ThreadPoolExecutor(8) as pool:
        records = dict(pool.map(digest, files))
    manifest = BuildManifest(kind="hf_checkpoint", source_model="random-weights", files=records)
    (artifact / MANIFEST_NAME).write_text(json.dumps(manifest.model_dump(mode="json"), indent=2))
    settings = Settings(artifact=str(artifact), verify_hashes=True, cache_dir=args.verify)
    for start in ("first (hashes every file, writes the marker)", "second (marker)"):
        cold = drop_page_cache()
        t = time.perf_counter()
        open_artifact(artifact, settings)
        emit(
            figure="artifact_check",
            start=start,
            seconds=round(time.perf_counter() - t, 2),
            page_cache_dropped=cold,
        )
