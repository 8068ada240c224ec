"""The memory plan of the LLM API path, with its advice: do target and draft fit `[gpu]`, and which KV-cache
fraction? (`plan_memory`, as `check.advice.plan_memory` is the engine path's.)

Reuses the engine path's arithmetic (`specbuild.check.memory`: weight bytes per format, KV bytes per
token, activation and decoder buffers) and differs where the PyTorch backend differs:

- One process per GPU rank runs both models (the draft/target "two model" path), so one CUDA
  context, and both models on the same GPUs (no separate draft placement).
- One KV-cache pool for both: TensorRT-LLM's KvCacheCreator sizes it as
  `(total - peak) x kv_cache_config.free_gpu_memory_fraction` and counts target + draft bytes per token
  (NVIDIA/TensorRT-LLM tensorrt_llm/_torch/pyexecutor/_util.py, `KvCacheCreator._get_kv_size_per_token`
  and `_cal_max_memory`, 1.x). So there is one fraction, not one per model, and no split to plan.
- Each sequence holds max_seq_len + max_draft_len + 1 tokens (`_get_token_num_for_estimation` adds the
  draft tokens and one generated token), in blocks of KvCacheConfig.tokens_per_block = 32.
- max_num_tokens is used as given (no trtllm-build raise); a prompt above it is refused per request.

The fraction written: the spec's `[llmapi] free_gpu_memory_fraction`, else TensorRT-LLM's default 0.9,
which keeps the same 10% of the free memory that the engine plan keeps as its margin.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from specbuild.check.memory import (
    CUDA_CONTEXT_BYTES,
    GIB,
    kv_bytes_per_token,
    padded_vocab,
    runtime_bytes,
    weight_bytes,
)
from specbuild.check.report import Finding
from specbuild.config import Spec
from specbuild.contract import llmapi as contract
from specbuild.contract.build_rules import FP8_MIN_SM, MIN_SM
from specbuild.hfmodel import ModelInfo, read_model_info


@dataclass(frozen=True)
class LlmApiMemoryPlan:
    gpu: str
    sm: int | None
    memory_per_gpu_bytes: int
    tp_size: int
    pp_size: int
    weight_bytes_per_gpu: dict[str, int]  # role -> bytes
    runtime_bytes_per_gpu: int  # one CUDA context, both models' activations, logits and decoder buffers
    kv_bytes_per_token: dict[str, int]  # role -> bytes per token per GPU
    tokens_per_sequence: int  # max_seq_len + K + 1, whole blocks
    free_gpu_memory_fraction: float
    fraction_source: str  # "spec" | "TensorRT-LLM default"
    kv_cache_bytes: int  # (memory - weights - runtime) x fraction; negative when the models do not fit
    max_tokens: int  # KV tokens of target + draft together that fit
    max_batch: int  # sequences at max_seq_len that fit
    max_batch_size: int
    max_seq_len: int
    max_draft_len: int
    problems: tuple[Finding, ...] = ()
    warnings: tuple[Finding, ...] = ()
    suggestions: tuple[dict[str, Any], ...] = ()

    @property
    def fits(self) -> bool:
        return self.max_batch >= 1

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        for key in ("problems", "warnings"):
            data.pop(key)
        data["suggestions"] = list(self.suggestions)
        return {"path": "llmapi", "fits": self.fits, **data, "max_batch_at_max_seq_len": self.max_batch}


def compute_plan(spec: Spec, target: ModelInfo, draft: ModelInfo | None) -> LlmApiMemoryPlan:
    b, g = spec.build, spec.gpu
    tp, pp = b.tp_size, b.pp_size
    k = spec.speculative.num_draft_tokens  # the LLM API drafts max_draft_len = K tokens every step
    memory = int(g.memory_per_gpu_gib * GIB)
    weights, kv, runtime = {}, {}, 0
    for role, info in (("target", target), ("draft", draft)):
        if info is None:  # a target-only deployment
            continue
        model = spec.role(role)
        weights[role] = weight_bytes(info, model.quantization, model.dtype, padded_vocab(info.vocab_size, tp), tp, pp)[
            1
        ]
        kv[role] = kv_bytes_per_token(info, model.kv_cache, model.dtype, tp, pp)
        runtime += runtime_bytes(info, model.dtype, spec, padded_vocab(info.vocab_size, tp), role == "target")
    runtime -= CUDA_CONTEXT_BYTES * (len(weights) - 1)  # one process runs both models: one context, counted once
    block = contract.KV_TOKENS_PER_BLOCK
    tokens_per_sequence = math.ceil((b.max_seq_len + k + 1) / block) * block
    fraction = spec.llmapi.free_gpu_memory_fraction
    source = "spec"
    if fraction is None:
        fraction, source = contract.KV_CACHE_DEFAULT_FRACTION, "TensorRT-LLM default"
    free = memory - sum(weights.values()) - runtime
    kv_cache = int(free * fraction) if free > 0 else free
    per_token = sum(kv.values())
    max_tokens = max(kv_cache, 0) // per_token // block * block
    return LlmApiMemoryPlan(
        gpu=g.name or "custom",
        sm=g.sm,
        memory_per_gpu_bytes=memory,
        tp_size=tp,
        pp_size=pp,
        weight_bytes_per_gpu=weights,
        runtime_bytes_per_gpu=runtime,
        kv_bytes_per_token=kv,
        tokens_per_sequence=tokens_per_sequence,
        free_gpu_memory_fraction=fraction,
        fraction_source=source,
        kv_cache_bytes=kv_cache,
        max_tokens=max_tokens,
        max_batch=max_tokens // tokens_per_sequence,
        max_batch_size=b.max_batch_size,
        max_seq_len=b.max_seq_len,
        max_draft_len=k,
    )


def gate_findings(spec: Spec) -> tuple[list[Finding], list[Finding]]:
    """Formats this path does not export or the GPU cannot run, and limits the LLM API refuses."""
    problems: list[Finding] = []
    warnings: list[Finding] = []
    sm = spec.gpu.sm
    for role in spec.roles:
        model = spec.role(role)
        if model.quantization not in contract.QUANTIZATIONS:
            problems.append(
                Finding(
                    "quantization_unsupported_on_llmapi",
                    f"{role}.quantization = {model.quantization!r}: the LLM API path exports pre-quantized Hugging Face "
                    f"checkpoints in {', '.join(contract.QUANTIZATIONS)} only (FP8 is what TensorRT-LLM's PyTorch backend "
                    "documents for modelopt checkpoints on Hopper and newer).",
                    f'Set {role}.quantization = "fp8" or "none", or use the engine path (--backend trtllm).',
                )
            )
        if sm is not None and (model.quantization == "fp8" or model.kv_cache == "fp8") and sm < FP8_MIN_SM:
            problems.append(
                Finding(
                    "quantization_unsupported_on_gpu",
                    f"{role}: FP8 weights or KV cache need SM89+, but {spec.gpu.name} is SM{sm}.",
                    f'Set {role}.quantization and {role}.kv_cache to "none".',
                )
            )
    if sm is not None and sm < MIN_SM:
        problems.append(
            Finding(
                "gpu_too_old",
                f"{spec.gpu.name} is SM{sm}; the draft/target path needs SM80+.",
                "Use an Ampere-or-newer GPU.",
            )
        )
    if spec.speculative.num_draft_tokens == 0:
        warnings.append(
            Finding(
                "llmapi_no_speculation",
                "speculative.num_draft_tokens = 0: the LLM API has no per-request K, so the deployment serves the target "
                "alone (no speculative_config is written).",
                "Set speculative.num_draft_tokens to the K to draft at every step (e.g. the one `check --measure` picks).",
            )
        )
    if spec.build.max_input_len > spec.build.max_num_tokens:
        warnings.append(
            Finding(
                "llmapi_prompt_above_max_num_tokens",
                f"build.max_input_len = {spec.build.max_input_len} exceeds build.max_num_tokens = "
                f"{spec.build.max_num_tokens}: the PyTorch backend refuses a prompt longer than max_num_tokens.",
                f"Set build.max_num_tokens >= {spec.build.max_input_len}.",
            )
        )
    if spec.draft is not None and spec.target.dtype != spec.draft.dtype:
        warnings.append(
            Finding(
                "llmapi_one_dtype",
                f"target.dtype = {spec.target.dtype!r}, draft.dtype = {spec.draft.dtype!r}: the LLM arguments carry one "
                "dtype (the target's).",
                "Use the same dtype for both roles.",
            )
        )
    return problems, warnings


def _with(spec: Spec, section: str, **changes: Any) -> Spec:
    return dataclasses.replace(spec, **{section: dataclasses.replace(getattr(spec, section), **changes)})


def suggest_changes(spec: Spec, target: ModelInfo, draft: ModelInfo | None, goal: int) -> list[dict[str, Any]]:
    """Single changes that reach `goal` sequences at max_seq_len, best first (each re-planned)."""
    candidates = []
    if spec.target.quantization == "none" and (spec.gpu.sm is None or spec.gpu.sm >= FP8_MIN_SM):
        candidates.append(('target.quantization = "fp8"', _with(spec, "target", quantization="fp8")))
        if spec.target.kv_cache == "none":
            candidates.append(('target.kv_cache = "fp8"', _with(spec, "target", kv_cache="fp8")))
    if (spec.llmapi.free_gpu_memory_fraction or contract.KV_CACHE_DEFAULT_FRACTION) < 0.95:
        candidates.append(
            ("llmapi.free_gpu_memory_fraction = 0.95", _with(spec, "llmapi", free_gpu_memory_fraction=0.95))
        )
    tp = spec.build.tp_size * 2
    while tp <= 8:
        if all(m.num_heads % tp == 0 for m in (target, draft) if m is not None):
            changed = _with(_with(spec, "build", tp_size=tp), "gpu", count=max(spec.gpu.count, tp * spec.build.pp_size))
            candidates.append((f"build.tp_size = {tp} (gpu.count >= {tp * spec.build.pp_size})", changed))
        tp *= 2
    seq = spec.build.max_seq_len // 2
    while seq > spec.build.max_input_len:
        candidates.append((f"build.max_seq_len = {seq}", _with(spec, "build", max_seq_len=seq)))
        seq //= 2
    found = []
    for change, changed in candidates:
        batch = compute_plan(changed, target, draft).max_batch
        if batch >= goal:
            found.append({"change": change, "max_batch": batch})
    return found


def plan_memory(
    spec: Spec, target: ModelInfo | None = None, draft: ModelInfo | None = None, suggest: bool = True
) -> LlmApiMemoryPlan:
    target = target or read_model_info(spec.target.checkpoint, role="target")
    if draft is None and spec.draft is not None:
        draft = read_model_info(spec.draft.checkpoint, role="draft")
    plan = compute_plan(spec, target, draft)
    problems, warnings = gate_findings(spec)
    suggestions: list[dict[str, Any]] = []
    if not plan.fits:
        suggestions = suggest_changes(spec, target, draft, 1) if suggest else []
        fix = (
            f"Change {suggestions[0]['change']} (then {suggestions[0]['max_batch']} sequence(s) fit)."
            if suggestions
            else "Use a larger GPU, more GPUs, or a smaller target."
        )
        problems.append(
            Finding(
                "does_not_fit",
                f"does not fit: on {plan.gpu} ({plan.memory_per_gpu_bytes / GIB:.1f} GiB per GPU, tp_size {plan.tp_size}) "
                f"the weights take {sum(plan.weight_bytes_per_gpu.values()) / GIB:.1f} GiB per GPU and the runtime "
                f"{plan.runtime_bytes_per_gpu / GIB:.1f} GiB; the KV cache gets {max(plan.kv_cache_bytes, 0) / GIB:.2f} GiB "
                f"(fraction {plan.free_gpu_memory_fraction}), and one sequence of {plan.tokens_per_sequence} tokens needs "
                f"{plan.tokens_per_sequence * sum(plan.kv_bytes_per_token.values()) / GIB:.2f} GiB.",
                fix,
            )
        )
    elif plan.max_batch < spec.build.max_batch_size:
        suggestions = suggest_changes(spec, target, draft, spec.build.max_batch_size) if suggest else []
        warnings.append(
            Finding(
                "batch_exceeds_memory",
                f"only {plan.max_batch} sequences of max_seq_len = {plan.max_seq_len} fit in the KV cache, but "
                f"build.max_batch_size = {plan.max_batch_size}; the scheduler waits for free blocks beyond that.",
                f"Set build.max_batch_size = {plan.max_batch}."
                + (f" Or: {suggestions[0]['change']}." if suggestions else ""),
            )
        )
    return dataclasses.replace(plan, problems=tuple(problems), warnings=tuple(warnings), suggestions=tuple(suggestions))


def summary_lines(m: dict[str, Any]) -> list[str]:
    """`specbuild check` lines for the plan's to_dict()."""
    w, kv = m["weight_bytes_per_gpu"], m["kv_bytes_per_token"]
    lines = [
        f"{m['gpu']} ({m['memory_per_gpu_bytes'] / GIB:.1f} GiB/GPU, SM{m['sm'] or '?'}), tp_size {m['tp_size']}, "
        + ("LLM API: both models in one process on the same GPUs" if len(w) == 2 else "LLM API: the target alone"),
        "weights/GPU    "
        + ", ".join(f"{role} {b / GIB:.2f} GiB" for role, b in w.items())
        + f"; runtime {m['runtime_bytes_per_gpu'] / GIB:.2f} GiB",
        "KV/token       " + " + ".join(f"{role} {b} B" for role, b in kv.items()) + ", one pool; "
        f"{m['tokens_per_sequence']} tokens per sequence (max_seq_len + K + 1)",
        f"KV cache       {max(m['kv_cache_bytes'], 0) / GIB:.2f} GiB at free_gpu_memory_fraction "
        f"{m['free_gpu_memory_fraction']} ({m['fraction_source']}): {m['max_tokens']} tokens",
        f"max batch      {m['max_batch']} at max_seq_len {m['max_seq_len']} (spec max_batch_size {m['max_batch_size']})",
    ]
    if not m["fits"]:
        lines.append(
            "does not fit" + (f"; smallest change: {m['suggestions'][0]['change']}" if m["suggestions"] else "")
        )
    return lines
