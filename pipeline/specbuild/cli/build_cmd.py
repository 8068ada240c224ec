"""`specbuild build`: engines for the pair (trtllm-build on GPU, or reference engines anywhere)."""

from __future__ import annotations

from pathlib import Path

import click

from specbuild import backends, paths
from specbuild.cli.common import (
    dry_run_option,
    force_option,
    get_spec,
    json_option,
    log,
    role_option,
    roles,
    show,
    spec_option,
)

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
    spec = get_spec(spec_path)
    backend = backend or backends.default(spec.build.backend, trtllm_build)
    show(
        paths.for_backend(backend).build(
            spec,
            backend,
            roles(role, spec),
            trtllm_build=str(trtllm_build) if trtllm_build else None,
            force=force,
            dry_run=dry_run,
            log=log,
        ),
        as_json,
    )
