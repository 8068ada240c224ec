"""`specbuild convert`: both checkpoints to TensorRT-LLM checkpoints, quantized as the spec says."""

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
    progress_enabled,
    role_option,
    roles,
    show,
    spec_option,
)
from specbuild.config import KV_CACHE_DTYPES, QUANTIZATIONS, replace


@click.command("convert")
@spec_option
@click.option(
    "--backend",
    type=click.Choice(backends.NAMES),
    default=None,
    help="trtllm / reference: TensorRT-LLM checkpoints for engines. llmapi: Hugging Face checkpoints for "
    "the LLM API (docs/llmapi.md). " + backends.DEFAULT_HELP,
)
@role_option
@click.option(
    "--quantization",
    type=click.Choice(QUANTIZATIONS),
    default=None,
    help="Override the spec's quantization for the selected role(s).",
)
@click.option(
    "--kv-cache",
    type=click.Choice([*KV_CACHE_DTYPES, "int8"]),
    default=None,
    help="Override the spec's KV-cache quantization for the selected role(s) (int8 is refused: see docs).",
)
@click.option(
    "--device",
    type=click.Choice(["auto", "cpu", "cuda"]),
    default="auto",
    show_default=True,
    help="Where to load, calibrate and export (auto: CUDA when torch sees a GPU).",
)
@click.option(
    "--calib-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help='Calibration text: plain text (one sample per paragraph) or JSONL with a "text" field. '
    "Default: the built-in sample set.",
)
@click.option(
    "--calib-size",
    type=click.IntRange(min=1),
    default=64,
    show_default=True,
    help="Calibration samples (AWQ uses at most 32).",
)
@click.option(
    "--calib-seq-len", type=click.IntRange(min=8), default=256, show_default=True, help="Tokens per calibration sample."
)
@click.option(
    "--awq-block-size",
    type=click.Choice(["64", "128"]),
    default=None,
    help="AWQ group size (default: 128 when every layer width divides, else 64).",
)
@click.option("--verify", is_flag=True, help="Load the written checkpoint back and compare it with the HF model.")
@force_option
@dry_run_option
@json_option
def command(
    spec_path: Path,
    backend: str | None,
    role: str,
    quantization: str | None,
    kv_cache: str | None,
    device: str,
    calib_file: Path | None,
    calib_size: int,
    calib_seq_len: int,
    awq_block_size: str | None,
    verify: bool,
    force: bool,
    dry_run: bool,
    as_json: bool,
) -> None:
    """Convert (and quantize) the pair's Hugging Face checkpoints with NVIDIA Model Optimizer.

    Writes <output_dir>/<name>/<role>/checkpoint/ (config.json, rank<N>.safetensors, manifest.json);
    with --backend llmapi, <output_dir>/<name>/<role>/hf_checkpoint/ (Hugging Face layout, modelopt
    export_hf_checkpoint when quantized: fp8 or none).
    A rerun with unchanged inputs does nothing; --force redoes it.

    \b
    Examples:
      specbuild convert
      specbuild convert --role draft --quantization fp8 --verify
      specbuild convert --dry-run --json
    """
    from specbuild.convert.plan import ConvertOptions

    spec = get_spec(spec_path)
    selected = roles(role, spec)
    for name in selected:
        changes = {k: v for k, v in (("quantization", quantization), ("kv_cache", kv_cache)) if v is not None}
        if changes:
            spec = replace(spec, name, **changes)
    options = ConvertOptions(
        device=device,
        calib_file=calib_file,
        calib_size=calib_size,
        calib_seq_len=calib_seq_len,
        awq_block_size=int(awq_block_size) if awq_block_size else None,
    )
    path = paths.for_backend(backend or backends.default(spec.build.backend))
    show(
        path.convert(
            spec, selected, options, force=force, verify=verify, dry_run=dry_run, log=log, progress=progress_enabled()
        ),
        as_json,
    )
