"""The engine path's stages for `up` (reference or trtllm engines): check, convert (TensorRT-LLM checkpoints),
build (engines), repo (the BLS repository). Each runs, skips what is up to date, or says on a dry run what it
would do."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from specbuild.artifacts import default_repo_dir, recorded_hash
from specbuild.up.context import UpContext, dry_status, earlier_will_run, statuses


def claim_outputs(ctx: UpContext) -> None:
    """Refuse now, not after convert and build, an output folder that a later stage may not replace
    (someone else's folder, a file, specbuild's output of another stage): see specbuild.artifacts."""
    from specbuild.artifacts import claim_output, resolve_output

    folders = [(ctx.spec.pair_dir / role / name, stage) for role in ("target", "draft")
               for name, stage in (("checkpoint", "convert"), ("engine", "build"))]
    folders.append((ctx.repo or default_repo_dir(ctx.spec.output_dir), "repo"))
    for path, stage in folders:
        if stage in ctx.stages:
            claim_output(resolve_output(path, stage), stage)


def run_check_stage(ctx: UpContext) -> dict[str, Any]:
    from specbuild.check import record

    claim_outputs(ctx)
    return record.run_stage(ctx.spec, None, ctx.force, ctx.dry_run, ctx.log, ctx.progress)


def run_convert_stage(ctx: UpContext) -> dict[str, Any]:
    from specbuild.convert.plan import ConvertOptions, describe, plan_roles

    options = ConvertOptions()
    plans = plan_roles(ctx.spec, ["target", "draft"], options)
    if ctx.dry_run:
        from specbuild.artifacts import tool_versions
        from specbuild.convert.export import input_hash, source_hashes
        from specbuild.convert.plan import TOOLS

        versions = tool_versions(*TOOLS)
        roles = {plan.role: "skipped" if not ctx.force and recorded_hash(plan.out_dir) == input_hash(
                     plan, source_hashes(plan), versions) else "planned" for plan in plans}
        return dry_status(roles, [describe(plan) for plan in plans])
    from specbuild.convert.export import convert_role

    results = [convert_role(plan, options, force=ctx.force, log=ctx.log, progress=ctx.progress)
               for plan in plans]
    return {"status": statuses(results), "roles": {r["role"]: r["status"] for r in results}}


def run_build_stage(ctx: UpContext) -> dict[str, Any]:
    from specbuild.engines.stage import build_engines, dry_run

    if ctx.dry_run:
        detail = dry_run(ctx.spec, ["target", "draft"], ctx.backend, ctx.trtllm_build)
        rerun = ctx.force or earlier_will_run(ctx, "convert")  # new checkpoints: new engines
        roles = {e["role"]: "skipped" if not rerun and e["input_hash"] is not None
                 and recorded_hash(Path(e["engine_dir"])) == e["input_hash"] else "planned" for e in detail["engines"]}
        return dry_status(roles, detail)
    results = build_engines(ctx.spec, ["target", "draft"], ctx.backend, force=ctx.force,
                            trtllm_build=ctx.trtllm_build, log=ctx.log)
    return {"status": statuses(results), "backend": ctx.backend,
            "roles": {r["role"]: r["status"] for r in results},
            "engines": {r["role"]: r["engine_dir"] for r in results}}


def run_repo_stage(ctx) -> dict[str, Any]:
    repo = ctx.repo or default_repo_dir(ctx.spec.output_dir)
    if ctx.dry_run:
        from specbuild.artifacts import UP_TO_DATE
        from specbuild.triton.repository import input_hash, plan_settings, render

        settings, _ = plan_settings(ctx.spec, ctx.backend, repo, None, None)
        if not ctx.force and recorded_hash(repo) == input_hash(settings, render(settings)):
            return {"status": "skipped", "detail": UP_TO_DATE, "repo": str(repo)}
        return {"status": "planned", "detail": f"write the {ctx.backend} model repository to {repo}"}
    from specbuild.triton.repository import write_repository

    result = write_repository(ctx.spec, ctx.backend, repo, force=ctx.force)
    for warning in result.warnings:
        ctx.log(f"repo warning: {warning}")
    ctx.log(f"repo: {result.out_dir}" + (" (up to date)" if result.skipped else ""))
    return {"status": "skipped" if result.skipped else "ran", "repo": str(result.out_dir), "backend": ctx.backend}
