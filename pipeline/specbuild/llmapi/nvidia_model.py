"""The `tensorrt_llm` model of an llmapi repository with runtime "tensorrt_llm": NVIDIA's own model.py.

specbuild does not ship NVIDIA's code: the Triton TensorRT-LLM image carries it at
/app/all_models/llmapi/tensorrt_llm/1/{model.py,helpers.py} (tensorrtllm_backend
dockerfile/Dockerfile.triton.trt_llm_backend @r26.05 copies triton_backend/all_models to /app;
triton-inference-server/tutorials Feature_Guide/Speculative_Decoding/TRT-LLM/README.md @e848952 serves
it from there). This shim loads that file (or the one in $SPECBUILD_LLMAPI_MODEL_DIR) and exposes its
TritonPythonModel. NVIDIA's model reads model.yaml from pb_utils.get_model_dir(), i.e. this repository's
tensorrt_llm/1/, where `specbuild repo` wrote it; `from helpers import ...` finds helpers.py because
NVIDIA's folder goes first on sys.path. The class is wrapped three times, NVIDIA's code unchanged: by the serving
gate's check (specbuild.contract.serving_gate.gated: while `specbuild serve` drains, new requests are refused
with UNAVAILABLE), by `specbuild.llmapi.end_ids.every_end_id` (the checkpoint's other end ids go with every
request as stop_token_ids, so generation stops at all of them) and by
`specbuild.llmapi.answered.every_request_answered` (a non-streaming request a `stop` request aborted gets CANCELLED
instead of no answer). Unproven on a GPU from here (docs/llmapi.md).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

from specbuild.contract.llmapi import NVIDIA_MODEL_DIR
from specbuild.contract.serving_gate import gated
from specbuild.llmapi.answered import every_request_answered
from specbuild.llmapi.end_ids import every_end_id


def _load():
    folder = Path(os.environ.get("SPECBUILD_LLMAPI_MODEL_DIR") or NVIDIA_MODEL_DIR)
    source = folder / "model.py"
    if not source.is_file():
        raise FileNotFoundError(
            f"NVIDIA's llmapi model.py is not at {source}: this repository (runtime tensorrt_llm) runs in the Triton "
            "TensorRT-LLM image (docker/Dockerfile.llmapi), or set SPECBUILD_LLMAPI_MODEL_DIR to the folder holding "
            "model.py and helpers.py. On a CPU machine regenerate it with `specbuild repo --backend llmapi "
            "--runtime reference`."
        )
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
    spec = importlib.util.spec_from_file_location("tensorrt_llm_llmapi_model", source)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.TritonPythonModel


TritonPythonModel = gated(every_end_id(every_request_answered(_load())))
