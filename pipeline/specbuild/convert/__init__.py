"""`specbuild convert`: Hugging Face -> TensorRT-LLM checkpoints (modelopt), and the checkpoint loader.

    plan.plan_roles(spec, roles, options)        resolve and refuse early (no torch)
    export.convert_role(plan, options, ...)      quantize, export, fix up, manifest (atomic)
    loader.load_trtllm_checkpoint(dir)           TensorRT-LLM checkpoint -> HF LlamaForCausalLM weights
    loader.to_hf_model(loaded)                   ... as an eval-mode model
    verify.verify_checkpoint(dir, hf_dir, q)     round-trip check against the original model

Heavy imports (torch, transformers, modelopt) happen inside the functions of export/loader/verify.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def dry_run(spec: Any, roles: list[str], options: Any = None) -> list[dict[str, Any]]:
    """The plan per role (settings, files it would write), without touching the disk."""
    from specbuild.convert.plan import ConvertOptions, describe, plan_roles

    return [describe(p) for p in plan_roles(spec, roles, options or ConvertOptions())]


def convert_pair(
    spec: Any,
    roles: list[str],
    force: bool = False,
    log: Callable[[str], None] = print,
    options: Any = None,
    verify: bool = False,
    progress: bool = False,
) -> list[dict[str, Any]]:
    """Convert the given roles; one result per role with status "ran" or "skipped" (up to date)."""
    from specbuild.convert.export import convert_role
    from specbuild.convert.plan import ConvertOptions, plan_roles

    options = options or ConvertOptions()
    plans = plan_roles(spec, roles, options)
    return [convert_role(p, options, force=force, verify=verify, log=log, progress=progress) for p in plans]
