"""Quantization formats at convert time: the registry's record for a name, and the checks convert makes with it.

The formats themselves (modelopt config, QuantAlgo, GPU gates, bytes, verify bounds) are
`specbuild.quantization`'s records, with their sources. Here: the refusals convert makes before any work (a GPU
trtllm-build refuses the format on, a KV cache it would build without paged context FMHA) and the AWQ block
size. No torch import here: the CLI's --dry-run uses this module.
"""

from __future__ import annotations

from specbuild.contract import build_rules as rules
from specbuild.errors import SpecError
from specbuild.quantization import FORMATS, QuantFormat

KV_CACHE_QUANT_ALGO = {"none": None, "fp8": "FP8"}
AWQ_BLOCK_SIZES = (128, 64)  # the group sizes TensorRT-LLM's W4A16/W4A8 AWQ kernels take, preferred first
AWQ_MAX_CALIB_SIZE = 32  # quantize.py caps AWQ calibration at 32 samples (it is slow)


def get_format(name: str) -> QuantFormat:
    if name not in FORMATS:
        raise SpecError(f"quantization = {name!r} is not supported. Choose one of: {', '.join(FORMATS)}.")
    return FORMATS[name]


def check_gpu(fmt: QuantFormat, kv_cache: str, sm: int | None, gpu: str | None, where: str) -> None:
    """Refuse what check reports for this role on the spec's GPU (`build_rules.gpu_refusals`, the one gate)."""
    for refusal in rules.gpu_refusals(where, fmt.name, kv_cache, sm, gpu):
        raise SpecError(f"{refusal.message} {refusal.fix}")


def check_kv_cache(kv_cache: str, where: str) -> str | None:
    """The kv_cache_quant_algo for a kv_cache setting; refuses what the draft/target flow cannot run."""
    if kv_cache == "int8":
        raise SpecError(
            f"{where}.kv_cache = 'int8' cannot be used: an INT8 KV cache disables paged context FMHA in "
            "trtllm-build, and draft/target speculative decoding needs it for KV-cache reuse. "
            "Use kv_cache = 'fp8' (SM89+) or 'none'."
        )
    if kv_cache not in KV_CACHE_QUANT_ALGO:
        raise SpecError(f"{where}.kv_cache = {kv_cache!r} is not supported. Choose one of: none, fp8.")
    return KV_CACHE_QUANT_ALGO[kv_cache]


def awq_block_size(in_widths: list[int], requested: int | None, where: str) -> int:
    """The AWQ block (group) size: `requested`, or the largest of AWQ_BLOCK_SIZES dividing every width.

    `in_widths` are the input widths of every quantized linear layer on one tensor-parallel rank.
    """
    candidates = (requested,) if requested else AWQ_BLOCK_SIZES
    for block in candidates:
        if block not in AWQ_BLOCK_SIZES:
            raise SpecError(f"--awq-block-size {block}: TensorRT-LLM's AWQ kernels take 64 or 128.")
        if all(width % block == 0 for width in in_widths):
            return block
    bad = sorted({w for w in in_widths if w % min(candidates)})
    raise SpecError(
        f"{where}: int4 AWQ groups input channels in blocks of {' or '.join(map(str, candidates))}, but these "
        f"input widths per tensor-parallel rank do not divide: {bad}. Use quantization 'fp8', 'int8_sq', "
        "'int4_wo' or 'none' for this model, or a tp_size that keeps the widths divisible."
    )
