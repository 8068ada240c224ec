"""The last passing check of a pair (`<output_dir>/<pair>/check.json`), so `specbuild up` can skip the check
stage while its inputs are unchanged.

The inputs are what `check` reads: the spec, each checkpoint's config and tokenizer files (hashed), and its
weight files' sizes and modification times (the NaN scan reads them; hashing would cost as much), so a
weight file rewritten in place, same size, is checked again. The LLM API path's check (its own memory plan)
is recorded under its own key, so switching paths checks again.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from specbuild.artifacts import combined_hash, hash_file, write_json
from specbuild.backends import default as default_backend
from specbuild.backends import path_of
from specbuild.config import Spec

CHECK_RECORD = "check.json"  # in the pair folder


def check_inputs_hash(spec: Spec) -> str:
    from specbuild import __version__

    parts: dict[str, Any] = {"spec": spec.to_dict(), "specbuild": __version__}
    for role in spec.roles:
        folder = Path(spec.role(role).checkpoint)
        files: dict[str, Any] = {}
        if folder.is_dir():
            for path in sorted(folder.iterdir()):
                if not path.is_file():
                    continue
                if path.suffix in (".json", ".model", ".txt", ".jinja"):
                    files[path.name] = hash_file(path)
                else:
                    stat = path.stat()
                    files[path.name] = [stat.st_size, stat.st_mtime_ns]
        parts[role] = files
    return combined_hash(parts)


def record_path(spec: Spec) -> Path:
    return spec.pair_dir / CHECK_RECORD


def _key(spec: Spec, backend: str | None) -> str:
    path = path_of(backend)
    return check_inputs_hash(spec) + ("" if path == "engine" else f":{path}")  # one record per path's checks


def passed_unchanged(spec: Spec, backend: str | None = None) -> bool:
    """A check passed on exactly these inputs (for the LLM API path with backend "llmapi")."""
    try:
        return json.loads(record_path(spec).read_text()).get("input_hash") == _key(spec, backend)
    except (OSError, ValueError, AttributeError):
        return False


def record_pass(spec: Spec, warnings: list[dict[str, Any]], backend: str | None = None) -> None:
    path = record_path(spec)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, {"input_hash": _key(spec, backend), "ok": True, "warnings": warnings})


def forget(spec: Spec) -> None:
    """After a failing check: the next run checks again."""
    record_path(spec).unlink(missing_ok=True)


def run_stage(spec: Spec, backend: str | None, force: bool, dry_run: bool, log, progress: bool) -> dict[str, Any]:
    """`up`'s check stage, for either path (backend "llmapi": the LLM API path's check and record): skipped while
    the last passing check saw these inputs, planned on a dry run, else run; a failing check raises PairError with
    its first problem and forgets the record."""
    from specbuild.artifacts import UP_TO_DATE
    from specbuild.errors import PairError

    fresh = not force and passed_unchanged(spec, backend)
    if dry_run:
        from specbuild.check.pair import MEMORY_PLANS

        plan = MEMORY_PLANS[path_of(backend)].name
        return (
            {"status": "skipped", "detail": UP_TO_DATE}
            if fresh
            else {"status": "planned", "detail": f"read the checkpoints' configs and tokenizers; {plan}"}
        )
    if fresh:
        log(f"check: inputs unchanged since the last passing check ({record_path(spec)}), skipped.")
        return {"status": "skipped"}
    from specbuild.check.pair import run_check

    report = run_check(spec, progress=progress, backend=backend or default_backend(spec.build.backend))
    for warning in report.warnings:
        log(f"check warning: {warning.message}")
    if not report.ok:
        forget(spec)
        first = report.problems[0]
        more = f" (and {len(report.problems) - 1} more; run `specbuild check`)" if len(report.problems) > 1 else ""
        raise PairError(f"check failed: {first.message} {first.fix}".strip() + more)
    record_pass(spec, [w.to_dict() for w in report.warnings], backend)
    return {"status": "ran", "warnings": len(report.warnings)}
