"""The stages of `specbuild up` and how they run: each stage is a name and a function of the shared `UpContext`
that returns its summary ({"status": "ran" | "skipped" | "planned", ...}); `stages_for(backend)` is the one stage
list: the backend's path (`specbuild.paths`) gives check, convert, build and repo, and every path serves with
`up.serving`; `run_up` runs them in order and stops at the first failure."""

from __future__ import annotations

import contextlib
import sys
import time
from typing import Any

from specbuild import paths
from specbuild.errors import SpecbuildError
from specbuild.paths.context import STAGE_NAMES, Stage, UpContext  # noqa: F401 (UpContext: callers build one)


def stages_for(backend: str) -> list[Stage]:
    """The one stage list of a path, in order."""
    from specbuild.up.serving import run_serve_stage  # the supervisor serves either repository kind

    path = paths.for_backend(backend)
    runs = {
        "check": path.check_stage,
        "convert": path.convert_stage,
        "build": path.build_stage,
        "repo": path.repo_stage,
        "serve": run_serve_stage,
    }
    return [Stage(name, runs[name]) for name in STAGE_NAMES]


def run_stages(ctx: UpContext, stages: list[Stage]) -> tuple[list[dict[str, Any]], SpecbuildError | None]:
    """Run stages in order; stop at the first failure. Returns (one summary per stage reached, the error)."""
    summary = []
    for stage in stages:
        started = time.monotonic()
        if not ctx.dry_run:
            ctx.log(f"== {stage.name}")
        try:
            # Libraries that print (modelopt) must not break --json; without it stdout carries the demo text.
            redirect = contextlib.redirect_stdout(sys.stderr) if ctx.as_json else contextlib.nullcontext()
            with redirect:
                result = stage.run(ctx)
        except SpecbuildError as err:
            summary.append(
                {
                    "stage": stage.name,
                    "status": "failed",
                    "error": str(err),
                    "seconds": round(time.monotonic() - started, 3),
                }
            )
            return summary, err
        ctx.results[stage.name] = result
        summary.append({"stage": stage.name, **result, "seconds": round(time.monotonic() - started, 3)})
        if not ctx.dry_run:
            ctx.log(f"== {stage.name}: {result['status']} ({summary[-1]['seconds']:.1f} s)")
    return summary, None


def run_up(ctx: UpContext, until: str | None = None) -> tuple[dict[str, Any], SpecbuildError | None]:
    """Every stage of ctx.backend's path up to `until` (all by default): (the `up --json` document, the error that
    stopped it, if any)."""
    started = time.monotonic()
    stages = stages_for(ctx.backend)
    names = [stage.name for stage in stages]
    stages = stages[: names.index(until) + 1] if until else stages
    ctx.stages = tuple(stage.name for stage in stages)
    summary, error = run_stages(ctx, stages)
    return {
        "pair": ctx.spec.name,
        "backend": ctx.backend,
        "dry_run": ctx.dry_run,
        "ok": error is None,
        "stages": summary,
        "seconds": round(time.monotonic() - started, 3),
    }, error
