"""`specbuild convert`: both checkpoints to TensorRT-LLM checkpoints, quantized as the spec says."""

from __future__ import annotations

from pathlib import Path

import click

from specbuild import backends
from specbuild.cli.common import (dry_run_option, emit_json, force_option, get_spec, json_option, log,
                                  progress_enabled, role_option, roles, spec_option)
from specbuild.config import KV_CACHE_DTYPES, QUANTIZATIONS, replace


@click.command("convert")
@spec_option
@click.option("--backend", type=click.Choice(backends.NAMES), default=None,
              help="trtllm / reference: TensorRT-LLM checkpoints for engines. llmapi: Hugging Face checkpoints for "
                   "the LLM API (docs/llmapi.md). " + backends.DEFAULT_HELP)
@role_option
@click.option("--quantization", type=click.Choice(QUANTIZATIONS), default=None,
              help="Override the spec's quantization for the selected role(s).")
@click.option("--kv-cache", type=click.Choice([*KV_CACHE_DTYPES, "int8"]), default=None,
              help="Override the spec's KV-cache quantization for the selected role(s) (int8 is refused: see docs).")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True,
              help="Where to load, calibrate and export (auto: CUDA when torch sees a GPU).")
@click.option("--calib-file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Calibration text: plain text (one sample per paragraph) or JSONL with a \"text\" field. "
                   "Default: the built-in sample set.")
@click.option("--calib-size", type=click.IntRange(min=1), default=64, show_default=True,
              help="Calibration samples (AWQ uses at most 32).")
@click.option("--calib-seq-len", type=click.IntRange(min=8), default=256, show_default=True,
              help="Tokens per calibration sample.")
@click.option("--awq-block-size", type=click.Choice(["64", "128"]), default=None,
              help="AWQ group size (default: 128 when every layer width divides, else 64).")
@click.option("--verify", is_flag=True, help="Load the written checkpoint back and compare it with the HF model.")
@force_option
@dry_run_option
@json_option
def command(spec_path: Path, backend: str | None, role: str, quantization: str | None, kv_cache: str | None, device: str,
            calib_file: Path | None, calib_size: int, calib_seq_len: int, awq_block_size: str | None,
            verify: bool, force: bool, dry_run: bool, as_json: bool) -> None:
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
    from specbuild.convert.plan import ConvertOptions, describe, plan_roles

    spec = get_spec(spec_path)
    selected = roles(role)
    for name in selected:
        changes = {k: v for k, v in (("quantization", quantization), ("kv_cache", kv_cache)) if v is not None}
        if changes:
            spec = replace(spec, name, **changes)
    options = ConvertOptions(device=device, calib_file=calib_file, calib_size=calib_size,
                             calib_seq_len=calib_seq_len, awq_block_size=int(awq_block_size) if awq_block_size else None)
    if backends.is_llm_api(backend or spec.build.backend):
        from specbuild.cli.llmapi_cmds import convert as llmapi_convert

        llmapi_convert(spec, selected, options, force=force, verify=verify, dry_run=dry_run, as_json=as_json)
        return
    plans = plan_roles(spec, selected, options)
    if dry_run:
        document = {"command": "convert", "dry_run": True, "pair": spec.name, "roles": [describe(p) for p in plans]}
        if as_json:
            emit_json(document)
        else:
            for p in plans:
                d = describe(p)
                click.echo(f"{p.role}: {p.hf_dir} -> {p.out_dir}")
                click.echo(f"  quantization {p.quantization} (quant_algo {p.quant_algo}), kv_cache {p.kv_cache}, "
                           f"dtype {p.dtype}, tp {p.tp_size}, pp {p.pp_size}, vocab {p.vocab_rows}"
                           + (f" padded to {p.pad_vocab_to}" if p.pad_vocab_to else ""))
                if p.calibration:
                    click.echo(f"  calibration: {p.calibration.source}, {p.calibration.size} samples x "
                               f"{p.calibration.seq_len} tokens")
                click.echo("  would write: " + ", ".join(Path(f).name for f in d["would_write"]))
        return

    from specbuild.convert.export import convert_role

    results = [convert_role(p, options, force=force, verify=verify, log=log, progress=progress_enabled())
               for p in plans]
    if as_json:
        emit_json({"command": "convert", "pair": spec.name, "roles": results})
        return
    for r in results:
        m = r["manifest"]
        state = "up to date, skipped" if r["status"] == "skipped" else "written"
        click.echo(f"{r['role']}: {r['checkpoint']} ({state}; quant_algo {m.get('quant_algo')}, "
                   f"kv_cache_quant_algo {m.get('kv_cache_quant_algo')}, vocab {m.get('vocab_size')}, "
                   f"tp {m.get('mapping', {}).get('tp_size')} pp {m.get('mapping', {}).get('pp_size')})")
        if r.get("verification"):
            v = r["verification"]
            click.echo(f"  verify: {'passed' if v['passed'] else 'FAILED'}: top-1 {v['top1_agreement']:.1%}, "
                       f"max |logit error| {v['max_abs_logit_error']:.3g} vs {v['reference']}")
