"""The quantization formats a spec may name: one record per format, read by every stage.

Each record says what the format is for modelopt (the config `convert` quantizes with), for TensorRT-LLM (the
QuantAlgo written to the checkpoint, the GPUs trtllm-build builds it for), for memory and speed (bytes per
weight), for `convert --verify` (how far its logits may stray), and which paths take it. Adding a format is a
record here, plus how `convert.loader` reads its exported weights back (its QuantAlgo's layout and activation
rounding; docs/architecture.md, "Where a change goes").

Sources (NVIDIA/TensorRT-LLM):
- the spec names and their modelopt configs and QuantAlgos: `examples/quantization/quantize.py` and
  `tensorrt_llm/quantization/quantize_by_modelopt.py` @042c510 (fp8 / int8_sq / int4_awq / w4a8_awq calibrate
  with modelopt; int8_wo / int4_wo export float weights with quant_algo W8A16 / W4A16, which trtllm-build
  quantizes per output channel);
- SM100-119 (Blackwell): `tensorrt_llm/builder.py::build` @008b2b8 raises "INT8/INT4 quantization is not
  supported on SM>=100." when `quant_mode.is_int4_weight_only()` or `is_int8_weight_only()`, and "SmoothQuant is
  not supported on SM>=100." for `has_act_and_weight_quant()`; `tensorrt_llm/quantization/mode.py` makes
  W4A16_AWQ, like W4A16, int4 weights without quantized activations (`use_weight_only(use_int4_weights=True,
  per_group=True)`), so `is_int4_weight_only()` holds for int4_awq: it is refused there like int4_wo.
  W4A8_AWQ is not settled from the sources read (one mode.py gives it quantized activations and per-channel
  scaling, a later one maps it like W4A16_AWQ): both readings refuse it too, but no build was seen, so it is
  "unverified" (`check` warns) until a run on such a GPU says;
- FP8 weights and W4A8 (FP8 activations) need SM89+ (FP8 GEMMs; `builder.py` disables FP8 context FMHA below).
No torch here: `check`, `--dry-run` and the spec's validation read it.
"""

from __future__ import annotations

from dataclasses import dataclass

FP8_MIN_SM = 89  # FP8 weights, W4A8 (FP8 activations), FP8 context FMHA
BLACKWELL_SM = range(100, 120)  # builder.py refuses INT8/INT4 weight-only, INT8 KV and SmoothQuant here
AWQ_GROUP = 128  # the AWQ group size modelopt's INT4_AWQ_CFG uses (block_sizes {-1: 128}); one fp16 scale each


@dataclass(frozen=True)
class QuantFormat:
    name: str  # the spec's `quantization` value
    quant_algo: str | None  # the TensorRT-LLM QuantAlgo in the checkpoint's config.json; None: not quantized
    mtq_config: str | None  # attribute of modelopt.torch.quantization; None: no modelopt quantization
    calibrated: bool  # needs calibration data (forward passes)
    weight_bytes: float | None  # bytes per transformer-block weight, scales included; None: the dtype's
    verify_bounds: tuple[float, float] | None  # (least top-1 agreement, largest mean |logit error| / logit std)
    min_sm: int = 80  # the oldest GPU generation it runs on (draft/target speculation needs SM80+)
    blackwell: str = "builds"  # on SM100-119: "builds" | "refused" (trtllm-build raises) | "unverified"
    awq: bool = False  # block-wise int4 weights: the block size must divide every input width per rank
    llmapi: bool = False  # the LLM API path takes it (a pre-quantized Hugging Face checkpoint it verifies)

    def refused_on(self, sm: int | None) -> str | None:
        """Why trtllm-build cannot build this format for an SM`sm` GPU, or None (unknown GPU: None)."""
        if sm is None:
            return None
        if sm < self.min_sm and self.min_sm >= FP8_MIN_SM:
            return f"FP8 needs an SM{self.min_sm}+ GPU (Ada, Hopper or newer)"
        if sm < self.min_sm:
            return f"it needs an SM{self.min_sm}+ GPU (Ampere or newer)"
        if sm in BLACKWELL_SM and self.blackwell == "refused":
            return "trtllm-build refuses INT8/INT4 weight-only and SmoothQuant on SM100-119"
        return None


_AWQ_BYTES = 0.5 + 2 / AWQ_GROUP  # int4 weights and one fp16 scale per group
# Verify bounds are loose on purpose: they catch a broken loader or export (a wrong layout, scale or shard order
# gives near-random logits), not small accuracy differences.
FORMATS: dict[str, QuantFormat] = {
    f.name: f
    for f in (
        QuantFormat("none", None, None, calibrated=False, weight_bytes=None, verify_bounds=None, llmapi=True),
        QuantFormat(
            "fp8",
            "FP8",
            "FP8_DEFAULT_CFG",
            calibrated=True,
            weight_bytes=1.0,
            verify_bounds=(0.80, 0.25),
            min_sm=FP8_MIN_SM,
            llmapi=True,
        ),
        QuantFormat(
            "int8_sq",
            "W8A8_SQ_PER_CHANNEL",
            "INT8_SMOOTHQUANT_CFG",
            calibrated=True,
            weight_bytes=1.0,
            verify_bounds=(0.80, 0.25),
            blackwell="refused",
        ),
        QuantFormat(
            "int4_awq",
            "W4A16_AWQ",
            "INT4_AWQ_CFG",
            calibrated=True,
            weight_bytes=_AWQ_BYTES,
            verify_bounds=(0.60, 0.50),
            blackwell="refused",
            awq=True,
        ),
        QuantFormat(
            "w4a8_awq",
            "W4A8_AWQ",
            "W4A8_AWQ_BETA_CFG",
            calibrated=True,
            weight_bytes=_AWQ_BYTES,
            verify_bounds=(0.60, 0.50),
            min_sm=FP8_MIN_SM,
            blackwell="unverified",
            awq=True,
        ),
        QuantFormat(
            "int8_wo",
            "W8A16",
            None,
            calibrated=False,
            weight_bytes=1.0,
            verify_bounds=(0.90, 0.10),
            blackwell="refused",
        ),
        QuantFormat(
            "int4_wo",
            "W4A16",
            None,
            calibrated=False,
            weight_bytes=0.5,
            verify_bounds=(0.50, 0.60),
            blackwell="refused",
        ),
    )
}
NAMES = tuple(FORMATS)


def usable_on(sm: int | None) -> list[str]:
    """The formats trtllm-build builds for an SM`sm` GPU (all of them for an unknown GPU)."""
    return [name for name, fmt in FORMATS.items() if fmt.refused_on(sm) is None]


def one_of(names: list[str]) -> str:
    """'a', 'b' or 'c': names as a message offers them."""
    quoted = [repr(name) for name in names]
    return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"


EXPORT_DTYPES = ("float16", "bfloat16")  # modelopt's TensorRT-LLM export writes no float32 checkpoints


def dtype_refusal(role: str, dtype: str) -> tuple[str, str] | None:
    """(why, fix) when `convert` exports no checkpoint in `dtype` (the rule `check` reports too); None otherwise."""
    if dtype in EXPORT_DTYPES:
        return None
    return (
        f"{role}.dtype = {dtype!r}: TensorRT-LLM checkpoints are exported in float16 or bfloat16 (modelopt would "
        "silently write float16), so convert refuses it.",
        f'Set {role}.dtype = "float16" or "bfloat16".',
    )
