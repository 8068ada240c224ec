"""`specbuild up --backend llmapi`: the same five stages as the engine path (`up.stages.stages_for`), for the LLM API.

    check    the pair checks with this path's memory plan (`run_check(backend="llmapi")`)
    convert  Hugging Face checkpoints per role (`llmapi.checkpoint`)
    build    the LLM arguments, validated and written (`llmapi.build`)
    repo     Triton's llmapi repository (`llmapi.repository`; the CPU stand-in unless tensorrt_llm is importable)
    serve    the engine path's stage (`up.serving`): tritonserver under the supervisor, the canary, the demo
             prompts streamed through `session.served`, then stop (--once) or serve until SIGINT/SIGTERM
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from specbuild.artifacts import UP_TO_DATE, recorded_hash
from specbuild.errors import ArtifactError
from specbuild.up.context import dry_status, earlier_will_run


def _recorded(folder: Path, digest: Callable[[], str]) -> bool:
    """The folder's manifest records this input hash (a dry run's "up to date"); False when the inputs are not there
    yet to hash."""
    try:
        return recorded_hash(Path(folder)) == digest()
    except ArtifactError:
        return False



def _claim(ctx) -> None:
    """Refuse now, not after convert, a folder a later stage may not replace (specbuild.artifacts)."""
    from specbuild.artifacts import claim_output, resolve_output
    from specbuild.artifacts import default_repo_dir
    from specbuild.llmapi.build import STAGE as BUILD_STAGE
    from specbuild.llmapi.build import config_dir
    from specbuild.llmapi.checkpoint import STAGE as CONVERT_STAGE
    from specbuild.llmapi.checkpoint import checkpoint_dir

    folders = [(checkpoint_dir(ctx.spec, role), CONVERT_STAGE, "convert") for role in ("target", "draft")]
    folders += [(config_dir(ctx.spec), BUILD_STAGE, "build"), (ctx.repo or default_repo_dir(ctx.spec.output_dir), "repo", "repo")]
    for path, stage, step in folders:
        if step in ctx.stages:
            claim_output(resolve_output(path, stage), stage)


def run_check_stage(ctx) -> dict[str, Any]:
    from specbuild.check import record

    _claim(ctx)
    return record.run_stage(ctx.spec, "llmapi", ctx.force, ctx.dry_run, ctx.log, ctx.progress)


def run_convert_stage(ctx) -> dict[str, Any]:
    from specbuild.convert.plan import ConvertOptions
    from specbuild.llmapi import checkpoint

    options = ConvertOptions()
    plans = checkpoint.plan_roles(ctx.spec, ["target", "draft"], options)
    if ctx.dry_run:
        from specbuild.artifacts import hash_tree, tool_versions

        versions = tool_versions(*checkpoint.TOOLS)
        roles = {plan.role: "skipped" if not ctx.force and recorded_hash(plan.out_dir) == checkpoint.input_hash(
                     plan, hash_tree(plan.hf_dir), versions) else "planned" for plan in plans}
        return dry_status(roles, [checkpoint.describe(plan) for plan in plans])
    results = [checkpoint.convert_role(plan, options, force=ctx.force, log=ctx.log, progress=ctx.progress)
               for plan in plans]
    states = {r["status"] for r in results}
    return {"status": "skipped" if states == {"skipped"} else "ran", "roles": {r["role"]: r["status"] for r in results}}


def run_build_stage(ctx) -> dict[str, Any]:
    from specbuild.llmapi import build

    if ctx.dry_run:
        fresh = not ctx.force and not earlier_will_run(ctx, "convert") and _recorded(build.config_dir(ctx.spec),
                                                                                      lambda: build.input_hash(ctx.spec))
        return {"status": "skipped", "detail": UP_TO_DATE} if fresh else {"status": "planned",
                                                                           "detail": build.dry_run(ctx.spec)}
    result = build.build(ctx.spec, force=ctx.force, log=ctx.log)
    return {"status": result["status"], "backend": "llmapi", "out_dir": result["out_dir"]}


def run_repo_stage(ctx) -> dict[str, Any]:
    from specbuild.artifacts import default_repo_dir

    repo = ctx.repo or default_repo_dir(ctx.spec.output_dir)
    from specbuild.llmapi.repository import input_hash, plan, write_repository

    # `up` serves here, on the checkpoints its convert stage wrote here: the repository names them where they are,
    # whichever runtime loads them (the /engines default of `repo` is the GPU image's compose mount).
    checkpoints = Path(ctx.spec.output_dir).resolve()
    if ctx.dry_run:
        def planned() -> str:
            _, _, files, settings, _ = plan(ctx.spec, checkpoints_dir=checkpoints)
            return input_hash(settings, files)

        fresh = not ctx.force and not earlier_will_run(ctx, "build") and _recorded(repo, planned)
        return {"status": "skipped", "detail": UP_TO_DATE} if fresh else {
            "status": "planned", "detail": f"write the llmapi model repository to {repo}"}

    result = write_repository(ctx.spec, repo, checkpoints_dir=checkpoints, force=ctx.force)
    for warning in result.warnings:
        ctx.log(f"repo warning: {warning}")
    return {"status": "skipped" if result.skipped else "ran", "repo": str(result.out_dir), "backend": "llmapi",
            "runtime": result.runtime}
