"""GPU benchmark of the PyTorch engine and the service, one step per subcommand;
`bench/run_gpu.sh PART` runs them on a GPU machine (docs/performance.md, "Reproducing").
Prints one JSON line per figure (and appends it to --out). The code is in bench/gpu/.

  make-artifact DIR   a Mistral-7B-shaped bf16 checkpoint with random weights (no download),
                      saved as safetensors with the dev tokenizer files beside it
  prepare-verify DIR  a build manifest for DIR (sha256 of every file), then the artifact
                      check twice with verify_hashes on: hashing (first start after a
                      download) and the verified marker (every later start)
  engine DIR          in-process: cold load (the direct safetensors loader, and with
                      --compare-loaders transformers' loader first), the engine the factory
                      picks by default at several concurrency levels, the GPU time of one
                      captured step, and with --correctness the static engine's greedy
                      tokens teacher-forced through an fp32 reference vs plain HF bf16
  service DIR APP     the real Truss server on DIR: start-to-ready, then the load of
                      `python -m client bench` (client/bench.py) at several concurrency levels
  peer DIR            `transformers serve --continuous-batching` on DIR (bench/
                      peer_serve.py), the same client with text prompts

`engine --set KEY=VALUE` runs the sweep with those settings (e.g. prefill_chunk_tokens);
`service --guidellm` runs guidellm (from the package index, an independent load generator)
at the same levels after the project's client, `service --aiperf` NVIDIA's AIPerf the same
way (2 requests per stream, streamed /v1/completions, `figure="aiperf"` rows with
guidellm's keys; GUIDELLM_PY / AIPERF_PY name their pythons; --aiperf-token-ids: AIPerf
sends our client's token-id bodies); `service --guided N` times N concurrent chat streams
with a nested-object json_schema against N plain ones, `--guided-rounds` times.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.gpu.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(__doc__.splitlines()[0]))
