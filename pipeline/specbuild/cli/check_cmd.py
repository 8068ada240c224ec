"""`specbuild check`: the pair verdict (tokenizers, vocabulary, architecture, memory plan)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from specbuild import backends
from specbuild.cli.common import emit_json, get_spec, json_option, spec_option


def _tokenizer_line(doc: dict[str, Any]) -> str:
    tok = doc["tokenizer"]
    if tok.get("target_only"):
        return f"the target's ({tok['size']} tokens; no draft model to compare)"
    if tok.get("identical") is None:
        return "not compared (unreadable)"
    if not tok["identical"]:
        first = tok.get("first_difference")
        named = f": first at id {first['id']} ({first['target']!r} vs {first['draft']!r})" if first else ""
        return "DIFFERENT" + named
    special = ", ".join(f"{role} {v['id']}" for role, v in tok["special_tokens"].items() if v["id"] is not None)
    return f"identical ({tok['size']['target']} tokens; {special or 'no special tokens'})"


def _vocab_line(doc: dict[str, Any]) -> str:
    v = doc["vocab"]
    tokenizer = v["tokenizer_size"] if v["tokenizer_size"] is not None else "?"
    if "draft_rows" not in v:  # a target-only deployment
        return f"target {v['target_rows']} rows, tokenizer {tokenizer}"
    line = f"target {v['target_rows']} rows, draft {v['draft_rows']} rows, tokenizer {tokenizer}"
    if v["will_pad"]:
        padded = [role for role, n in v["pad_rows"].items() if n]
        line += f" -> {' and '.join(padded)} padded to {v['padded_vocab_size']} at convert time"
    return line


def _memory_lines(doc: dict[str, Any]) -> list[str]:
    from specbuild.check.pair import MEMORY_PLANS

    m = doc["memory"]
    return MEMORY_PLANS[m.get("path", "engine")].summary_lines(m)


def _weights_line(doc: dict[str, Any]) -> str:
    from specbuild.check.advice import gib

    section = doc.get("weights") or {}
    parts = []
    for role in doc["models"]:
        scan = section.get(role) or {}
        if not scan.get("scanned"):
            parts.append(f"{role} not scanned ({scan.get('reason', 'no safetensors')})")
            continue
        bad = sum(t["nan"] + t["inf"] for t in scan["nonfinite"])
        state = f"{bad:,} NaN/Inf values" if bad else "all finite"
        if scan["damaged"]:
            state += ", truncated"
        parts.append(f"{role} {state} ({gib(scan['bytes'])} in {scan['seconds']:.2f} s)")
    return "; ".join(parts)


def format_report(doc: dict[str, Any]) -> str:
    """The human summary of a check report document."""
    rows: list[tuple[str, str]] = [("pair", doc["pair"])]
    for role, info in doc["models"].items():
        rows.append(
            (
                role,
                f"{info['architecture']} ({info['trtllm_model_type'] or 'unsupported'}), "
                f"{info['num_params'] / 1e6:,.1f}M params, {info['path']}",
            )
        )
    rows.append(("tokenizer", _tokenizer_line(doc)))
    rows.append(("vocab", _vocab_line(doc)))
    rows.append(("weights", _weights_line(doc)))
    memory = _memory_lines(doc)
    rows.append(("memory", memory[0]))
    rows.extend(("", line) for line in memory[1:])
    lines = [f"{key:<11}{value}" for key, value in rows]
    for kind in ("problems", "warnings"):
        for finding in doc[kind]:
            lines.append(f"{kind[:-1]:<11}[{finding['code']}] {finding['message']}")
            if finding["fix"]:
                lines.append(f"{'':<11}  fix: {finding['fix']}")
    what = "the pair is" if "draft" in doc["models"] else "the target is (no draft model)"
    lines.append(f"OK: {what} usable." if doc["ok"] else f"NOT OK: {len(doc['problems'])} problem(s).")
    return "\n".join(lines)


@click.command()
@spec_option
@json_option
@click.option(
    "--allow-pickle",
    is_flag=True,
    help="Accept checkpoints whose weights are pickle files (.bin/.pt): only for files you trust.",
)
@click.option(
    "--no-weight-scan",
    "no_weight_scan",
    is_flag=True,
    help="Skip reading every weight for NaN/Inf (it reads the whole checkpoint once, at disk speed).",
)
@click.option(
    "--measure",
    is_flag=True,
    help="Also measure alpha and c in-process on sample prompts and predict "
    "the speedup per K and the best max_draft_len (loads both models; see docs/bench.md).",
)
@click.option(
    "--prompts",
    "prompts_file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help='JSONL prompts for --measure (one {"prompt": ...} per line; default: built-in code/prose/json).',
)
@click.option(
    "--backend",
    type=click.Choice(backends.NAMES),
    default=None,
    help="Whose memory plan and limits: the engines' (trtllm, reference) or the LLM API's (llmapi: one "
    "process, one KV pool, one fraction). " + backends.DEFAULT_HELP,
)
@click.pass_context
def command(
    ctx: click.Context,
    spec_path: Path,
    as_json: bool,
    allow_pickle: bool,
    no_weight_scan: bool,
    measure: bool,
    prompts_file: Path | None,
    backend: str | None,
) -> None:
    """Check that the pair can work and fits the GPU, before any GPU work.

    \b
    - tokenizers: the full token->id map, added and special tokens (BOS/EOS/pad) must match;
    - vocabulary: embedding rows may differ (padded at convert time);
    - weights: every safetensors tensor is scanned for NaN/Inf (a damaged download);
    - architectures supported by the TensorRT-LLM export, max_seq_len within position limits;
    - memory plan for [gpu]: weights, KV cache per token, the largest batch at max_seq_len,
      kv_cache_free_gpu_mem_fraction for each model, or what to change when it does not fit.

    Exit codes: 0 usable pair, 1 unusable pair or bad input, 2 usage error.
    """
    from specbuild.check import run_check
    from specbuild.cli.common import progress_enabled

    spec = get_spec(spec_path)
    backend = backend or backends.default(spec.build.backend)
    report = run_check(
        spec, allow_pickle=allow_pickle, scan_weights=not no_weight_scan, progress=progress_enabled(), backend=backend
    )
    fields = report.to_dict()
    doc = {"ok": fields.pop("ok"), "pair": fields.pop("pair"), "backend": backend, **fields}
    if prompts_file is not None and not measure:
        raise click.UsageError("--prompts is used by --measure: add --measure.")
    if measure and report.ok:
        from specbuild.bench import measure as measurement
        from specbuild.cli.common import log

        doc["measure"] = measurement.measure(spec, prompts_file=prompts_file, log=log, progress=True)
    if as_json:
        emit_json(doc)
    else:
        click.echo(format_report(doc))
        if "measure" in doc:
            from specbuild.bench import measure as measurement

            click.echo(
                "\n".join(
                    f"{'measure' if i == 0 else '':<11}{line}"
                    for i, line in enumerate(measurement.summary_lines(doc["measure"]))
                )
            )
    if not report.ok:
        ctx.exit(1)
