"""The engines' logits dtype: its names, and which one a pair has (what the LLM models must declare for
generation_logits and draft_logits).

Where it comes from, first match wins:
1. a built engine: the reference engine's engine.json `logits_dtype` (older reference engines, without
   the field, served float32), or a TensorRT-LLM engine's config.json `pretrained_config.logits_dtype`;
2. the converted checkpoint's config.json `logits_dtype`: trtllm-build keeps it, since specbuild passes
   no `--logits_dtype` (NVIDIA/TensorRT-LLM `tensorrt_llm/commands/build.py` `build_model` replaces it
   only when that flag is given); a checkpoint without it gets PretrainedConfig's default, float32;
3. before convert: what modelopt will write, "float16" for a bfloat16 model and the model's dtype
   otherwise (NVIDIA/Model-Optimizer `modelopt/torch/export/tensorrt_llm_utils.py`
   `convert_to_tensorrt_llm_config`, nvidia-modelopt 0.47.0).

The C++ backend takes the declared type from the model config and checks every returned
generation_logits tensor against the engine's (NVIDIA/TensorRT-LLM `triton_backend/inflight_batcher_llm/
src/model_instance_state.cc`, commit c8c6df0: `TLLM_CHECK(generationLogitsType ==
model_state_->getLogitsDataType())`), and Triton checks every draft_logits input against the declared
type; the draft's logits feed the target's draft_logits, so both engines must agree.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from specbuild.config import Spec
from specbuild.errors import SpecError

LOGITS_DTYPES = {"float16": np.float16, "float32": np.float32}  # trtllm-build --logits_dtype choices
TRITON_TYPES = {"float16": "TYPE_FP16", "float32": "TYPE_FP32"}  # the same, as Triton DataType names
NUMPY_NAMES = {triton: name for name, triton in TRITON_TYPES.items()}  # "TYPE_FP16" -> "float16"
DEFAULT = "float32"  # PretrainedConfig's logits_dtype


def engine_logits(logits: np.ndarray, logits_dtype: str) -> np.ndarray:
    """The logits as the engine hands them out: in its logits dtype (trtllm-build --logits_dtype, else the
    checkpoint's logits_dtype)."""
    if logits_dtype not in LOGITS_DTYPES:
        raise ValueError(f"logits dtype {logits_dtype!r} is not one of {sorted(LOGITS_DTYPES)}")
    return np.asarray(logits).astype(LOGITS_DTYPES[logits_dtype])


def modelopt_logits_dtype(dtype: str) -> str:
    return "float16" if dtype == "bfloat16" else dtype


def _json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def role_logits_dtype(spec: Spec, role: str, engine_dir: Path) -> tuple[str, str]:
    """(dtype, where it was read) for one role; engine_dir: where the role's engine is (or will be) on this machine."""
    engine = _json(engine_dir / "engine.json")
    if engine is not None:
        return str(engine.get("logits_dtype") or DEFAULT), f"{engine_dir / 'engine.json'}"
    built = _json(engine_dir / "config.json")
    if built is not None and isinstance(built.get("pretrained_config"), dict):
        return str(built["pretrained_config"].get("logits_dtype") or DEFAULT), f"{engine_dir / 'config.json'}"
    checkpoint = spec.pair_dir / role / "checkpoint" / "config.json"
    converted = _json(checkpoint)
    if converted is not None:
        return str(converted.get("logits_dtype") or DEFAULT), str(checkpoint)
    return modelopt_logits_dtype(spec.role(role).dtype), f"the spec's {role}.dtype (what convert will write)"


def pair_logits_datatype(spec: Spec, engine_dirs: dict[str, Path]) -> str:
    """The Triton data type ("TYPE_FP16" / "TYPE_FP32") both LLM models declare (the target's alone, without a draft)."""
    found = {role: role_logits_dtype(spec, role, engine_dirs[role]) for role in spec.roles}
    (target, target_from), (draft, draft_from) = found["target"], found.get("draft", found["target"])
    for dtype, source in found.values():
        if dtype not in TRITON_TYPES:
            raise SpecError(
                f"logits dtype {dtype!r} (from {source}) is not one trtllm-build supports "
                f"({', '.join(TRITON_TYPES)}): convert the checkpoint again."
            )
    if target != draft:
        raise SpecError(
            f"the target's logits are {target} (from {target_from}) but the draft's are {draft} (from "
            f"{draft_from}): the draft's logits feed the target's draft_logits input, so both must match. "
            "Give [target] and [draft] the same dtype, then convert and build again."
        )
    return TRITON_TYPES[target]
