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
role_option = click.option(
    "--role",
    type=click.Choice(["target", "draft", "both"]),
    default="both",
    show_default=True,
    help="Which model of the pair to process.",
)


def roles(role: str) -> list[str]:
    return ["target", "draft"] if role == "both" else [role]


def get_spec(spec_path: Path) -> Spec:
    return load_spec(spec_path)


def log(message: str) -> None:
    """Progress and logs go to stderr; stdout is for results."""
    click.echo(message, err=True)


def emit_json(document: Any) -> None:
    click.echo(json.dumps(document, indent=2, sort_keys=False, default=str))


def progress_enabled() -> bool:
    return sys.stderr.isatty()
