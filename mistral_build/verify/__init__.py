"""`python build.py verify-gpu`: the whole serving path checked on this machine in one command.

For each engine kind asked for it
1. makes the artifact (`artifact.py`): a tiny Mistral-shaped checkpoint with random weights
   (the dev model's code, two layers, head_dim 64, float16) and, for `tensorrt_llm`, an
   engine built from it by the same code as `build.py engine` (checkpoint conversion +
   `trtllm-build` subprocesses; minutes, no download);
2. starts the real Truss server on it (`local_server.LocalServer`, as `make serve`'s
   launcher and the end-to-end tests do);
3. runs engine-agnostic end-to-end checks over HTTP (`checks.py`, `lifecycle.py`), each a
   plain function returning its detail line, raising CheckWarned (WARN) or anything else
   (FAIL): the NVIDIA driver against the image's CUDA (`driver.py`), streaming equals
   non-streaming, stop strings, penalties, concurrency, a prompt longer than
   max_num_tokens, logprobs, the KV-cache gauge, abort on disconnect, abort of a
   streamed-logprobs request, 503 past the queue, /health and /v1/models; a short benchmark
   (`bench.py`); and last the drain on SIGTERM, timed;
4. writes one report (`report.py`: report.json and report.md with checks, figures,
   versions, GPU) and exits 1 if any check failed (a WARN does not fail it).

Greedy answers are compared by token-prefix agreement (`judges.py`). The command line and
the run of one kind are in `cli.py`; the HTTP helpers the checks share in `wire.py`; the
verdict bookkeeping in `results.py`; the run's fixed settings in `config.py`.

Kinds: `tensorrt_llm` (TensorRT engine), `trtllm_pytorch` (TensorRT-LLM's PyTorch backend
on the checkpoint; no build), `all` (both), and `pytorch` (the dev model on our own PyTorch
engine, CPU: how CI runs this command without a GPU).
"""
