"""What the stages of `specbuild up` share: the context of one run, a stage's record, and the small rules the
stages' summaries follow."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specbuild.artifacts import UP_TO_DATE
from specbuild.config import Spec

STAGE_NAMES = ("check", "convert", "build", "repo", "serve")


@dataclass
class UpContext:
    spec: Spec
    backend: str  # "reference" | "trtllm" | "llmapi"
    force: bool
    dry_run: bool
    once: bool  # for the serve stage: start, answer a canary request, stop
    trtllm_build: str | None = None
    repo: Path | None = None  # model repository folder (default: specbuild.artifacts.default_repo_dir)
    as_json: bool = False  # a JSON document goes to stdout: nothing else may print there
    progress: bool = False  # progress bars on stderr for long work (weight scans, calibration)
    log: Callable[[str], None] = lambda message: print(message, file=sys.stderr)
    echo: Callable[[str], None] | None = None  # the demo prompts' streamed text (None: only logged figures)
    next_steps: Callable[[str, bool], list[str]] | None = None  # (grpc url, still serving) -> lines to log
    results: dict[str, Any] = field(default_factory=dict)  # stage name -> what it returned, for later stages
    stages: tuple[str, ...] = STAGE_NAMES  # the stages this run goes through


@dataclass(frozen=True)
class Stage:
    name: str
    run: Callable[[UpContext], dict[str, Any]]  # returns {"status": "ran" | "skipped" | "planned", ...}


def statuses(items: list[dict[str, Any]]) -> str:
    states = {item.get("status") for item in items}
    return "skipped" if states == {"skipped"} else "ran"


def earlier_will_run(ctx: UpContext, *stages: str) -> bool:
    """In a dry run: will one of these earlier stages run (so its outputs, this stage's inputs, change)?"""
    return any(ctx.results.get(name, {}).get("status") == "planned" for name in stages)


def dry_status(roles: dict[str, str], detail: Any) -> dict[str, Any]:
    """A dry run's stage entry: skipped (up to date) only when every role would be skipped."""
    skipped = set(roles.values()) == {"skipped"}
    return {
        "status": "skipped" if skipped else "planned",
        "roles": roles,
        "detail": detail if not skipped else UP_TO_DATE,
    }
