"""The names of the models in a Triton repository for the pair: NVIDIA's inflight_batcher_llm names
(NVIDIA/TensorRT-LLM triton_backend/all_models/inflight_batcher_llm), which existing clients call, plus the serving
gate (`contract.serving_gate.MODEL_NAME`). Every module that names one of these models imports it from here."""

from __future__ import annotations

import re

PREPROCESSING = "preprocessing"
POSTPROCESSING = "postprocessing"
TARGET = "tensorrt_llm"  # the target engine's model (and the llmapi repository's one model: contract.llmapi)
DRAFT = "tensorrt_llm_draft"
BLS = "tensorrt_llm_bls"  # the speculative BLS: specbuild's entry point, and the client's default model
ENSEMBLE = "ensemble"  # target only, NVIDIA's pipeline without speculation

ENTRY_MODELS = (BLS, ENSEMBLE)  # what clients call on the engine path, the canary's first

# Triton's answer for a request to a model whose Python stub fails its health check: dead, or alive but not
# answering (frozen, hung) (python_backend r24.10 src/python_be.cc: "Stub process '<instance>' is not healthy.").
# The supervisor reads it in the server log to find such a stub; the client reads it as a request the server did not
# serve (resumed like a cut stream, once the stub is back).
UNHEALTHY_STUB = re.compile(r"Stub process '([^']+)' is not healthy")
