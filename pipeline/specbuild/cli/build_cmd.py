"""`specbuild build`: engines for the pair (trtllm-build on GPU, or reference engines anywhere)."""

from __future__ import annotations

import time
from pathlib import Path

import click

from specbuild import backends
from specbuild.cli.common import (dry_run_option, emit_json, force_option, get_spec, json_option, log, role_option,
                                  roles, spec_option)

backend_option = click.option(
    "--backend",
    type=click.Choice(backends.NAMES),
    default=None,
    help="trtllm: TensorRT engines with trtllm-build (GPU image). reference: float32 PyTorch engines (any machine). "
         "llmapi: the LLM API's arguments, validated and written (nothing to compile). " + backends.DEFAULT_HELP,
)
trtllm_build_option = click.option(
    "--trtllm-build",
    "trtllm_build",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Path of the trtllm-build executable (default: found on PATH).",
)


def summary_row(result: dict) -> dict:
    manifest = result.get("manifest") or {}
    return {
        "role": result["role"],
        "status": result["status"],
        "engine_dir": result["engine_dir"],
        "backend": manifest.get("backend"),
        "input_hash": manifest.get("input_hash"),
        "argv_text": manifest.get("argv_text"),
        "seconds": manifest.get("seconds") if result["status"] == "ran" else 0.0,
    }


@click.command("build")
@spec_option
@backend_option
@trtllm_build_option
@role_option
@force_option
@dry_run_option
@json_option
def command(spec_path, backend, trtllm_build, role, force, dry_run, as_json):
    """Build the target and draft engines from the converted checkpoints.

    \b
    The target gets --speculative_decoding_mode draft_tokens_external --max_draft_len K;
    both get paged KV cache and paged context FMHA (KV-cache reuse). Each engine folder gets a
    manifest.json (input hashes, exact argv, tool versions); unchanged inputs are skipped.
    With --backend llmapi nothing is compiled: the LLM API's arguments are validated and written to
    <output_dir>/<name>/llmapi/ (docs/llmapi.md).

    \b
    Exit codes: 0 built or up to date, 1 error (trtllm-build missing or failed, engine
    disagrees with the request, inputs missing, output locked), 2 usage error.
    """
    from specbuild.engines.stage import build_engines, dry_run as plan_dry_run

    spec = get_spec(spec_path)
    backend = backend or backends.default(spec.build.backend, trtllm_build)
    if backends.is_llm_api(backend):
        from specbuild.cli.llmapi_cmds import build as llmapi_build

        llmapi_build(spec, force=force, dry_run=dry_run, as_json=as_json)
        return
    selected = roles(role)
    if dry_run:
        document = plan_dry_run(spec, selected, backend, str(trtllm_build) if trtllm_build else None)
        if as_json:
            emit_json(document)
            return
        for engine in document["engines"]:
            click.echo(f"# {engine['role']}: {engine['checkpoint_dir']} -> {engine['engine_dir']}")
            if engine["argv_text"]:
                click.echo(engine["argv_text"])
            for note in engine["notes"]:
                click.echo(f"# note: {note}")
            click.echo("# would write: " + ", ".join(engine["writes"]))
        return
    started = time.monotonic()
    results = build_engines(spec, selected, backend, force=force,
                            trtllm_build=str(trtllm_build) if trtllm_build else None, log=log)
    rows = [summary_row(result) for result in results]
    if as_json:
        emit_json({"stage": "build", "backend": backend, "pair": spec.name, "engines": rows,
                   "seconds": round(time.monotonic() - started, 3)})
        return
    for row in rows:
        click.echo(f"{row['role']}: {row['status']} ({row['backend']}) {row['engine_dir']}")
