"""`specbuild up`: every stage for the spec, in order, skipping what is up to date.

The stages and their order are the library's (`specbuild.up.stages`): this module parses the options, builds the
context (how to log, where the streamed demo text goes, the next commands to suggest), calls `run_up` and prints
its document.
"""

from __future__ import annotations

from pathlib import Path

import click

from specbuild import backends, paths
from specbuild.cli.common import (
    dry_run_option,
    emit_json,
    force_option,
    get_spec,
    json_option,
    log,
    progress_enabled,
    spec_option,
)
from specbuild.up.stages import STAGE_NAMES, UpContext, run_up

NEXT_PROMPT = '"def parse_args(argv):"'


def program() -> tuple[str, str | None]:
    """How to run specbuild again from this folder, and the venv's activate script when that makes plain
    `specbuild` work: (".venv/bin/specbuild", ".venv/bin/activate") under `make demo`."""
    import shutil
    import sys

    from specbuild.cli.common import shown_path

    exe = Path(sys.argv[0])
    if exe.name != "specbuild":
        return "specbuild", None  # python -m specbuild, or embedded
    on_path = shutil.which("specbuild")
    if on_path and Path(on_path).resolve() == exe.resolve():
        return "specbuild", None
    activate = exe.parent / "activate"
    return shown_path(exe), (shown_path(activate) if activate.is_file() else None)


def next_steps(spec, grpc_url: str, serving: bool, backend: str | None = None) -> list[str]:
    """What to run after `specbuild up`: exact commands for this spec, from the current folder (`backend`: the one
    `up` ran, named where `generate --local` would otherwise run other weights)."""
    from specbuild.cli.common import shown_path
    from specbuild.session.served import server_url

    cmd, activate = program()
    c = f" -c {shown_path(spec.path)}" if spec.path else ""
    url = "" if grpc_url == server_url(spec, "grpc") else f" --url {grpc_url}"
    rows: list[tuple[str, str]] = []
    if activate:
        rows.append((f"source {activate}", f"then plain `specbuild ...` works (or type {cmd} as below)"))
    if serving:
        rows += [
            (f"{cmd} generate{c}{url} {NEXT_PROMPT}", "through this server"),
            (f"{cmd} bench{c} --url {grpc_url} --protocol grpc", "speed with and without speculation"),
        ]
    else:
        backend = backend or backends.default(spec.build.backend)
        path = paths.for_backend(backend)  # a path of its own for --local: name the backend
        other = path is not paths.for_backend(backends.default(spec.build.backend))
        rows += [
            (
                f"{cmd} generate{c} --local{f' --backend {backend}' if other else ''} {NEXT_PROMPT}",
                "in-process, no server" + (f", {path.local_note}" if other and path.local_note else ""),
            ),
            (f"{cmd} serve{c}", "serve again (Ctrl-C stops it) ..."),
            (f"{cmd} generate{c} {NEXT_PROMPT}", "... and ask it, from another terminal"),
            (f"{cmd} bench{c} --local", "speed with and without speculation"),
        ]
    rows.append((f"{cmd} check{c}", f"the pair report; every command: {cmd} --help"))
    width = max(len(command) for command, _ in rows)
    where = "in another terminal while this one serves" if serving else "from this folder"
    return ["", f"next ({where}):"] + [f"  {command:<{width}}  # {why}" for command, why in rows]


@click.command("up")
@spec_option
@click.option(
    "--backend",
    type=click.Choice(backends.NAMES),
    default=None,
    help="reference: reference engines (any machine); trtllm: TensorRT engines (GPU image); llmapi: "
    "TensorRT-LLM's LLM API, no engines (GPU image; on CPU a stand-in serves the same contract, "
    "docs/llmapi.md). " + backends.DEFAULT_HELP,
)
@click.option(
    "--trtllm-build",
    "trtllm_build",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Path of trtllm-build (trtllm backend; default: found on PATH).",
)
@click.option(
    "--until",
    "until",
    type=click.Choice(STAGE_NAMES),
    default=None,
    help="Stop after this stage (e.g. --until build in a CI job that must not serve).",
)
@click.option(
    "--repo",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Model repository folder (default: triton_repo beside the spec's output_dir).",
)
@click.option(
    "--once", is_flag=True, help="Serve stage: start, stream the demo prompts, print their acceptance figures, stop."
)
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
    backend = backend or backends.default(spec.build.backend, trtllm_build)
    ctx = UpContext(
        spec=spec,
        backend=backend,
        force=force,
        dry_run=dry_run,
        once=once,
        trtllm_build=str(trtllm_build) if trtllm_build else None,
        repo=repo,
        as_json=as_json,
        log=log,
        echo=None if as_json else (lambda text: click.echo(text, nl=False)),
        next_steps=lambda grpc_url, serving: next_steps(spec, grpc_url, serving, backend),
        progress=progress_enabled(),
    )
    document, error = run_up(ctx, until)
    summary = document["stages"]
    if as_json:
        emit_json(document)
    else:
        for row in summary:
            if dry_run:
                what = {"skipped": "would be skipped (up to date)", "planned": "would run"}.get(
                    row["status"], row["status"]
                )
                roles = row.get("roles") if row["status"] == "planned" else None
                if roles and "skipped" in roles.values():
                    what += (
                        " ("
                        + ", ".join(
                            f"{role} {'up to date' if state == 'skipped' else 'to do'}" for role, state in roles.items()
                        )
                        + ")"
                    )
                click.echo(f"{row['stage']:<8} {what}")
            else:
                click.echo(f"{row['stage']:<8} {row['status']:<8} {row['seconds']:7.1f} s")
            if row["stage"] == "serve" and row.get("endpoints"):
                urls = ", ".join(row["endpoints"].values())
                click.echo(f"  stopped; it served {urls}" if row.get("stopped") else f"  serving {urls}")
            if row["status"] == "planned" and row["stage"] == "build" and "engines" in row["detail"]:
                for engine in row["detail"]["engines"]:
                    click.echo(
                        f"  {engine['role']}: " + (engine["argv_text"] or f"reference engine -> {engine['engine_dir']}")
                    )
    if error is not None:
        raise error
