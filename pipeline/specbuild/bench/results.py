"""Reproduce the README's benchmark figures: median of N runs per workload, written to a folder.

    python -m specbuild.bench.results -c .demo/specbuild.toml --out docs/bench/runs --runs 3 [--url HOST:PORT]

For each built-in workload (code, prose, json): N in-process runs with the Hugging Face peer
(`bench --local --vs-hf`), each a full interleaved K sweep; with --url also N runs through Triton.
Writes into that folder every run's JSON document, results-<mode>.json (the medians), results-<mode>.md (the table) and
the plots of each workload's median run (by speedup).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from specbuild.bench import plots
from specbuild.bench.run import run_bench
from specbuild.bench.runner import Settings
from specbuild.config import load_spec

HEADLINE = ("speedup", "alpha", "acceptance_rate", "cost_ratio", "bound", "efficiency", "explained_speedup")


def _median(values: list[float | None]) -> float | None:
    values = [v for v in values if v is not None]
    return round(statistics.median(values), 4) if values else None


def _cell(doc: dict[str, Any], k: int) -> dict[str, Any] | None:
    return next((r for r in doc["runs"] if r["concurrency"] == 1 and r["num_draft_tokens"] == k), None)


def summarize_runs(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over runs: per K, and at the K whose median speedup is highest."""
    ks = sorted({r["num_draft_tokens"] for d in docs for r in d["runs"] if r["concurrency"] == 1})
    per_k = []
    for k in ks:
        cells = [c for c in (_cell(d, k) for d in docs) if c]
        row = {"num_draft_tokens": k, "tokens_per_s": _median([c["tokens_per_s"] for c in cells])}
        row.update({key: _median([c.get(key) for c in cells]) for key in (*HEADLINE, "verify_step_ratio")})
        hf = [next((h for h in (d.get("hf") or {}).get("runs", []) if h["num_draft_tokens"] == k), None) for d in docs]
        if any(hf):
            row["hf_tokens_per_s"] = _median([h["tokens_per_s"] for h in hf if h])
            row["hf_speedup"] = _median([h["speedup"] for h in hf if h])
            row["ours_over_hf"] = _median([h["ours_over_hf"] for h in hf if h])
        serving = [
            next((s for s in (d.get("serving_overhead") or {}).get("runs", []) if s["num_draft_tokens"] == k), None)
            for d in docs
        ]
        if any(serving):
            row["triton_over_local"] = _median([s["triton_over_local"] for s in serving if s])
        per_k.append(row)
    spec_rows = [r for r in per_k if r["num_draft_tokens"] > 0 and r["speedup"] is not None]
    best = max(spec_rows, key=lambda r: r["speedup"]) if spec_rows else None
    return {
        "runs": len(docs),
        "best_num_draft_tokens": best["num_draft_tokens"] if best else None,
        "best": best,
        "per_k": per_k,
    }


def _fmt(v: Any, spec: str = ".2f") -> str:
    return "-" if v is None else format(v, spec)


def markdown(summary: dict[str, dict[str, Any]], machine: dict[str, Any], command: str, mode: str) -> str:
    lines = [
        f"# Benchmark results ({mode})",
        "",
        f"Machine: {machine.get('cpu')}, {machine.get('cpu_count')} cores, torch threads "
        f"{machine.get('torch_threads')}, {machine.get('platform')}.",
        "",
        f"Reproduce: `{command}`",
        "",
        "Median of the runs below, per workload, at the best K (highest median speedup):",
        "",
        "| workload | best K | tok/s K=0 | tok/s best K | speedup | alpha | c | bound | efficiency | "
        "verify step / plain step | HF assisted speedup | ours over HF | Triton / local |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for workload, s in summary.items():
        b = s["best"] or {}
        base = next((r for r in s["per_k"] if r["num_draft_tokens"] == 0), {})
        lines.append(
            f"| {workload} | {s['best_num_draft_tokens']} | {_fmt(base.get('tokens_per_s'), '.1f')} | "
            f"{_fmt(b.get('tokens_per_s'), '.1f')} | {_fmt(b.get('speedup'))} | {_fmt(b.get('alpha'))} | "
            f"{_fmt(b.get('cost_ratio'), '.3f')} | {_fmt(b.get('bound'))} | {_fmt(b.get('efficiency'))} | "
            f"{_fmt(b.get('verify_step_ratio'))} | {_fmt(b.get('hf_speedup'))} | "
            f"{_fmt(b.get('ours_over_hf'))} | {_fmt(b.get('triton_over_local'))} |"
        )
    lines += ["", "Every K (medians):", ""]
    for workload, s in summary.items():
        lines += [
            f"**{workload}**",
            "",
            "| K | tok/s | speedup | alpha | c | bound | efficiency | explained | "
            "verify/plain | HF tok/s | ours over HF |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in s["per_k"]:
            lines.append(
                f"| {r['num_draft_tokens']} | {_fmt(r['tokens_per_s'], '.1f')} | {_fmt(r['speedup'])} | "
                f"{_fmt(r['alpha'])} | {_fmt(r['cost_ratio'], '.3f')} | {_fmt(r['bound'])} | "
                f"{_fmt(r['efficiency'])} | {_fmt(r['explained_speedup'])} | {_fmt(r['verify_step_ratio'])} | "
                f"{_fmt(r.get('hf_tokens_per_s'), '.1f')} | {_fmt(r.get('ours_over_hf'))} |"
            )
        lines.append("")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-c", "--config", default="specbuild.toml")
    parser.add_argument("--out", default="docs/bench/runs")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--workloads", default="code,prose,json")
    parser.add_argument("--num-draft-tokens", default="0,1,2,4")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--row-block", type=int, default=None, help="what-if: the runtime's matmul row block")
    parser.add_argument("--tag", default="", help="suffix for the output file names")
    parser.add_argument("--url", default=None)
    parser.add_argument("--protocol", default="grpc")
    args = parser.parse_args(argv)
    spec = load_spec(args.config)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    ks = tuple(int(k) for k in args.num_draft_tokens.split(","))
    settings = Settings(num_draft_tokens=ks, max_tokens=args.max_tokens, requests=args.requests)
    mode = ("triton" if args.url else "local") + (f"-{args.tag}" if args.tag else "")
    summary: dict[str, dict[str, Any]] = {}
    docs_by_workload: dict[str, list[dict[str, Any]]] = {}
    for workload in args.workloads.split(","):
        docs = []
        for i in range(args.runs):
            print(f"{mode} {workload} run {i + 1}/{args.runs}", file=sys.stderr, flush=True)
            doc = run_bench(
                spec,
                settings,
                workload,
                url=args.url,
                protocol=args.protocol,
                vs_hf=not args.url,
                threads=args.threads,
                row_block=args.row_block,
            )
            (out / f"{mode}-{workload}-{i + 1}.json").write_text(json.dumps(doc, indent=2) + "\n")
            docs.append(doc)
        docs_by_workload[workload] = docs
        summary[workload] = summarize_runs(docs)
    first = next(iter(docs_by_workload.values()))
    command = (
        f"python -m specbuild.bench.results -c {args.config} --out {args.out} --runs {args.runs} "
        f"--num-draft-tokens {args.num_draft_tokens} --max-tokens {args.max_tokens} --requests {args.requests} "
        f"--threads {args.threads}"
        + (f" --url {args.url} --protocol {args.protocol}" if args.url else "")
        + (f" --row-block {args.row_block}" if args.row_block else "")
        + (f" --tag {args.tag}" if args.tag else "")
    )
    (out / f"results-{mode}.json").write_text(
        json.dumps({"machine": first[0]["machine"], "command": command, "workloads": summary}, indent=2) + "\n"
    )
    (out / f"results-{mode}.md").write_text(markdown(summary, first[0]["machine"], command, mode))
    written = []
    for workload, docs in docs_by_workload.items():
        median_doc = sorted(docs, key=lambda d: d["speedup"] or 0.0)[len(docs) // 2]
        written += plots.write_plots(median_doc, out / f"{mode}-{workload}")
    written.append(plots.write_workload_plot(summary, out / f"{mode}-acceptance_by_workload.png"))
    print("\n".join(str(p) for p in [out / f"results-{mode}.md", *written]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
