"""The PyTorch engines (transformers' model, or our own decoder with CUDA graphs), their
loader, prefill budget, CPU sizing and xgrammar guided decoding."""
