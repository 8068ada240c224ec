"""The memory plan with its advice (`plan_memory`): GPU feature gates, "does not fit" with the smallest
change that would fit, and the batch warning. Every suggestion is checked by re-running the plan, and
none is a spec that trtllm-build would quietly change (`specbuild.contract.build_rules`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from specbuild.check.memory import DTYPE_BYTES, GIB, WEIGHT_BYTES, MemoryPlan, compute_plan
from specbuild.check.report import Finding
from specbuild.config import GPUS, Spec
from specbuild.contract.build_rules import (
    BLACKWELL_SM,
    TOKENS_PER_BLOCK,
    fp8_kv_cache_keeps_paged_context_fmha,
    gpu_refusals,
    spec_paged_context_fmha_loss,
)
from specbuild.hfmodel import ModelInfo, read_model_info
from specbuild.quantization import FORMATS


def gate_findings(spec: Spec) -> tuple[list[Finding], list[Finding]]:
    """Quantization and KV-cache formats the GPU cannot run (TensorRT-LLM raises at build time), and
    formats trtllm-build would quietly change so that draft/target decoding breaks: the refusals convert and
    build make (`build_rules.gpu_refusals`), as problems."""
    sm = spec.gpu.sm
    problems: list[Finding] = []
    warnings: list[Finding] = []
    for role in spec.roles:
        model = spec.role(role)
        for refusal in gpu_refusals(role, model.quantization, model.kv_cache, sm, spec.gpu.name):
            finding = Finding(*refusal)
            if finding not in problems:  # the GPU's own age is one problem, not one per role
                problems.append(finding)
    if sm is None:
        warnings.append(
            Finding(
                "gpu_sm_unknown",
                f"gpu.name = {spec.gpu.name!r} is not a known GPU, so its compute capability (SM) is unknown: "
                "fp8 and int8/int4 support was not checked.",
                "Use a known gpu.name (" + ", ".join(GPUS) + ") to have format support checked.",
            )
        )
        return problems, warnings
    for role in spec.roles:
        q = spec.role(role).quantization
        if sm in BLACKWELL_SM and FORMATS[q].blackwell == "unverified":
            warnings.append(
                Finding(
                    "quantization_unverified_on_gpu",
                    f"{role}.quantization = {q!r} on SM{sm} is not verified: trtllm-build rejects "
                    "several INT4 modes on SM100-119.",
                    f'Prefer {role}.quantization = "fp8".',
                )
            )
    return problems, warnings


def _supported(spec: Spec, quantization: str) -> bool:
    return FORMATS[quantization].refused_on(spec.gpu.sm) is None


def _keeps_paged_context_fmha(spec: Spec) -> bool:
    return all(
        spec_paged_context_fmha_loss(spec.role(r).quantization, spec.role(r).kv_cache, spec.gpu.sm) is None
        for r in spec.roles
    )


def _with(spec: Spec, section: str, **changes: Any) -> Spec:
    return dataclasses.replace(spec, **{section: dataclasses.replace(getattr(spec, section), **changes)})


def suggest_changes(spec: Spec, target: ModelInfo, draft: ModelInfo | None, goal: int) -> list[dict[str, Any]]:
    """Single changes that reach `goal` sequences at max_seq_len, in order of preference."""
    candidates: list[tuple[str, Spec]] = []
    t = spec.target
    # An FP8 KV cache only where trtllm-build keeps paged context FMHA with it (FP8 / W4A8 weights, SM89+).
    if t.kv_cache == "none" and fp8_kv_cache_keeps_paged_context_fmha(t.quantization, spec.gpu.sm):
        candidates.append(('target.kv_cache = "fp8"', _with(spec, "target", kv_cache="fp8")))
    for q in ("fp8", "int4_awq"):
        if WEIGHT_BYTES[q] < (
            DTYPE_BYTES[t.dtype] if t.quantization == "none" else WEIGHT_BYTES[t.quantization]
        ) and _supported(spec, q):
            candidates.append((f'target.quantization = "{q}"', _with(spec, "target", quantization=q)))
    stages = spec.build.tp_size * spec.build.pp_size
    if spec.draft is not None and spec.gpu.count < 2 * stages:
        candidates.append(
            (
                f"gpu.count = {2 * stages} (the draft on GPUs of its own)",
                _with(spec, "gpu", count=2 * stages, draft_device_ids=None),
            )
        )
    tp = spec.build.tp_size * 2
    while tp <= 8:
        if all(m.num_heads % tp == 0 for m in (target, draft) if m is not None):
            bigger = _with(
                _with(spec, "build", tp_size=tp),
                "gpu",
                count=max(spec.gpu.count, tp * spec.build.pp_size),
                draft_device_ids=None,
            )
            candidates.append((f"build.tp_size = {tp} (gpu.count >= {tp * spec.build.pp_size})", bigger))
        tp *= 2
    found = []
    for change, changed in candidates:
        if not _keeps_paged_context_fmha(changed):  # e.g. int4_awq weights under an existing FP8 KV cache
            continue
        plan = compute_plan(changed, target, draft)
        if plan.max_batch >= goal:
            found.append({"change": change, "max_batch": plan.max_batch})
    shorter = _shorter_seq_len(spec, target, draft, goal)
    if shorter is not None:
        found.append(shorter)
    return found


def _shorter_seq_len(spec: Spec, target: ModelInfo, draft: ModelInfo | None, goal: int) -> dict[str, Any] | None:
    """The longest max_seq_len (a multiple of TOKENS_PER_BLOCK) that reaches the goal, if any."""

    def batch(seq: int) -> int:
        changed = _with(spec, "build", max_seq_len=seq, max_input_len=min(spec.build.max_input_len, seq - 1))
        return compute_plan(changed, target, draft).max_batch

    low, high = TOKENS_PER_BLOCK, spec.build.max_seq_len - 1
    if high < low or batch(low) < goal:
        return None
    while low < high:  # largest seq in [low, high] with batch(seq) >= goal; batch falls as seq grows
        mid = (low + high + 1) // 2
        low, high = (mid, high) if batch(mid) >= goal else (low, mid - 1)
    seq = low // TOKENS_PER_BLOCK * TOKENS_PER_BLOCK
    change = f"build.max_seq_len = {seq}"
    if spec.build.max_input_len >= seq:
        change += f" (and build.max_input_len = {seq // 2})"
    return {"change": change, "max_batch": batch(seq)}


def does_not_fit(plan: MemoryPlan, suggestions: list[dict[str, Any]]) -> Finding:
    weights = sum(m.weight_bytes_per_gpu for m in plan.models)
    runtime = sum(m.runtime_bytes_per_gpu for m in plan.models)
    each = ", ".join(f"{m.role} {m.weight_bytes_per_gpu / GIB:.1f}" for m in plan.models)
    message = (
        f"does not fit: on {plan.gpu} ({plan.memory_per_gpu_bytes / GIB:.1f} GiB per GPU, tp_size {plan.tp_size}) the "
        f"weights take {weights / GIB:.1f} GiB per GPU ({each}) and runtime buffers {runtime / GIB:.1f} GiB, leaving "
        f"{plan.kv_available_bytes / GIB:.1f} GiB for the KV cache; one sequence of max_seq_len = {plan.max_seq_len} "
        f"needs {sum(m.kv_bytes_per_sequence for m in plan.models) / GIB:.2f} GiB."
    )
    if suggestions:
        fix = f"Change {suggestions[0]['change']} (then {suggestions[0]['max_batch']} sequence(s) fit)"
        others = [s["change"] for s in suggestions[1:]]
        fix += ("; other options: " + "; ".join(others) + ".") if others else "."
    else:
        fix = (
            "Use a larger GPU or a smaller target model: no single change to quantization, GPU count, "
            "tp_size or max_seq_len fits."
        )
    return Finding("does_not_fit", message, fix)


def batch_exceeds_memory(plan: MemoryPlan, suggestions: list[dict[str, Any]]) -> Finding:
    best = f" Or: {suggestions[0]['change']}." if suggestions else ""
    return Finding(
        "batch_exceeds_memory",
        f"only {plan.max_batch} sequences of max_seq_len = {plan.max_seq_len} fit in the KV cache, "
        f"but build.max_batch_size = {plan.max_batch_size}; longer requests will wait for free blocks.",
        f"Set build.max_batch_size = {plan.max_batch}.{best}",
    )


def plan_memory(
    spec: Spec,
    target: ModelInfo | None = None,
    draft: ModelInfo | None = None,
    *,
    allow_pickle: bool = False,
    suggest: bool = True,
) -> MemoryPlan:
    """The memory plan for the spec's `[gpu]`, `[build]` limits and the two models, with GPU
    feature gates and (when it does not fit, and `suggest`) the single changes that would fit.

    `target`/`draft` default to the facts read from the spec's checkpoints (CheckpointError if unreadable).
    """
    if target is None:
        target = read_model_info(spec.target.checkpoint, allow_pickle=allow_pickle, role="target")
    if draft is None and spec.draft is not None:
        draft = read_model_info(spec.draft.checkpoint, allow_pickle=allow_pickle, role="draft")
    plan = compute_plan(spec, target, draft)
    problems, warnings = gate_findings(spec)
    suggestions: list[dict[str, Any]] = []
    b = spec.build
    if not plan.fits:
        if suggest:
            suggestions = suggest_changes(spec, target, draft, goal=1)
        problems.append(does_not_fit(plan, suggestions))
    elif plan.max_batch < b.max_batch_size:
        if suggest:
            suggestions = suggest_changes(spec, target, draft, goal=b.max_batch_size)
        warnings.append(batch_exceeds_memory(plan, suggestions))
    return dataclasses.replace(plan, problems=tuple(problems), warnings=tuple(warnings), suggestions=tuple(suggestions))


def gib(value: int | float) -> str:
    if abs(value) < GIB:
        return f"{value / 1024**2:.1f} MiB"
    return f"{value / GIB:.2f} GiB"


def summary_lines(m: dict[str, Any]) -> list[str]:
    """`specbuild check` lines for the engine path's plan (its to_dict())."""
    roles = [role for role in ("target", "draft") if m[role] is not None]

    def each(show: Any) -> str:
        return ", ".join(f"{role} {show(m[role])}" for role in roles)

    placement = {"separate": "the draft on GPUs of its own", "shared": "both models on the same GPUs"}
    lines = [
        f"{m['gpu']} ({gib(m['memory_per_gpu_bytes'])}/GPU, SM{m['sm'] or '?'}), tp_size {m['tp_size']}, "
        + (placement[m["placement"]] if len(roles) == 2 else "the target alone (no draft model)"),
        "weights/GPU    " + each(lambda r: f"{gib(r['weight_bytes_per_gpu'])} ({r['quantization']})"),
        "runtime/GPU    " + each(lambda r: gib(r["runtime_bytes_per_gpu"])) + f", margin {gib(m['reserved_bytes'])}",
        "KV/token       "
        + each(lambda r: f"{r['kv_bytes_per_token']} B")
        + f"; KV left {gib(m['kv_available_bytes'])}",
        f"max batch      {m['max_batch_at_max_seq_len']} at max_seq_len {m['max_seq_len']} "
        f"(spec max_batch_size {m['max_batch_size']})",
    ]
    if m["fits"]:
        lines.append(
            "KV settings    kv_cache_free_gpu_mem_fraction "
            + each(lambda r: r["kv_cache_free_gpu_mem_fraction"])
            + "; max_tokens_in_paged_kv_cache "
            + each(lambda r: r["max_tokens_in_paged_kv_cache"])
        )
    else:
        best = f"; smallest change: {m['suggestions'][0]['change']}" if m["suggestions"] else ""
        lines.append("does not fit" + best)
    return lines
