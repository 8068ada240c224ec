"""NVIDIA's image the GPU paths run in, one constant, which docker/ (the Dockerfiles' BASE_IMAGE, compose's
defaults) and the docs follow; tests/test_build_docker.py holds them to it.

Triton's release compatibility matrix (triton-inference-server/server docs/introduction/compatibility.md, read on
branch r26.07 at 819ee37) pairs the `<yy.mm>-trtllm-python-py3` tags 26.04 to 26.07 with TensorRT-LLM 1.2.1, and
tensorrtllm_backend's branches r26.04 to r26.07 pin TENSORRTLLM_VER=1.2.1: the newest of them is the default.
"""

TRITON_IMAGE = "nvcr.io/nvidia/tritonserver:26.07-trtllm-python-py3"  # both GPU paths: Triton + TensorRT-LLM 1.2.1
