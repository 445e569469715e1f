"""The figures behind the structured-output limits (docs/reliability.md): each schema is
compiled in a fresh process (real xgrammar, the dev model's Mistral tokenizer, the same
options as the server), killed past a time limit.

    .venv/bin/python bench/grammar_limits_bench.py [--timeout 25] [NAME ...]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "mistral-trt-truss" / "packages"))


def deep(levels: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    return schema


CASES: dict[str, dict] = {
    "object-with-enum": {
        "type": "object",
        "properties": {"answer": {"enum": ["yes", "no"]}, "n": {"type": "integer"}},
        "required": ["answer", "n"],
    },
    "enum-1000": {"type": "string", "enum": [f"value-{i:06d}" for i in range(1000)]},
    "enum-5000": {"type": "string", "enum": [f"value-{i:06d}" for i in range(5000)]},
    "properties-200": {
        "type": "object",
        "properties": {f"p{i}": {"type": "string"} for i in range(200)},
    },
    "nested-20": deep(20),
    "pattern-1000": {"type": "string", "pattern": "[a-z]{0,1000}"},
    "pattern-nested-1000": {"type": "string", "pattern": "((a{0,10}){0,10}){0,10}"},
    "pattern-5000": {"type": "string", "pattern": "[a-z]{0,5000}"},
    "maxLength-100000": {"type": "string", "maxLength": 100000},
    "pattern-bomb-27000": {"type": "string", "pattern": "((a{0,30}){0,30}){0,30}"},
}


def _child(text: str, out) -> None:
    import xgrammar as xgr

    from mistral_serving.text.tokenizer import load_tokenizer

    tok = load_tokenizer(ROOT / ".cache" / "dev-model")
    info = xgr.TokenizerInfo(
        [b or b"" for b in tok.table.token_bytes],
        xgr.VocabType.RAW,
        vocab_size=len(tok.table.token_bytes),
        stop_token_ids=sorted({tok.eos_id, *tok.stop_token_ids}),
    )
    compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
    started = time.perf_counter()
    compiled = compiler.compile_json_schema(text, any_whitespace=False)
    out.put((time.perf_counter() - started, compiled.memory_size_bytes))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("names", nargs="*", default=list(CASES))
    parser.add_argument("--timeout", type=float, default=25.0)
    args = parser.parse_args()
    ctx = mp.get_context("spawn")
    for name in args.names:
        text = json.dumps(CASES[name])
        out = ctx.Queue()
        proc = ctx.Process(target=_child, args=(text, out))
        proc.start()
        try:
            seconds, memory = out.get(timeout=args.timeout + 30)  # + the child's start
            print(f"{name}: {len(text)} B, compile {seconds * 1000:.1f} ms, {memory} B")
        except Exception:  # noqa: BLE001 - queue.Empty: still compiling
            print(f"{name}: {len(text)} B, no answer within the limit (killed)")
        proc.kill()
        proc.join()


if __name__ == "__main__":
    main()
