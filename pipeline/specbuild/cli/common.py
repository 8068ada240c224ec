"""Options and output helpers shared by the subcommands."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from specbuild.config import Spec, load_spec

DEFAULT_SPEC = "specbuild.toml"

spec_option = click.option(
    "-c",
    "--config",
    "spec_path",
    default=DEFAULT_SPEC,
    show_default=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="The spec file describing the target/draft pair.",
)
json_option = click.option("--json", "as_json", is_flag=True, help="Print one JSON document to stdout.")
force_option = click.option("--force", is_flag=True, help="Redo the work even if the inputs are unchanged.")
dry_run_option = click.option(
    "--dry-run", is_flag=True, help="Print what would run and which files would be written; change nothing."
)


def checked_timing(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A TIMING option's value (reference.timing's grammar: --timed, bench --predict), refused as a usage error."""
    if value is not None:
        from specbuild.reference.timing import StandInTiming

        try:
            StandInTiming.parse(value)
        except ValueError as err:
            raise click.BadParameter(str(err)) from None
    return value


def _timing(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """--timed: checked, then set as $SPECBUILD_STANDIN_TIMING, which every reference model reads as it loads (in this
    process, in the draft's child, in a server started from here)."""
    if checked_timing(ctx, param, value) is not None:
        import os

        from specbuild.reference.timing import TIMING_ENV

        os.environ[TIMING_ENV] = value
    return value


timed_option = click.option(
    "--timed",
    metavar="TIMING",
    default=None,
    callback=_timing,
    expose_value=True,
    help="Timed stand-ins: the reference models take the time a GPU's step would (waiting, not computing), with "
    "their outputs unchanged: 20ms (every step), target=20ms,draft=2ms, or gpu=H100-80GB[,target=8B][,draft=1B]"
    "[,bytes_per_weight=1] (that GPU's cost model of weights and KV bytes over its bandwidth; the models' own sizes "
    "unless named). Sets $SPECBUILD_STANDIN_TIMING. Figures then describe the GPU's step times, not this machine.",
)
role_option = click.option(
    "--role",
    type=click.Choice(["target", "draft", "both"]),
    default="both",
    show_default=True,
    help="Which model of the pair to process (both: every model the spec has; a target-only spec has one).",
)


def roles(role: str, spec: Spec) -> list[str]:
    return list(spec.roles) if role == "both" else [role]


DEMO_SPEC = Path(".demo") / "specbuild.toml"  # written by `make demo` in the repository root


def get_spec(spec_path: Path) -> Spec:
    """Load the spec. Without -c and with no ./specbuild.toml, the demo's spec (./.demo/specbuild.toml) is
    used when it exists, and the choice is said on stderr, so the help's examples work after `make demo`."""
    ctx = click.get_current_context(silent=True)
    defaulted = ctx is not None and ctx.get_parameter_source("spec_path") == click.core.ParameterSource.DEFAULT
    if defaulted and not Path(spec_path).exists() and DEMO_SPEC.is_file():
        log(f"no {spec_path} here: using the demo's spec {DEMO_SPEC} (pass -c to choose another)")
        spec_path = DEMO_SPEC
    return load_spec(spec_path)


def shown_path(path: Path | None) -> str:
    """`path` as a user would type it here: relative to the current folder when it is below it."""
    if path is None:
        return DEFAULT_SPEC
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def log(message: str) -> None:
    """Progress and logs go to stderr; stdout is for results."""
    click.echo(message, err=True)


JSON_EMITTED = "specbuild.json_emitted"  # click context meta key: the command printed its --json document


def emit_json(document: Any) -> None:
    click.echo(json.dumps(document, indent=2, sort_keys=False, default=str))
    ctx = click.get_current_context(silent=True)
    if ctx is not None:
        ctx.meta[JSON_EMITTED] = True


def show(outcome: Any, as_json: bool) -> None:
    """A path's `paths.interface.Outcome`: its warnings on stderr, then its JSON document or its lines on stdout."""
    for warning in outcome.warnings:
        log(f"warning: {warning}")
    if as_json:
        emit_json(outcome.document)
        return
    for line in outcome.lines:
        click.echo(line)


def failure_document(command: str | None, message: str, error_type: str, exit_code: int) -> dict[str, Any]:
    """What a --json command prints on stdout when it fails before printing its own document."""
    return {"command": command, "ok": False, "error": message, "error_type": error_type, "exit_code": exit_code}


def progress_enabled() -> bool:
    return sys.stderr.isatty()
