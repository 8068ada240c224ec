"""The config.json edits TensorRT-LLM's `quantize.py` makes after modelopt's export, plus two of ours.

From NVIDIA/TensorRT-LLM `tensorrt_llm/quantization/quantize_by_modelopt.py` (read at 042c510):
- `model_type` and `architecture` = the Hugging Face class name;
- int8_wo / int4_wo / none: quant_algo = W8A16 / W4A16 / null (modelopt exported float weights);
- `rotary_scaling` from the HF `rope_scaling` when absent;
- fp8 without an FP8 KV cache: kv_cache_quant_algo = null.
Ours:
- `rotary_base` from `rope_theta`: transformers 5 keeps it inside `rope_parameters`, where
  modelopt 0.47 does not look, so the export would silently fall back to TensorRT-LLM's 10000;
- kv_cache_quant_algo = FP8 when the spec asks for an FP8 KV cache (checked, not assumed).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from specbuild.convert.formats import KV_CACHE_QUANT_ALGO, QuantFormat


def hf_rope(hf_config: Mapping[str, Any]) -> tuple[float | None, dict[str, Any] | None]:
    """(rope_theta, rope scaling dict or None) from a transformers 4 or 5 config.json."""
    params = hf_config.get("rope_parameters")
    params = dict(params) if isinstance(params, Mapping) else {}
    theta = hf_config.get("rope_theta", params.get("rope_theta"))
    scaling = hf_config.get("rope_scaling")
    if not isinstance(scaling, Mapping):
        scaling = {k: v for k, v in params.items() if k != "rope_theta"}
    scaling = dict(scaling) if scaling else None
    if scaling is not None:
        kind = scaling.get("rope_type", scaling.get("type"))
        if kind in (None, "default"):
            scaling = None
        else:
            scaling.setdefault("type", kind)  # TensorRT-LLM reads "type"; HF writes "rope_type"
            scaling.setdefault("rope_type", kind)
    return (float(theta) if theta is not None else None), scaling


def apply_fixups(
    trt_config: dict[str, Any],
    hf_config: Mapping[str, Any],
    fmt: QuantFormat,
    kv_cache: str,
    architecture: str,
    model_type: str,
) -> tuple[dict[str, Any], list[str]]:
    """The fixed config and a list of the edits made (for the manifest)."""
    config = copy.deepcopy(trt_config)
    quant = config.setdefault("quantization", {})
    edits: list[str] = []

    def put(where: dict[str, Any], key: str, value: Any, label: str) -> None:
        if where.get(key, "<absent>") != value:
            edits.append(f"{label}: {where.get(key, '<absent>')!r} -> {value!r}")
            where[key] = value

    put(config, "model_type", model_type, "model_type")
    put(config, "architecture", architecture, "architecture")
    if not fmt.calibrated:
        put(quant, "quant_algo", fmt.quant_algo, "quantization.quant_algo")
    theta, scaling = hf_rope(hf_config)
    if "rotary_scaling" not in config:
        put(config, "rotary_scaling", scaling, "rotary_scaling")
    if theta is not None and config.get("rotary_base") != theta:
        put(config, "rotary_base", theta, "rotary_base")
    put(quant, "kv_cache_quant_algo", KV_CACHE_QUANT_ALGO[kv_cache], "quantization.kv_cache_quant_algo")
    return config, edits
