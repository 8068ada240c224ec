"""A quick in-process speed check: tokens/s with speculation off (K = 0) and on (each K), in one run.

    python -m specbuild.runtime.speedcheck -c specbuild.toml [--ks 1,2,4,8] [--prompts 6] [--max-tokens 64]

Greedy decoding on the built-in held-out prompts (code, prose, JSON), the same prompts for every
K, interleaved (each prompt runs every K, in a rotating order) so that a change in machine load
does not favour one K, after one warm-up run. Prints tokens/s for K = 0 and every K, the best K and its ratio to
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


PLAIN = "plain"  # target-only decoding on 1-row matmuls: the fastest target-only, without batch invariance


def speedcheck(spec: Spec, ks: list[int], n_prompts: int = 6, max_tokens: int = 64, device: str | None = None,
               threads: int | None = None, row_block: int | None = None, pair: Any = None, log=None) -> dict[str, Any]:
    """Measure greedy tokens/s for K = 0 and each K in ks (clamped to max_draft_len); return a report dict.

    Besides K = 0 through the same engine, target-only decoding also runs on a second copy of the target
    with 1-row matmuls ("plain"): the engine's fixed row blocks (the price of exact greedy equality) can
    slow single-token steps, and the honest speedup compares against the faster of the two.
    """
    from transformers import AutoTokenizer

    from specbuild.example.corpus import heldout_prompts
    from specbuild.runtime.loading import load_contract_model, load_pair
    from specbuild.speculative.contract_client import ContractVerifier
    from specbuild.speculative.loop import GenerationRequest, run

    pair = pair or load_pair(spec, device=device, threads=threads, row_block=row_block)
    plain_target = load_contract_model(pair.target, device, row_block=1, probe=False)  # exact by construction anyway
    verifiers = {PLAIN: ContractVerifier(plain_target, max_draft_len=pair.max_draft_len, end_id=pair.end_id)}
    tokenizer = AutoTokenizer.from_pretrained(str(pair.tokenizer_dir), local_files_only=True)
    per_kind = max(1, -(-n_prompts // 3))
    texts = [t for kind in ("code", "prose", "json") for t in heldout_prompts(kind, per_kind, chars=200)][:n_prompts]
    prompts = [tokenizer(t)["input_ids"] for t in texts]
    k_values = [0] + sorted({min(k, pair.max_draft_len) for k in ks if k > 0})
    runs: list[Any] = [PLAIN, *k_values]

    def one_run(ids: list[int], key: Any):
        k = 0 if key == PLAIN else key
        request = GenerationRequest(max_tokens=max_tokens, num_draft_tokens=k, end_id=pair.end_id)
        start = time.perf_counter()
        result = run(ids, pair.drafter, verifiers.get(key, pair.verifier), request)
        return time.perf_counter() - start, result

    for key in (PLAIN, k_values[-1]):  # warm-up: first-call allocations, rope tables
        one_run(prompts[0], key)
    seconds = dict.fromkeys(runs, 0.0)
    tokens = dict.fromkeys(runs, 0)
    stats: dict[Any, Any] = {}
    same = dict.fromkeys(runs, True)
    for i, ids in enumerate(prompts):
        # Interleaved, in a rotating order, so a change in machine load hits every K alike.
        order = runs[i % len(runs) :] + runs[: i % len(runs)]
        outputs = {}
        for key in order:
            took, result = one_run(ids, key)
            seconds[key] += took
            tokens[key] += len(result.tokens)
            outputs[key] = result.tokens
            stats[key] = result.stats if key not in stats else stats[key].merge(result.stats)
        for key in runs:
            same[key] = same[key] and outputs[key] == outputs[0]

    def rate(key: Any) -> float:
        return tokens[key] / seconds[key] if seconds[key] > 0 else 0.0

    rows = []
    for k in k_values:
        rows.append({
            "num_draft_tokens": k,
            "tokens_per_s": rate(k),
            "seconds": seconds[k],
            "output_tokens": tokens[k],
            "acceptance_rate": stats[k].acceptance_rate,
            "mean_accepted_len": stats[k].mean_accepted_len,
            "same_tokens_as_k0": same[k],
        })
        if log:
            log(f"K = {k}: {rows[-1]['tokens_per_s']:.1f} tokens/s")
    best = max(rows[1:], key=lambda r: r["tokens_per_s"]) if len(rows) > 1 else rows[0]
    fastest_target_only = max(rows[0]["tokens_per_s"], rate(PLAIN))
    return {
        "engine_source": pair.target.kind,
        "row_block": pair.target_model.engine.model.row_block,
        "exactness": pair.target_model.engine.model.exactness.as_dict(),
        "draft_engine_source": pair.draft.kind,
        "prompts": len(prompts),
        "max_tokens": max_tokens,
        "results": rows,
        "target_only_tokens_per_s": rows[0]["tokens_per_s"],
        "plain_target_only_tokens_per_s": rate(PLAIN),
        "plain_same_tokens_as_k0": same[PLAIN],
        "best_num_draft_tokens": best["num_draft_tokens"],
        "best_tokens_per_s": best["tokens_per_s"],
        "speedup": best["tokens_per_s"] / rows[0]["tokens_per_s"] if rows[0]["tokens_per_s"] else None,
        "speedup_vs_fastest_target_only": best["tokens_per_s"] / fastest_target_only if fastest_target_only else None,
        "greedy_equal": all(r["same_tokens_as_k0"] for r in rows),
    }


def format_report(report: dict[str, Any]) -> str:
    lines = [f"weights: target {report['engine_source']}, draft {report['draft_engine_source']}; "
             f"{report['prompts']} prompts x {report['max_tokens']} tokens, greedy; row block {report['row_block']}"]
    rejected = [t for t in report["exactness"]["tried"] if not t["passed"]]
    lines.append(f"row block {report['row_block']}: {report['exactness']['mode']}, "
                 f"{'exact' if report['exactness']['exact'] else 'NOT exact'} on this machine"
                 + "".join(f"; {t['row_block']} rows rejected ({', '.join(t['failures'][:2])}"
                           f"{' ...' if len(t['failures']) > 2 else ''})" for t in rejected))
    lines.append(f"{'K':>3}  {'tokens/s':>9}  {'acceptance':>10}  {'mean len':>8}  same as K=0")
    for r in report["results"]:
        lines.append(f"{r['num_draft_tokens']:>3}  {r['tokens_per_s']:>9.1f}  {r['acceptance_rate']:>10.2f}  "
                     f"{r['mean_accepted_len']:>8.2f}  {'yes' if r['same_tokens_as_k0'] else 'NO'}")
    lines.append(f"target only: {report['target_only_tokens_per_s']:.1f} tokens/s; best K = "
                 f"{report['best_num_draft_tokens']}: {report['best_tokens_per_s']:.1f} tokens/s; "
                 f"ratio {report['speedup']:.2f}x")
    lines.append(f"plain target-only decoding (1-row matmuls): {report['plain_target_only_tokens_per_s']:.1f} tokens/s; "
                 f"best K vs the faster target-only: {report['speedup_vs_fastest_target_only']:.2f}x")
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
              help="Rows per matmul block, refused unless it passes the exactness probe here "
                   "(default: the first candidate that passes; see docs/runtime.md).")
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
