"""The TensorRT-LLM release the image is built on and the engines are built with.

A neutral module: the image (`image.py`), the Truss config (`truss_config.py`), the engine
build (`engine.py`) and the manifests read these facts from here, so none of them has to
import another for a constant.
"""

from __future__ import annotations

# The TensorRT-LLM version our engines are built with, and NVIDIA's release container
# for it (nvcr.io/nvidia/tensorrt-llm/release:<version>, see TensorRT-LLM's
# docs/source/installation/containers.md). Engines only run on the TensorRT version they
# were built with, so the base image and the engine builder must use the same tag.
TRTLLM_VERSION = "1.2.1"
BASE_IMAGE = f"nvcr.io/nvidia/tensorrt-llm/release:{TRTLLM_VERSION}"
# The release image derives from NGC's PyTorch container 25.12 (Ubuntu 24.04, system
# Python 3.12, packages in /usr/local/lib/python3.12/dist-packages, CUDA 13.0).
BASE_IMAGE_PYTHON = "/usr/bin/python3"
BASE_IMAGE_PYTHON_VERSION = "3.12"
BASE_IMAGE_CUDA = "13.0"
TINI = "/usr/bin/tini"  # Ubuntu 24.04's `tini` package, PID 1 of every container we run

# Open files: the server holds one descriptor per connection, and containerd 2.x gives a
# container a soft limit of 1024 (hard 524288) where 1.x gave 1048576. Every container
# we run raises its soft limit to NOFILE, or to the hard limit where that is lower; a
# pod spec cannot set it.
NOFILE = 65536
RAISE_NOFILE = (
    'n=$(ulimit -H -n); { [ "$n" = unlimited ] || [ "$n" -ge '
    f'{NOFILE} ]; }} && n={NOFILE}; ulimit -S -n "$n"'
)
