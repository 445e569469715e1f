"""The PyTorch engine's static KV cache: preallocated KV slots, our own Llama forward,
fused kernels (Triton on a GPU), CUDA graphs, weights copied into preallocated tensors."""
