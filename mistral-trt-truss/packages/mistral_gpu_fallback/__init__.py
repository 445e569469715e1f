"""The GPU fallback: what a TensorRT-LLM deployment never runs, kept out of the serving
core (`mistral_serving`), which reaches it only through `engines/fallback.py`:

- `static/`: the PyTorch engine's static KV cache (its own Llama forward, fused kernels,
  CUDA graphs, batched grammar masks);
- `process/`: the engine in a process of its own, and one engine process shared by
  several front-end processes (`frontends.py`, their launcher);
- `replay.py`: the replay engine, for benchmarks of the serving path.

It imports the core; the core never imports it. An image for the TensorRT-LLM engine
kinds leaves it out."""
