"""Quantization formats: what each `quantization` name means for modelopt and for TensorRT-LLM.

Mirrors TensorRT-LLM's `examples/quantization/quantize.py` and `tensorrt_llm/quantization/quantize_by_modelopt.py`
(NVIDIA/TensorRT-LLM, read at 042c510: the qformat -> modelopt config table and the quant_algo patches):
- fp8 / int8_sq / int4_awq / w4a8_awq quantize with a modelopt config and calibration data;
- int8_wo / int4_wo export unquantized weights and set quant_algo W8A16 / W4A16, so that
  trtllm-build quantizes the weights (per output channel) at build time;
- none exports float16/bfloat16 weights with quant_algo null.
No torch import here: the CLI's --dry-run uses this module.
"""

from __future__ import annotations

from dataclasses import dataclass

from specbuild.build import rules
from specbuild.errors import SpecError


@dataclass(frozen=True)
class QuantFormat:
    name: str  # the spec's quantization value
    mtq_config: str | None  # attribute of modelopt.torch.quantization; None = no modelopt quantization
    quant_algo: str | None  # the TensorRT-LLM QuantAlgo written to config.json
    calibrated: bool  # needs calibration data (forward passes)
    awq: bool = False  # block-wise int4 weights: the block size must divide every input width per rank
    min_sm: int = 80  # the lowest GPU generation TensorRT-LLM runs it on (the DTM flow needs SM80+)
    blackwell_ok: bool = True  # False: trtllm-build raises on SM100-119 (INT8/INT4 weight-only, SmoothQuant)


FORMATS: dict[str, QuantFormat] = {
    "none": QuantFormat("none", None, rules.QUANT_ALGO["none"], calibrated=False),
    "fp8": QuantFormat("fp8", "FP8_DEFAULT_CFG", rules.QUANT_ALGO["fp8"], calibrated=True, min_sm=rules.FP8_MIN_SM),
    "int8_sq": QuantFormat("int8_sq", "INT8_SMOOTHQUANT_CFG", rules.QUANT_ALGO["int8_sq"], calibrated=True,
                           blackwell_ok=False),
    "int4_awq": QuantFormat("int4_awq", "INT4_AWQ_CFG", rules.QUANT_ALGO["int4_awq"], calibrated=True, awq=True),
    "w4a8_awq": QuantFormat("w4a8_awq", "W4A8_AWQ_BETA_CFG", rules.QUANT_ALGO["w4a8_awq"], calibrated=True, awq=True,
                            min_sm=rules.FP8_MIN_SM),
    "int8_wo": QuantFormat("int8_wo", None, rules.QUANT_ALGO["int8_wo"], calibrated=False, blackwell_ok=False),
    "int4_wo": QuantFormat("int4_wo", None, rules.QUANT_ALGO["int4_wo"], calibrated=False, blackwell_ok=False),
}

KV_CACHE_QUANT_ALGO = {"none": None, "fp8": "FP8"}
AWQ_BLOCK_SIZES = (128, 64)  # the group sizes TensorRT-LLM's W4A16/W4A8 AWQ kernels take, preferred first
AWQ_MAX_CALIB_SIZE = 32  # quantize.py caps AWQ calibration at 32 samples (it is slow)


def get_format(name: str) -> QuantFormat:
    if name not in FORMATS:
        raise SpecError(f"quantization = {name!r} is not supported. Choose one of: {', '.join(FORMATS)}.")
    return FORMATS[name]


def check_gpu(fmt: QuantFormat, kv_cache: str, sm: int | None, gpu: str | None, where: str) -> None:
    """Refuse a format the spec's GPU cannot run, or one trtllm-build would build without paged context FMHA
    (unknown GPU: only the rules that hold on every GPU)."""
    if sm is None or sm >= rules.FP8_MIN_SM:
        loss = rules.spec_paged_context_fmha_loss(fmt.name, kv_cache, sm)
        if loss is not None:
            raise SpecError(f"{where}.quantization = {fmt.name!r} with kv_cache = {kv_cache!r}: {loss}. "
                            + rules.paged_context_fmha_fix(where, sm))
    if sm is None:
        return
    if sm < fmt.min_sm or (kv_cache == "fp8" and sm < rules.FP8_MIN_SM):
        what = f"quantization = {fmt.name!r}" if sm < fmt.min_sm else "kv_cache = 'fp8'"
        raise SpecError(
            f"{where}.{what} needs an SM89+ GPU (Ada/Hopper or newer), but gpu.name = {gpu!r} is SM{sm}. "
            "Use 'int8_sq', 'int4_awq', 'int8_wo', 'int4_wo' or 'none' (and kv_cache = 'none') on this GPU."
        )
    if sm in rules.BLACKWELL_SM and not fmt.blackwell_ok:
        raise SpecError(
            f"{where}.quantization = {fmt.name!r}: trtllm-build refuses INT8/INT4 weight-only and SmoothQuant on "
            f"SM{sm} ({gpu}). Use 'fp8', 'int4_awq', 'w4a8_awq' or 'none'."
        )


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
