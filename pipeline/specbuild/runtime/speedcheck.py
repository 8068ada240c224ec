"""A quick in-process speed check: tokens/s with speculation off (K = 0) and on (each K), in one run.

    python -m specbuild.runtime.speedcheck -c specbuild.toml [--ks 1,2,4,8] [--prompts 6] [--max-tokens 64]

Greedy decoding on the built-in held-out prompts (code, prose, JSON), the same prompts for every
K, one warm-up pass first. Prints tokens/s for K = 0 and every K, the best K and its ratio to
K = 0, and whether every K produced exactly the K = 0 tokens. The full benchmark (concurrency,
servers, plots) is `specbuild bench`; this is the small, reusable check behind the runtime's
"speculation pays" claim.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import click

from specbuild.config import Spec


def speedcheck(spec: Spec, ks: list[int], n_prompts: int = 6, max_tokens: int = 64, device: str | None = None,
               threads: int | None = None, row_block: int | None = None, pair: Any = None, log=None) -> dict[str, Any]:
    """Measure greedy tokens/s for K = 0 and each K in ks (clamped to max_draft_len); return a report dict."""
    from transformers import AutoTokenizer

    from specbuild.example.corpus import heldout_prompts
    from specbuild.runtime.loading import load_pair
    from specbuild.speculative.loop import GenerationRequest, run

    pair = pair or load_pair(spec, device=device, threads=threads, row_block=row_block)
    tokenizer = AutoTokenizer.from_pretrained(str(pair.tokenizer_dir), local_files_only=True)
    per_kind = max(1, -(-n_prompts // 3))
    texts = [t for kind in ("code", "prose", "json") for t in heldout_prompts(kind, per_kind, chars=200)][:n_prompts]
    prompts = [tokenizer(t)["input_ids"] for t in texts]
    k_values = [0] + sorted({min(k, pair.max_draft_len) for k in ks if k > 0})

    def one_pass(k: int) -> tuple[float, int, list[list[int]], Any]:
        tokens, outputs, stats = 0, [], None
        start = time.perf_counter()
        for ids in prompts:
            result = run(ids, pair.drafter, pair.verifier,
                         GenerationRequest(max_tokens=max_tokens, num_draft_tokens=k, end_id=pair.end_id))
            tokens += len(result.tokens)
            outputs.append(result.tokens)
            stats = result.stats if stats is None else stats.merge(result.stats)
        return time.perf_counter() - start, tokens, outputs, stats

    one_pass(k_values[-1])  # warm-up: first-call allocations, caches of the allocator
    rows, baseline = [], None
    for k in k_values:
        seconds, tokens, outputs, stats = one_pass(k)
        baseline = outputs if k == 0 else baseline
        rows.append({
            "num_draft_tokens": k,
            "tokens_per_s": tokens / seconds if seconds > 0 else 0.0,
            "seconds": seconds,
            "output_tokens": tokens,
            "acceptance_rate": stats.acceptance_rate,
            "mean_accepted_len": stats.mean_accepted_len,
            "same_tokens_as_k0": outputs == baseline,
        })
        if log:
            log(f"K = {k}: {rows[-1]['tokens_per_s']:.1f} tokens/s")
    best = max(rows[1:], key=lambda r: r["tokens_per_s"]) if len(rows) > 1 else rows[0]
    return {
        "engine_source": pair.target.kind,
        "row_block": pair.target_model.engine.model.row_block,
        "draft_engine_source": pair.draft.kind,
        "prompts": len(prompts),
        "max_tokens": max_tokens,
        "results": rows,
        "target_only_tokens_per_s": rows[0]["tokens_per_s"],
        "best_num_draft_tokens": best["num_draft_tokens"],
        "best_tokens_per_s": best["tokens_per_s"],
        "speedup": best["tokens_per_s"] / rows[0]["tokens_per_s"] if rows[0]["tokens_per_s"] else None,
        "greedy_equal": all(r["same_tokens_as_k0"] for r in rows),
    }


def format_report(report: dict[str, Any]) -> str:
    lines = [f"weights: target {report['engine_source']}, draft {report['draft_engine_source']}; "
             f"{report['prompts']} prompts x {report['max_tokens']} tokens, greedy; row block {report['row_block']}"]
    lines.append(f"{'K':>3}  {'tokens/s':>9}  {'acceptance':>10}  {'mean len':>8}  same as K=0")
    for r in report["results"]:
        lines.append(f"{r['num_draft_tokens']:>3}  {r['tokens_per_s']:>9.1f}  {r['acceptance_rate']:>10.2f}  "
                     f"{r['mean_accepted_len']:>8.2f}  {'yes' if r['same_tokens_as_k0'] else 'NO'}")
    lines.append(f"target only: {report['target_only_tokens_per_s']:.1f} tokens/s; best K = "
                 f"{report['best_num_draft_tokens']}: {report['best_tokens_per_s']:.1f} tokens/s; "
                 f"ratio {report['speedup']:.2f}x")
    return "\n".join(lines)


@click.command("speedcheck")
@click.option("-c", "--config", "spec_path", default="specbuild.toml", show_default=True,
              type=click.Path(dir_okay=False), help="The spec file of the pair.")
@click.option("--ks", default="1,2,4,8", show_default=True, help="Draft lengths to try (comma list).")
@click.option("--prompts", "n_prompts", type=click.IntRange(min=1), default=6, show_default=True)
@click.option("--max-tokens", type=click.IntRange(min=1), default=64, show_default=True)
@click.option("--device", default="auto", show_default=True, help="cpu, cuda, or auto.")
@click.option("--threads", type=click.IntRange(min=1), default=None, help="CPU threads (default: 1 for small models).")
@click.option("--row-block", type=click.IntRange(min=1), default=None,
              help="Rows per matmul block (default: the device's; see docs/runtime.md).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
def main(spec_path, ks, n_prompts, max_tokens, device, threads, row_block, as_json):
    """Tokens/s of the reference runtime with K = 0 and with speculation, and the ratio."""
    from specbuild.cli.common import emit_json, get_spec, log
    from specbuild.errors import SpecbuildError

    try:
        k_list = [int(k) for k in ks.split(",") if k.strip()]
    except ValueError:
        raise click.UsageError(f"--ks {ks!r}: give a comma-separated list of integers, e.g. 1,2,4,8.") from None
    if not k_list or min(k_list) < 0:
        raise click.UsageError(f"--ks {ks!r}: give draft lengths >= 0, e.g. 1,2,4,8.")
    try:
        report = speedcheck(get_spec(spec_path), k_list, n_prompts, max_tokens,
                            device=None if device == "auto" else device, threads=threads, row_block=row_block, log=log)
    except SpecbuildError as err:
        raise click.ClickException(str(err)) from None
    if as_json:
        emit_json(report)
    else:
        click.echo(format_report(report))


if __name__ == "__main__":
    sys.exit(main())
