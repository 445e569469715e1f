"""Tokenizer files as the CPU artifacts ship them, whichever model they hold (the dev Mistral
and SmolLM2 share this; kept apart so neither builder imports the other for it)."""

from __future__ import annotations

import json
from pathlib import Path


def portable_tokenizer_config(out: Path, updates: dict[str, object] | None = None) -> None:
    """Make tokenizer_config.json load in transformers 4.57 (the TensorRT-LLM image's pin)
    as well as 5: transformers 5 writes `extra_special_tokens` as a list (4.57 expects a
    dict and fails; the tokens stay in tokenizer.json's added_tokens) and facts about the
    machine that saved it (`is_local`, `local_files_only`)."""
    config_path = out / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    if isinstance(config.get("extra_special_tokens"), list):
        del config["extra_special_tokens"]
    for key in ("is_local", "local_files_only"):
        config.pop(key, None)
    config.update(updates or {})
    config_path.write_text(json.dumps(config, indent=2) + "\n")
