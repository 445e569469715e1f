"""The two TensorRT-LLM engine kinds (a built engine; the PyTorch backend on a checkpoint)
and the checks on an engine directory before it starts."""
