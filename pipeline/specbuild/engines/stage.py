"""The build stage's entry points: engines for the target and the draft.

- backend "trtllm": `trtllm-build` per role (GPU; the flag table is in `specbuild.engines.flags`);
- backend "reference": a float32 PyTorch engine from the same TensorRT-LLM checkpoint (any machine).

Public API:
    plan_build(spec, roles, require_checkpoint=True) -> list[RolePlan]
    dry_run(spec, roles, backend, trtllm_build=None) -> dict         # what would run, nothing written
    build_engines(spec, roles, backend, force=False, trtllm_build=None, log=...) -> list[dict]
    versions_mismatch(manifest, runtime_versions) -> list[str]       # for `serve`
    runtime_versions(python=None) -> dict
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Callable

from specbuild import backends
from specbuild.artifacts import MANIFEST
from specbuild.engines.flags import FLAGS, TRTLLM_VERSION_CHECKED, argv_text, trtllm_argv
from specbuild.engines.plan import RolePlan, check_consistent, plan_build, plan_role
from specbuild.engines.versions import runtime_versions, versions_mismatch
from specbuild.config import Spec
from specbuild.errors import BuildError, SpecbuildError

BACKENDS = backends.ENGINE_BACKENDS

__all__ = [
    "BACKENDS", "FLAGS", "TRTLLM_VERSION_CHECKED", "RolePlan", "build_engines", "dry_run", "plan_build",
    "plan_role", "runtime_versions", "versions_mismatch",
]


def _check_backend(backend: str) -> None:
    if backend not in BACKENDS:
        raise BuildError(f"unknown backend {backend!r}: use one of {', '.join(BACKENDS)}.")


def _planned_input_hash(spec: Spec, plan: RolePlan, backend: str, executable: str | None) -> str | None:
    """The input hash a build would record (CI cache key); None until the checkpoint (and trtllm-build) exist."""
    if plan.checkpoint_manifest is None:
        return None
    if backends.get(backend).builder == "trtllm-build":
        if executable is None:
            return None
        from specbuild.engines.trtllm import trtllm_input_hash

        return trtllm_input_hash(plan, executable)[0]
    from specbuild.engines.reference_engine import reference_input_hash

    try:
        return reference_input_hash(plan, Path(spec.role(plan.role).checkpoint))[0]
    except SpecbuildError:
        return None


def dry_run(spec: Spec, roles: list[str], backend: str, trtllm_build: str | None = None) -> dict[str, Any]:
    """The plan as data: for trtllm the exact argv per role (output written to the engine folder)."""
    _check_backend(backend)
    plans = plan_build(spec, roles, require_checkpoint=False)
    found = trtllm_build or shutil.which("trtllm-build")
    executable = found or "trtllm-build"
    engines = []
    for plan in plans:
        entry: dict[str, Any] = {
            "role": plan.role,
            "checkpoint_dir": str(plan.checkpoint_dir),
            "checkpoint_ready": plan.checkpoint_manifest is not None,
            "engine_dir": str(plan.engine_dir),
            "build_config": plan.expected_build_config(),
            "notes": list(plan.notes),
        }
        entry["input_hash"] = _planned_input_hash(spec, plan, backend, found)
        if backends.get(backend).builder == "trtllm-build":
            argv = trtllm_argv(plan, executable, str(plan.engine_dir))
            entry.update(argv=argv, argv_text=argv_text(argv),
                         writes=[f"{plan.engine_dir}/{name}" for name in
                                 ("config.json", *(f"rank{r}.engine" for r in range(plan.world_size)),
                                  "model.cache", "build.log", MANIFEST)])
        else:
            entry.update(argv=None, argv_text=None,
                         writes=[f"{plan.engine_dir}/{name}" for name in
                                 ("config.json", "model.safetensors", "engine.json", "<tokenizer files>", MANIFEST)])
        engines.append(entry)
    return {"stage": "build", "backend": backend, "dry_run": True, "pair": spec.name,
            "trtllm_version_checked": TRTLLM_VERSION_CHECKED, "engines": engines}


def _check_against_existing(plans: list[RolePlan]) -> None:
    """Building one role: its limits must match the other role's existing engine."""
    import json

    if len(plans) != 1:
        return
    plan = plans[0]
    other = plan.engine_dir.parent.parent / ("draft" if plan.role == "target" else "target") / "engine" / MANIFEST
    if not other.is_file():
        return
    try:
        limits = json.loads(other.read_text())["settings"]["limits"]
    except (OSError, ValueError, KeyError, TypeError):
        return
    if plan.role == "target":
        check_consistent(plan, limits)
    else:
        check_consistent(limits, plan)


def build_engines(spec: Spec, roles: list[str], backend: str, force: bool = False, trtllm_build: str | None = None,
                  log: Callable[[str], None] = lambda m: None) -> list[dict[str, Any]]:
    """Build each role's engine (skipping up-to-date ones); one summary dict per role."""
    _check_backend(backend)
    plans = plan_build(spec, roles, require_checkpoint=True)
    _check_against_existing(plans)
    results = []
    if backends.get(backend).builder == "trtllm-build":
        from specbuild.engines.trtllm import build_trtllm_role, find_trtllm_build

        executable = find_trtllm_build(trtllm_build)
        for plan in plans:
            results.append(build_trtllm_role(plan, spec.name, executable, force=force, log=log))
    else:
        from specbuild.engines.reference_engine import build_reference_role

        for plan in plans:
            hf_dir = Path(spec.role(plan.role).checkpoint)
            results.append(build_reference_role(plan, spec.name, hf_dir, force=force, log=log))
    return results
