"""`specbuild repo`: write the Triton model repository for the pair."""

from __future__ import annotations

import json
from pathlib import Path

import click

from specbuild import backends, paths
from specbuild.artifacts import default_repo_dir
from specbuild.cli.common import dry_run_option, force_option, get_spec, json_option, show, spec_option


def detect_backend(spec) -> str:
    """The backend the target engine was built with, else the default rule's (the repository can precede the build)."""
    manifest = spec.pair_dir / "target" / "engine" / "manifest.json"
    try:
        backend = json.loads(manifest.read_text()).get("backend")
    except (OSError, ValueError):
        backend = None
    return backend if backend in backends.ENGINE_BACKENDS else backends.default(None)


@click.command("repo")
@spec_option
@click.option(
    "--backend",
    type=click.Choice(backends.NAMES),
    default=None,
    help="trtllm: the tensorrtllm C++ backend (GPU image). reference: Python models serving the PyTorch "
    "reference engines (any machine). llmapi: Triton's llmapi model (TensorRT-LLM LLM API; "
    "docs/llmapi.md). Default: the spec's build.backend, else the target engine's backend if built, "
    "else trtllm where trtllm-build is on PATH (NVIDIA's image), else reference.",
)
@click.option(
    "--runtime",
    type=click.Choice(["auto", "tensorrt_llm", "reference"]),
    default="auto",
    show_default=True,
    help="llmapi: NVIDIA's model.py from the GPU image (tensorrt_llm) or the CPU stand-in (reference); auto: "
    "tensorrt_llm when the tensorrt_llm package is importable here.",
)
@click.option(
    "--checkpoints-dir",
    default=None,
    help="llmapi: the output folder as the server sees it (model.yaml names <dir>/<name>/<role>/hf_checkpoint). "
    "Default: /engines for runtime tensorrt_llm, the spec's output_dir for reference.",
)
@click.option(
    "--out-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="The model repository folder to write (default: triton_repo beside the spec's output_dir, where "
    "`serve` and `up` look for it).",
)
@click.option(
    "--engines-dir",
    default=None,
    help="The engines folder as the server will see it. trtllm default: /engines (the GPU image's mount); "
    "reference default: the spec's output_dir, written relative to --out-dir.",
)
@click.option(
    "--tokenizer-dir",
    default=None,
    help="Tokenizer folder for pre/postprocessing. Default: the reference target engine (reference), the "
    "target checkpoint (trtllm).",
)
@force_option
@dry_run_option
@json_option
def command(spec_path, backend, runtime, checkpoints_dir, out_dir, engines_dir, tokenizer_dir, force, dry_run, as_json):
    """Write the Triton model repository: preprocessing, postprocessing, tensorrt_llm (target),
    tensorrt_llm_draft, tensorrt_llm_bls (speculative decoding), ensemble (target only) and
    serving_gate (closed by serve's drain on SIGTERM: new requests are then refused UNAVAILABLE).

    \b
    Model and tensor names are NVIDIA's inflight_batcher_llm ones, so existing clients work.
    Every config.pbtxt is built as a typed Triton ModelConfig and written in protobuf text format:
    every value is filled now; no ${...} placeholder is ever written. The trtllm flavour is made
    from the build plan, so it can be generated and reviewed before the engines exist.
    With --backend llmapi: Triton's llmapi layout, one tensorrt_llm model with NVIDIA's tensors and
    1/model.yaml holding the LLM arguments (docs/llmapi.md).

    \b
    Exit codes: 0 written or up to date, 1 error (bad spec, engines that disagree, locked output), 2 usage.
    """
    spec = get_spec(spec_path)
    out_dir = out_dir or default_repo_dir(spec.output_dir)
    backend = backend or spec.build.backend or detect_backend(spec)
    show(
        paths.for_backend(backend).repo(
            spec,
            backend,
            out_dir,
            runtime=runtime,
            checkpoints_dir=checkpoints_dir,
            engines_dir=engines_dir,
            tokenizer_dir=tokenizer_dir,
            force=force,
            dry_run=dry_run,
        ),
        as_json,
    )
