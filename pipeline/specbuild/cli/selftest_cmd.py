"""`specbuild selftest`: the GPU path on this machine as one command and one JSON report (specbuild.up.selftest)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from specbuild.cli.common import emit_json, json_option, log

VARIANTS = click.Choice(["full", "tiny"])


@click.command(name="selftest")
@click.option(
    "--workdir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("specbuild-selftest"),
    show_default=True,
    help="Where the example pair's checkpoints, engines and repository go (its own "
    "folder: nothing outside it is written).",
)
@click.option(
    "--out",
    "out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="The JSON report. Default: selftest.json in --workdir.",
)
@click.option(
    "--variant",
    type=VARIANTS,
    default="full",
    show_default=True,
    help="The built-in example pair to run (tiny: trained in seconds, for CI).",
)
@json_option
def command(workdir: Path, out: Path | None, variant: str, as_json: bool) -> None:
    """Run the GPU path's risks in order, each passed or failed with its evidence and the fix to try.

    \b
    In NVIDIA's Triton TensorRT-LLM image on your GPU (docker/Dockerfile.gpu):
      docker run --rm --gpus all -v "$PWD":/work specbuild-gpu selftest --json
    The steps: the image's versions; convert + build of the built-in example pair at float16 (and fp8 where
    the GPU has it); the repository loads in tritonserver; greedy K = 3 equals K = 0 token for token through
    the BLS; sampling with draft logits; the acceptance figures agree with the tokens; streaming and
    cancellation; the requests of NVIDIA's speculative-decoding test (ensemble, BLS and client-side
    speculation give one text); the LLM API probe; a first speed figure (K = 3 against K = 0); one request
    through the LLM API path's own repository and server.
    Without a GPU (or TensorRT-LLM) the steps run on the reference backend and the GPU-only ones say
    "not run (no GPU)" (on a GPU without TensorRT-LLM, "not run (no TensorRT-LLM ...)" for those that
    need it; the fp8 calibration runs there). Exit 0 when no step failed, 1 otherwise.
    """
    from specbuild.up.selftest import detect_gpu, selftest

    report = selftest(workdir, variant, log=log, gpu=detect_gpu())
    path = out or workdir / "selftest.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    if as_json:
        emit_json({**report, "report": str(path)})
    else:
        for row in report["steps"]:
            click.echo(f"{row['status']:<24} {row['step']}" + (f": {row['evidence']}" if row.get("evidence") else ""))
            if row.get("fix"):
                click.echo(f"{'':24} fix: {row['fix']}")
        click.echo(f"report: {path}")
    if not report["ok"]:
        raise SystemExit(1)
