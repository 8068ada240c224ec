"""`specbuild up`: every stage for the spec, in order, skipping what is up to date.

The stage list is data (`STAGES`): each entry names a stage and a function that runs it and
reports `ran` or `skipped`. Later stages (repo, serve) are added by appending to it.
"""

from __future__ import annotations

import contextlib
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import click

from specbuild.artifacts import UP_TO_DATE, recorded_hash
from specbuild.cli.common import dry_run_option, emit_json, force_option, get_spec, json_option, log, spec_option
from specbuild.config import Spec
from specbuild.errors import SpecbuildError


@dataclass
class UpContext:
    spec: Spec
    backend: str  # "reference" | "trtllm" | "llmapi"
    force: bool
    dry_run: bool
    once: bool  # for the serve stage: start, answer a canary request, stop
    trtllm_build: str | None = None
    repo: Path | None = None  # model repository folder (default: beside the engines folder)
    as_json: bool = False  # the serve stage prints streamed text to stdout only without --json
    log: Callable[[str], None] = log
    results: dict[str, Any] = field(default_factory=dict)  # stage name -> what it returned, for later stages
    stages: tuple[str, ...] = ("check", "convert", "build", "repo", "serve")  # the stages this run goes through


@dataclass(frozen=True)
class Stage:
    name: str
    run: Callable[[UpContext], dict[str, Any]]  # returns {"status": "ran" | "skipped" | "planned", ...}


def _statuses(items: list[dict[str, Any]]) -> str:
    states = {item.get("status") for item in items}
    return "skipped" if states == {"skipped"} else "ran"


def _earlier_will_run(ctx: UpContext, *stages: str) -> bool:
    """In a dry run: will one of these earlier stages run (so its outputs, this stage's inputs, change)?"""
    return any(ctx.results.get(name, {}).get("status") == "planned" for name in stages)


def claim_outputs(ctx: UpContext) -> None:
    """Refuse now, not after convert and build, an output folder that a later stage may not replace
    (someone else's folder, a file, specbuild's output of another stage): see specbuild.artifacts."""
    from specbuild.artifacts import claim_output, resolve_output
    from specbuild.artifacts import default_repo_dir

    folders = [(ctx.spec.pair_dir / role / name, stage) for role in ("target", "draft")
               for name, stage in (("checkpoint", "convert"), ("engine", "build"))]
    folders.append((ctx.repo or default_repo_dir(ctx.spec.output_dir), "repo"))
    for path, stage in folders:
        if stage in ctx.stages:
            claim_output(resolve_output(path, stage), stage)


def run_check_stage(ctx: UpContext) -> dict[str, Any]:
    from specbuild.check import record
    from specbuild.cli.common import progress_enabled

    claim_outputs(ctx)
    return record.run_stage(ctx.spec, None, ctx.force, ctx.dry_run, ctx.log, progress_enabled())


def run_convert_stage(ctx: UpContext) -> dict[str, Any]:
    from specbuild.cli.common import progress_enabled
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
        return _dry_status(roles, [describe(plan) for plan in plans])
    from specbuild.convert.export import convert_role

    results = [convert_role(plan, options, force=ctx.force, log=ctx.log, progress=progress_enabled())
               for plan in plans]
    return {"status": _statuses(results), "roles": {r["role"]: r["status"] for r in results}}


def _dry_status(roles: dict[str, str], detail: Any) -> dict[str, Any]:
    """A dry run's stage entry: skipped (up to date) only when every role would be skipped."""
    skipped = set(roles.values()) == {"skipped"}
    return {"status": "skipped" if skipped else "planned", "roles": roles,
            "detail": detail if not skipped else UP_TO_DATE}


def run_build_stage(ctx: UpContext) -> dict[str, Any]:
    from specbuild.build.engines import build_engines, dry_run

    if ctx.dry_run:
        detail = dry_run(ctx.spec, ["target", "draft"], ctx.backend, ctx.trtllm_build)
        rerun = ctx.force or _earlier_will_run(ctx, "convert")  # new checkpoints: new engines
        roles = {e["role"]: "skipped" if not rerun and e["input_hash"] is not None
                 and recorded_hash(Path(e["engine_dir"])) == e["input_hash"] else "planned" for e in detail["engines"]}
        return _dry_status(roles, detail)
    results = build_engines(ctx.spec, ["target", "draft"], ctx.backend, force=ctx.force,
                            trtllm_build=ctx.trtllm_build, log=ctx.log)
    return {"status": _statuses(results), "backend": ctx.backend,
            "roles": {r["role"]: r["status"] for r in results},
            "engines": {r["role"]: r["engine_dir"] for r in results}}


from specbuild.cli.up_serving import run_repo_stage, run_serve_stage  # noqa: E402  (after the stages above)

STAGES: list[Stage] = [
    Stage("check", run_check_stage),
    Stage("convert", run_convert_stage),
    Stage("build", run_build_stage),
    Stage("repo", run_repo_stage),
    Stage("serve", run_serve_stage),
]


def run_stages(ctx: UpContext, stages: list[Stage] | None = None) -> tuple[list[dict[str, Any]], SpecbuildError | None]:
    """Run stages in order; stop at the first failure. Returns (one summary per stage reached, the error)."""
    summary = []
    for stage in stages or STAGES:
        started = time.monotonic()
        if not ctx.dry_run:
            ctx.log(f"== {stage.name}")
        try:
            # Libraries that print (modelopt) must not break --json; without it stdout carries the demo text.
            redirect = contextlib.redirect_stdout(sys.stderr) if ctx.as_json else contextlib.nullcontext()
            with redirect:
                result = stage.run(ctx)
        except SpecbuildError as err:
            summary.append({"stage": stage.name, "status": "failed", "error": str(err),
                            "seconds": round(time.monotonic() - started, 3)})
            return summary, err
        ctx.results[stage.name] = result
        summary.append({"stage": stage.name, **result, "seconds": round(time.monotonic() - started, 3)})
        if not ctx.dry_run:
            ctx.log(f"== {stage.name}: {result['status']} ({summary[-1]['seconds']:.1f} s)")
    return summary, None


@click.command("up")
@spec_option
@click.option("--backend", type=click.Choice(["reference", "trtllm", "llmapi"]), default=None,
              help="reference: reference engines (any machine); trtllm: TensorRT engines (GPU image); llmapi: "
                   "TensorRT-LLM's LLM API, no engines (GPU image; on CPU a stand-in serves the same contract, "
                   "docs/llmapi.md). Default: the spec's build.backend, else reference.")
@click.option("--trtllm-build", "trtllm_build", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Path of trtllm-build (trtllm backend; default: found on PATH).")
@click.option("--until", "until", type=click.Choice([stage.name for stage in STAGES]), default=None,
              help="Stop after this stage (e.g. --until build in a CI job that must not serve).")
@click.option("--repo", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Model repository folder (default: triton_repo beside the spec's output_dir).")
@click.option("--once", is_flag=True,
              help="Serve stage: start, stream the demo prompts, print their acceptance figures, stop.")
@force_option
@dry_run_option
@json_option
def command(spec_path, backend, trtllm_build, until, repo, once, force, dry_run, as_json):
    """Run every stage (check -> convert -> build -> repo -> serve) for the spec, skipping what is
    up to date, then stream a few held-out prompts (code, JSON, prose) through the speculative BLS
    (or, with --backend llmapi, Triton's llmapi model) and print the text and each request's
    acceptance figures.

    \b
    The server keeps running until Ctrl-C (SIGINT) or SIGTERM, which drain it first (running
    requests finish, new ones are refused; see `specbuild serve --help`); --once stops it after
    the prompts.
    --until STAGE stops earlier (e.g. --until build in a CI job). --force redoes every stage.
    With --json, one document lists each stage as ran / skipped / failed with its time in
    seconds (the serve stage adds the endpoints and the prompts' figures); exit 1 when a stage failed.
    --dry-run writes nothing and says which stages would run and which would be skipped as up to date.
    """
    spec = get_spec(spec_path)
    backend = backend or spec.build.backend or "reference"
    ctx = UpContext(spec=spec, backend=backend, force=force, dry_run=dry_run, once=once,
                    trtllm_build=str(trtllm_build) if trtllm_build else None, repo=repo, as_json=as_json)
    started = time.monotonic()
    if backend == "llmapi":
        from specbuild.cli.up_llmapi import stages as llmapi_stages

        path_stages = [Stage(name, run) for name, run in llmapi_stages()]
    else:
        path_stages = STAGES
    names = [stage.name for stage in path_stages]
    stages = path_stages[: names.index(until) + 1] if until else path_stages
    ctx.stages = tuple(stage.name for stage in stages)
    summary, error = run_stages(ctx, stages)
    document = {"pair": spec.name, "backend": backend, "dry_run": dry_run, "ok": error is None,
                "stages": summary, "seconds": round(time.monotonic() - started, 3)}
    if as_json:
        emit_json(document)
    else:
        for row in summary:
            if dry_run:
                what = {"skipped": "would be skipped (up to date)", "planned": "would run"}.get(row["status"],
                                                                                              row["status"])
                roles = row.get("roles") if row["status"] == "planned" else None
                if roles and "skipped" in roles.values():
                    what += " (" + ", ".join(f"{role} {'up to date' if state == 'skipped' else 'to do'}"
                                             for role, state in roles.items()) + ")"
                click.echo(f"{row['stage']:<8} {what}")
            else:
                click.echo(f"{row['stage']:<8} {row['status']:<8} {row['seconds']:7.1f} s")
            if row["stage"] == "serve" and row.get("endpoints"):
                urls = ", ".join(row["endpoints"].values())
                click.echo(f"  stopped; it served {urls}" if row.get("stopped") else f"  serving {urls}")
            if row["status"] == "planned" and row["stage"] == "build" and "engines" in row["detail"]:
                for engine in row["detail"]["engines"]:
                    click.echo(f"  {engine['role']}: " + (engine["argv_text"] or f"reference engine -> {engine['engine_dir']}"))
    if error is not None:
        raise error
