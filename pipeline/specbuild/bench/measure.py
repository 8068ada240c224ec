"""`specbuild check --measure`: qualify the pair before any GPU build.

On sample prompts (the built-in code, prose and JSON sets, or `--prompts FILE.jsonl`), run the
in-process draft/verify loop greedily at K = 0 and at the largest K considered, then report:
- alpha per position: P(draft position i accepted | every position before it accepted), and the
  pooled per-token alpha (maximum likelihood under the closed form's i.i.d. model);
- c on this machine (draft seconds per drafted token / target seconds per plain step), and c for
  the spec's GPU from the models' weight bytes (`theory.gpu_estimate`);
- the predicted speedup for each K on both, and the recommended `max_draft_len` (best K on the GPU);
- the same for the overlapped (draft-ahead) schedule, whose early drafts hit with probability
  h(K) = alpha_0 ... alpha_K (the per-position alphas; alpha^(K+1) past the measured positions), and
  its gain over the sequential schedule (best K against best K). It assumes the drafter runs beside
  the target without slowing it: its own core here (`cores` says how many this process has), its own
  GPU or spare GPU capacity in a deployment.
The returned dict is the "measure" section of the check report. The measurement itself is the
benchmark's (`specbuild.bench`: its in-process transport, statistics and closed form).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from specbuild.bench import theory, workloads
from specbuild.bench.report import DEGENERATE_SHARE, rounded
from specbuild.bench.runner import Settings
from specbuild.bench.stats import RequestResult, summarize
from specbuild.config import Spec
from specbuild.speculative.adaptive import best_k
from specbuild.speculative.draft_len import resolve_k
from specbuild.speculative.overlap import available_cores

MAX_K = 8  # predictions cover K = 0..max(MAX_K, spec max_draft_len)
PROMPTS_PER_KIND = 2
MAX_TOKENS = 32


def _prompts(prompts_file: Path | None) -> list[tuple[str, workloads.Prompt]]:
    if prompts_file is not None:
        loaded = workloads.from_jsonl(Path(prompts_file))
        return [(loaded.name, p) for p in loaded.prompts]
    return [(kind, p) for kind in workloads.BUILTIN for p in workloads.builtin(kind, PROMPTS_PER_KIND).prompts]


def measure_with(
    transport: Any,
    prompts: Sequence[tuple[str, workloads.Prompt]],
    spec: Spec,
    max_tokens: int = MAX_TOKENS,
    gpu: dict[str, Any] | None = None,
    progress: Callable[[], None] = lambda: None,
) -> dict[str, Any]:
    """The measurement on a local transport (see `bench.local_transport.LocalTransport`)."""
    k_max = max(MAX_K, spec.speculative.max_draft_len)
    limit = transport.max_draft_len
    k_run = resolve_k(k_max, limit).k if limit is not None else k_max
    settings = Settings(num_draft_tokens=(k_run,), max_tokens=max_tokens, requests=len(prompts), warmup=False)
    transport.request(prompts[0][1], k_run, min(4, max_tokens), settings)  # warm-up, not counted
    plain: list[RequestResult] = []
    plain_by_kind: dict[str, list[RequestResult]] = {}
    spec_runs: dict[str, list[RequestResult]] = {}
    for kind, prompt in prompts:
        for k in (0, k_run):
            result = transport.request(prompt, k, prompt.max_tokens or max_tokens, settings)
            if k == 0:
                plain.append(result)
                plain_by_kind.setdefault(kind, []).append(result)
            else:
                spec_runs.setdefault(kind, []).append(result)
            progress()
    base = summarize(plain, sum(r.seconds for r in plain))
    every = [r for rs in spec_runs.values() for r in rs]
    pooled = summarize(every, sum(r.seconds for r in every))
    c_here = theory.cost_ratio(pooled.draft_seconds_per_token, base.target_seconds_per_step)
    alpha = pooled.alpha or 0.0
    c_gpu = gpu.get("cost_ratio") if gpu else None
    ks = range(0, k_max + 1)
    rows = []
    for k in ks:
        rows.append(
            {
                "num_draft_tokens": k,
                "expected_tokens_per_step": round(theory.expected_tokens(alpha, k), 4) if k else 1.0,
                "this_machine": round(theory.bound(alpha, k, c_here), 4) if c_here is not None else None,
                "gpu": round(theory.bound(alpha, k, c_gpu), 4) if c_gpu is not None else None,
            }
        )
    best_here = best_k(alpha, c_here, k_max)[0] if c_here is not None else None
    best_gpu = best_k(alpha, c_gpu, k_max)[0] if c_gpu is not None else None
    recommended = best_gpu if best_gpu is not None else best_here
    hits = [predicted_hit_rate(pooled.per_position_alpha, alpha, k) for k in ks]
    for row, h in zip(rows, hits):
        k = row["num_draft_tokens"]
        row["hit_rate"] = round(h, 4) if k else None
        row["overlapped_this_machine"] = (
            round(theory.overlap_bound(alpha, k, c_here, h), 4) if c_here is not None else None
        )
        row["overlapped_gpu"] = round(theory.overlap_bound(alpha, k, c_gpu, h), 4) if c_gpu is not None else None
    overlap = {}
    for where, c, best in (("this_machine", c_here, best_here), ("gpu", c_gpu, best_gpu)):
        if c is None:
            overlap[where] = {"best_num_draft_tokens": None, "speedup": None, "over_sequential": None}
            continue
        k, speedup = best_k(alpha, c, k_max, speedup=lambda a, n, cost: theory.overlap_bound(a, n, cost, hits[n]))
        sequential = rows[best][where] if best else 1.0
        overlap[where] = {
            "best_num_draft_tokens": k,
            "speedup": round(speedup, 4),
            "over_sequential": round(speedup / sequential, 4),
        }
    return {
        "prompts": {"source": str(prompts_file_name(prompts)), "count": len(prompts), "max_tokens": max_tokens},
        "num_draft_tokens": k_run,
        "alpha": rounded(pooled.alpha),
        "acceptance_rate": rounded(pooled.acceptance_rate),
        "mean_accepted_len": rounded(pooled.mean_accepted_len),
        "per_position_alpha": [rounded(a) for a in pooled.per_position_alpha],
        "per_position_acceptance": [rounded(a) for a in pooled.per_position_acceptance],
        "alpha_by_workload": {kind: rounded(summarize(rs, 1.0).alpha) for kind, rs in spec_runs.items()},
        "step_seconds": {
            "target": rounded(base.target_seconds_per_step, 7),
            "draft": rounded(pooled.draft_seconds_per_token, 7),
        },
        "cost_ratio": {"this_machine": rounded(c_here), "gpu": rounded(c_gpu)},
        "gpu_estimate": gpu,
        "predicted_speedup": rows,
        "best_num_draft_tokens": {"this_machine": best_here, "gpu": best_gpu},
        "overlap": {**overlap, "cores": available_cores()},
        "recommended_max_draft_len": recommended,
        "speculation_pays": bool(recommended),
        "degenerate_workloads": sorted(
            kind
            for kind, rs in plain_by_kind.items()
            if (summarize(rs, 1.0).top_token_share or 0.0) >= DEGENERATE_SHARE
        ),
    }


def predicted_hit_rate(per_position_alpha: Sequence[float | None], alpha: float, k: int) -> float:
    """P(early draft used) at K = k: positions 0..k all accepted (the guess is position k's draft token, for
    greedy decoding): the measured per-position alphas while they last, the pooled alpha after."""
    h = 1.0
    for i in range(k + 1):
        a = per_position_alpha[i] if i < len(per_position_alpha) else None
        h *= a if a is not None else alpha
    return h


def prompts_file_name(prompts: Sequence[tuple[str, workloads.Prompt]]) -> str:
    kinds = sorted({kind for kind, _ in prompts})
    return ", ".join(kinds) if set(kinds) <= set(workloads.BUILTIN) else kinds[0]


def gpu_cost(spec: Spec) -> dict[str, Any] | None:
    """c for the spec's GPU from the checkpoints' sizes; None when a checkpoint cannot be read."""
    from specbuild.errors import SpecbuildError

    if spec.draft is None:
        return None
    try:
        return theory.gpu_estimate(
            spec,
            theory.ModelSize.of_checkpoint(spec.target.checkpoint, "target"),
            theory.ModelSize.of_checkpoint(spec.draft.checkpoint, "draft"),
        )
    except SpecbuildError:
        return None


def measure(
    spec: Spec,
    prompts_file: Path | None = None,
    max_tokens: int = MAX_TOKENS,
    log: Callable[[str], None] = lambda m: None,
    progress: bool = False,
    threads: int | None = None,
) -> dict[str, Any]:
    """The "measure" section of `specbuild check --measure` for `spec` (loads the pair in-process)."""
    from specbuild.bench.local_transport import from_spec

    if spec.draft is None:
        from specbuild.errors import SpecError

        raise SpecError(
            "check --measure measures the draft model's acceptance and cost, and the spec has no [draft]. Measure "
            "prompt lookup on your prompts with `specbuild bench --local --prompts FILE`."
        )
    prompts = _prompts(prompts_file)
    log(f"check --measure: loading the pair, {len(prompts)} prompts, {max_tokens} tokens each")
    transport = from_spec(spec, log=log, threads=threads, overlap=False)  # measures alpha and c: sequential
    from specbuild.progress import Progress

    bar = Progress(
        total=2 * len(prompts),
        desc="check --measure",
        unit="requests",
        mode=None if progress else "off",
        stream=sys.stderr,
    )
    try:
        return measure_with(transport, prompts, spec, max_tokens, gpu_cost(spec), progress=lambda: bar.update(1))
    finally:
        bar.close()
        transport.close()


def summary_lines(section: dict[str, Any]) -> list[str]:
    """The human lines of the "measure" section (for `specbuild check --measure`)."""

    def f(value: Any, spec: str = ".2f") -> str:
        return "-" if value is None else format(value, spec)

    c = section["cost_ratio"]
    positions = ", ".join(f(a) for a in section["per_position_alpha"])
    by_kind = ", ".join(f"{kind} {f(a)}" for kind, a in section["alpha_by_workload"].items())
    rows = section["predicted_speedup"]
    here = " ".join(f"K{r['num_draft_tokens']}={f(r['this_machine'])}" for r in rows[1:])
    gpu = " ".join(f"K{r['num_draft_tokens']}={f(r['gpu'])}" for r in rows[1:])
    best = section["best_num_draft_tokens"]
    lines = [
        f"alpha {f(section['alpha'])} at K = {section['num_draft_tokens']} on {section['prompts']['count']} prompts "
        f"({section['prompts']['source']}); by position {positions}; by workload {by_kind}",
        f"c {f(c['this_machine'], '.3f')} here (measured), {f(c['gpu'], '.3f')} on {(section.get('gpu_estimate') or {}).get('gpu', '?')} "
        "(estimated from weight bytes)",
        f"speedup here   {here} (best K {best['this_machine']})",
        f"speedup on GPU {gpu} (best K {best['gpu']})",
    ]
    overlap = section.get("overlap") or {}
    for where, label in (("this_machine", "here  "), ("gpu", "on GPU")):
        o = overlap.get(where) or {}
        key = "overlapped_this_machine" if where == "this_machine" else "overlapped_gpu"
        values = " ".join(f"K{r['num_draft_tokens']}={f(r.get(key))}" for r in rows[1:])
        lines.append(
            f"overlapped {label} {values} (best K {o.get('best_num_draft_tokens')}, "
            f"{f(o.get('over_sequential'))}x the sequential best)"
        )
    if overlap.get("cores", 2) < 2:
        lines.append(f"note: {overlap['cores']} core here: the overlapped schedule needs a second one to pay")
    if section.get("degenerate_workloads"):
        lines.append(
            f"warning: the target's output repeats one token on {', '.join(section['degenerate_workloads'])} "
            "prompts, so their acceptance is trivially high: judge the pair on the others"
        )
    recommended = section["recommended_max_draft_len"]
    lines.append(
        f"recommended max_draft_len = {recommended}"
        if recommended
        else "speculation is not predicted to pay for this pair (recommended K = 0)"
    )
    return lines
