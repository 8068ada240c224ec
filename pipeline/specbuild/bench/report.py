"""The benchmark report: one JSON document (keys in the project's vocabulary) and a terminal table.

Per (K, concurrency) cell: speedup = tokens_per_s(K) / tokens_per_s(K = 0) at the same concurrency,
c = draft seconds per drafted token / target seconds per step at K = 0 (plain decoding),
bound = the closed form from this cell's alpha and c, efficiency = speedup / bound.
verify_step_ratio = target seconds per verify step at K / per plain step: the closed form assumes 1.
explained_speedup = mean_accepted_len / (K c + verify_step_ratio): the speedup the measured tokens per
step and measured step costs account for. Where efficiency falls short: speedup ~ explained_speedup
means the verify cost (and E differing from the i.i.d. prediction) is the gap; speedup well below it
means time outside the drafter and verifier (loop, sampling, transport; time_split "other").
Overlapped cells (the draft-ahead schedule ran: early_drafts > 0) are measured against their own bound,
overlap_bound = E / (max(1, (K+1) c) + (1 - h) K c) with the measured early-draft hit rate h
(docs/speculative.md); efficiency and explained_speedup then use it. Sequential cells carry
overlap_bound too, with h = alpha^(K+1): what drafting ahead would give.
"""

from __future__ import annotations

import math
import os
import platform
from collections.abc import Sequence
from typing import Any

from specbuild.bench import theory
from specbuild.bench.stats import RunSummary


def rounded(value: float | None, digits: int = 4) -> float | None:
    """A figure for a JSON document: rounded to `digits`; None for none, NaN or infinity (JSON has neither)."""
    if value is None or (isinstance(value, float) and (math.isnan(value) or math.isinf(value))):
        return None
    return round(value, digits)


def machine() -> dict[str, Any]:
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
    }
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    info["cpu"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        import torch

        info["torch_threads"] = torch.get_num_threads()
        info["torch"] = torch.__version__
    except ImportError:
        pass
    return info


def cell(summary: RunSummary, baseline: RunSummary | None, target_step: float | None) -> dict[str, Any]:
    """One (K, concurrency) cell with its speedup and theory, as a JSON-ready dict."""
    k = summary.num_draft_tokens
    speedup = summary.tokens_per_s / baseline.tokens_per_s if baseline and baseline.tokens_per_s else None
    # concurrent streams overlap their draft/verify timings: c, the bound and efficiency are per-stream figures
    single = summary.concurrency == 1
    c = theory.cost_ratio(summary.draft_seconds_per_token, target_step) if single else None
    known = k and summary.alpha is not None and c is not None
    bound = theory.bound(summary.alpha, k, c) if known else None
    overlapped = summary.early_drafts > 0
    hit = summary.early_draft_hit_rate if overlapped else None
    overlap_bound = theory.overlap_bound(summary.alpha, k, c, hit) if known else None
    verify_ratio = (
        summary.target_seconds_per_step / target_step
        if single and summary.target_seconds_per_step and target_step
        else None
    )
    explained = None
    if k and c is not None and verify_ratio and summary.mean_accepted_len:
        step = max(verify_ratio, (k + 1) * c) + (1 - (hit or 0.0)) * k * c if overlapped else k * c + verify_ratio
        explained = summary.mean_accepted_len / step
    against = overlap_bound if overlapped else bound
    return {
        "num_draft_tokens": k,
        "concurrency": summary.concurrency,
        "requests": summary.requests,
        "output_tokens": summary.output_tokens,
        "wall_seconds": rounded(summary.wall_seconds),
        "tokens_per_s": rounded(summary.tokens_per_s, 3),
        "speedup": rounded(speedup),
        "request_tokens_per_s": summary.request_tokens_per_s.to_dict(3),
        "ttft_seconds": summary.ttft_seconds.to_dict(),
        "tpot_seconds": summary.tpot_seconds.to_dict(),
        "drafted": summary.drafted,
        "accepted": summary.accepted,
        "steps": summary.steps,
        # draft tokens per verify step: the K actually drafted (below the K asked where K adapts, or drafts end early)
        "mean_k": rounded(summary.drafted / summary.steps) if summary.steps else None,
        "acceptance_rate": rounded(summary.acceptance_rate),
        "alpha": rounded(summary.alpha),
        "mean_accepted_len": rounded(summary.mean_accepted_len),
        "per_position_acceptance": [rounded(a) for a in summary.per_position_acceptance],
        "per_position_alpha": [rounded(a) for a in summary.per_position_alpha],
        "draft_seconds_per_token": rounded(summary.draft_seconds_per_token, 7),
        "target_seconds_per_step": rounded(summary.target_seconds_per_step, 7),
        "verify_step_ratio": rounded(verify_ratio),
        "time_split": _time_split(summary),
        "cost_ratio": rounded(c),
        "bound": rounded(bound),
        "schedule": "overlapped" if overlapped else "sequential",
        "early_drafts": summary.early_drafts,
        "early_draft_hits": summary.early_draft_hits,
        "early_draft_hit_rate": rounded(hit),
        "hidden_seconds": rounded(summary.hidden_seconds, 6),
        "overlap_bound": rounded(overlap_bound),
        "efficiency": rounded(speedup / against) if speedup and against else None,
        "explained_speedup": rounded(explained),
        "top_token_share": rounded(summary.top_token_share),
    }


def _time_split(summary: RunSummary) -> dict[str, float | None]:
    """Where the request time went: drafter (the part the target waited for), verifier, everything else (loop,
    sampling, transport), and drafting hidden beside the verifier (overlapped schedule; not in the sum)."""
    total = summary.wall_seconds
    if total <= 0 or summary.concurrency != 1 or not (summary.draft_seconds or summary.target_seconds):
        return {"draft": None, "target": None, "other": None, "hidden": None}
    draft = max(summary.draft_seconds - summary.hidden_seconds, 0.0)
    other = max(total - draft - summary.target_seconds, 0.0)
    return {
        "draft": rounded(draft / total),
        "target": rounded(summary.target_seconds / total),
        "other": rounded(other / total),
        "hidden": rounded(summary.hidden_seconds / total),
    }


def cells(summaries: Sequence[RunSummary]) -> list[dict[str, Any]]:
    baselines = {s.concurrency: s for s in summaries if s.num_draft_tokens == 0}
    base1 = baselines.get(1)
    target_step = base1.target_seconds_per_step if base1 else None
    return [cell(s, baselines.get(s.concurrency), target_step) for s in summaries]


def best(rows: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The concurrency-1 cell with K > 0 and the highest measured speedup."""
    candidates = [r for r in rows if r["concurrency"] == 1 and r["num_draft_tokens"] > 0 and r["speedup"]]
    return max(candidates, key=lambda r: r["speedup"]) if candidates else None


def document(
    mode: str,
    spec_name: str,
    workload: str,
    settings: dict[str, Any],
    rows: list[dict[str, Any]],
    notes: Sequence[str] = (),
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    top = best(rows)
    doc: dict[str, Any] = {
        "mode": mode,
        "spec": spec_name,
        "workload": workload,
        "machine": machine(),
        "settings": settings,
        "best_num_draft_tokens": top["num_draft_tokens"] if top else None,
    }
    for key in (
        "speedup",
        "alpha",
        "acceptance_rate",
        "mean_accepted_len",
        "cost_ratio",
        "bound",
        "schedule",
        "overlap_bound",
        "early_draft_hit_rate",
        "efficiency",
    ):
        doc[key] = top[key] if top else None
    doc["tokens_per_s"] = top["tokens_per_s"] if top else None
    base = next((r for r in rows if r["num_draft_tokens"] == 0 and r["concurrency"] == 1), None)
    doc["baseline_tokens_per_s"] = base["tokens_per_s"] if base else None
    doc["runs"] = rows
    doc["concurrency"] = _concurrency_table(rows)
    doc.update(extra or {})
    doc["notes"] = list(notes) + degenerate_notes(rows)
    return doc


DEGENERATE_SHARE = 0.5


def degenerate_notes(rows: Sequence[dict[str, Any]]) -> list[str]:
    """Warn when the target's output is mostly one repeated token: acceptance is then trivially high."""
    base = next((r for r in rows if r["num_draft_tokens"] == 0 and r["concurrency"] == 1), None)
    share = base.get("top_token_share") if base else None
    if share is None or share < DEGENERATE_SHARE:
        return []
    return [
        f"the output is degenerate: its most frequent token is {share:.0%} of the text (median request). "
        "Acceptance and speedup on repeated tokens say little about real text: use a better-trained pair "
        "or other prompts."
    ]


def _concurrency_table(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Throughput vs concurrency, speculation off and at each K, and where speculation stops paying."""
    levels = sorted({r["concurrency"] for r in rows})
    table = []
    for level in levels:
        at = [r for r in rows if r["concurrency"] == level]
        base = next((r for r in at if r["num_draft_tokens"] == 0), None)
        spec = [r for r in at if r["num_draft_tokens"] > 0 and r["speedup"] is not None]
        top = max(spec, key=lambda r: r["speedup"]) if spec else None
        table.append(
            {
                "concurrency": level,
                "baseline_tokens_per_s": base["tokens_per_s"] if base else None,
                "best_num_draft_tokens": top["num_draft_tokens"] if top else None,
                "mean_k": top["mean_k"] if top else None,
                "tokens_per_s": top["tokens_per_s"] if top else None,
                "speedup": top["speedup"] if top else None,
                "speculation_pays": bool(top and top["speedup"] > 1.0),
            }
        )
    return table


def _fmt(value: Any, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def _ms(seconds: float | None) -> str:
    return _fmt(None if seconds is None else 1000 * seconds, ".2f")


# (header, unit, width): the table's columns; times are printed in milliseconds.
COLUMNS = (
    ("conc", "", 4),
    ("K", "", 3),
    ("tok/s", "tok/s", 8),
    ("speedup", "x", 7),
    ("alpha", "", 6),
    ("acc.len", "tokens", 7),
    ("c", "ratio", 6),
    ("bound", "x", 6),
    ("eff.", "", 5),
    ("hits", "", 5),
    ("ttft p50", "ms", 9),
    ("ttft max", "ms", 9),
    ("tpot p50", "ms", 9),
    ("tpot p99", "ms", 9),
)


def own_bound(row: dict[str, Any]) -> float | None:
    """The bound of the schedule the cell ran (its efficiency's denominator): the overlapped one where it drafted
    ahead. A best-K summary, which copies its cell's keys, reads it the same way."""
    return row["overlap_bound"] if row["schedule"] == "overlapped" else row["bound"]


def _quartiles(spread: dict[str, float] | None) -> str:
    return f" (per prompt {_fmt(spread['p25'])}-{_fmt(spread['p75'])})" if spread else ""


OVERRUN_SHARE = 0.1  # above this share of a role's calls overrunning, a timed run's figures are this machine's


def table(doc: dict[str, Any]) -> str:
    """A fixed-width terminal table of every cell (with a units row), then the headline and notes."""
    head = " ".join(f"{name:>{width}}" for name, _, width in COLUMNS)
    units = " ".join(f"{unit:>{width}}" for _, unit, width in COLUMNS)
    lines = [
        f"specbuild bench: {doc['spec']} ({doc['mode']}, workload {doc['workload']})",
        head,
        units,
        "-" * len(head),
    ]
    for r in doc["runs"]:
        cells = (
            r["concurrency"],
            r["num_draft_tokens"],
            _fmt(r["tokens_per_s"], ".1f"),
            _fmt(r["speedup"]),
            _fmt(r["alpha"]),
            _fmt(r["mean_accepted_len"]),
            _fmt(r["cost_ratio"], ".3f"),
            _fmt(own_bound(r)),
            _fmt(r["efficiency"]),
            _fmt(r["early_draft_hit_rate"]),
            _ms(r["ttft_seconds"]["median"]),
            _ms(r["ttft_seconds"]["max"]),
            _ms(r["tpot_seconds"]["median"]),
            _ms(r["tpot_seconds"]["p99"]),
        )
        lines.append(" ".join(f"{cell:>{width}}" for cell, (_, _, width) in zip(cells, COLUMNS)))
    if doc.get("best_num_draft_tokens") is not None:
        lines.append(
            f"best K = {doc['best_num_draft_tokens']}: speedup {_fmt(doc['speedup'])}x, alpha "
            f"{_fmt(doc['alpha'])}, c {_fmt(doc['cost_ratio'], '.3f')}, bound {_fmt(own_bound(doc))}x, "
            f"efficiency {_fmt(doc['efficiency'])}"
        )
    hf = doc.get("hf")
    if hf:
        lines.append(
            f"Hugging Face assisted generation at K = {hf['num_draft_tokens']}: {_fmt(hf['tokens_per_s'], '.1f')} "
            f"tok/s (its speedup {_fmt(hf['speedup'])}x); ours over theirs: {_fmt(hf['ours_over_hf'])}x"
        )
    plain = doc.get("plain")
    if plain:
        lines.append(
            f"target only on 1-row matmuls: {_fmt(plain['tokens_per_s'], '.1f')} tok/s; best K vs the faster "
            f"target-only: {_fmt(plain['speedup_vs_fastest_target_only'])}x"
        )
    if doc.get("greedy_equal") is not None:
        lines.append("greedy output at every K equals K = 0: " + ("yes" if doc["greedy_equal"] else "NO"))
    overlap = doc.get("overlap")
    if overlap and overlap.get("num_draft_tokens") is not None:
        lines.append(
            f"overlapped (draft-ahead) at K = {overlap['num_draft_tokens']}: "
            f"{_fmt(overlap['tokens_per_s'], '.1f')} tok/s, {_fmt(overlap['overlapped_over_sequential'])}x "
            f"sequential at the same K ({_fmt(overlap['best_over_best'])}x best against best); early drafts "
            f"used {_fmt(overlap['early_draft_hit_rate'])}, drafting hidden {_fmt(overlap['hidden_share'])} "
            f"of the time; bound {_fmt(overlap['overlap_bound'])}x (sequential {_fmt(overlap['bound'])}x), "
            f"efficiency {_fmt(overlap['efficiency'])}"
        )
        for row in overlap["runs"]:
            lines.append(
                f"  K = {row['num_draft_tokens']}: overlapped / sequential {_fmt(row['overlapped_over_sequential'])}x"
                f"{_quartiles(row.get('overlapped_over_sequential_spread'))}"
                + (
                    f"; auto / the better fixed {_fmt(row['auto_over_best'])}x"
                    f"{_quartiles(row.get('auto_over_best_spread'))}"
                    if "auto_over_best" in row
                    else ""
                )
            )
    compared = doc.get("drafters")
    if compared:
        lines.append("drafters, speedup over K = 0 (acceptance; steps with a proposal / steps asked, per drafter):")
        for row in compared["rows"]:
            asked = ", ".join(
                f"{name} {c.get('proposals', 0)}/{c.get('steps', 0)}" for name, c in sorted(row["by_drafter"].items())
            )
            turns = (
                f"; first turns {_fmt(row['first_turn_acceptance'])}, repeated {_fmt(row['repeated_turn_acceptance'])}"
                if "repeated_turn_acceptance" in row
                else ""
            )
            lines.append(
                f"  {row['drafter']:<7} K = {row['num_draft_tokens']}: {_fmt(row['speedup'])}x "
                f"({_fmt(row['acceptance_rate'])}; {asked or 'no steps'}{turns})"
            )
        best = ", ".join(
            f"{name} {b['speedup']}x at K = {b['num_draft_tokens']}" for name, b in compared["best"].items()
        )
        lines.append(f"best per drafter: {best or 'none'}")
    serving = doc.get("serving_overhead")
    if serving:
        lines.append(f"Triton vs local, one stream: {_fmt(serving.get('triton_over_local'))}x of local tokens/s")
        for row in serving.get("streams", []):
            lines.append(
                f"Triton vs local, {row['concurrency']} streams at K = {row['num_draft_tokens']}: "
                f"{_fmt(row['triton_over_local'])}x of local tokens/s ({_fmt(row['triton_tokens_per_s'], '.1f')} "
                f"against {_fmt(row['local_tokens_per_s'], '.1f')})"
            )
        if serving.get("floor"):
            lines.append(
                f"Triton's cost per model call: {_ms(serving.get('overhead_s_per_call'))} ms; Triton's floor "
                f"for such a call here: {_ms(serving['floor']['median_s'])} ms "
                f"({_fmt(serving.get('overhead_over_floor'))}x the floor); at the floor one stream would get "
                f"at most {_fmt(serving.get('ceiling'))}x of local tokens/s"
            )
        if serving.get("overlapped"):
            lines.append(
                f"Triton overlapped vs local sequential, one stream: "
                f"{_fmt(serving['overlapped'].get('triton_over_local'))}x at K = "
                f"{serving['overlapped'].get('num_draft_tokens')}"
            )
    predicted = doc.get("prediction")
    if predicted:
        lines.append(
            f"predicted on {predicted['described']}: target step {_ms(predicted['target_step_seconds'])} ms, "
            f"c {_fmt(predicted['cost_ratio'], '.3f')} (from this run's acceptance; leaves out "
            f"{predicted['leaves_out']})"
        )
        for run in predicted["runs"]:
            lines.append(
                f"  K = {run['num_draft_tokens']}: sequential {_fmt(run['sequential'])}x, overlapped "
                f"{_fmt(run['overlapped'])}x (hit rate {_fmt(run['hit_rate'])}), bound {_fmt(run['bound'])}x; "
                f"measured here {_fmt(run['measured_speedup'])}x"
            )
        if predicted["best"]:
            best_run = predicted["best"]
            lines.append(
                f"  best: K = {best_run['num_draft_tokens']}, {best_run['schedule']}: {_fmt(best_run['speedup'])}x"
            )
    timed = doc.get("timed_stand_in")
    if timed:
        overran = ", ".join(f"{role} {f['overruns']} of {f['calls']}" for role, f in timed["in_process"].items())
        lines.append(
            f"timed stand-ins ({timed['described']}): the figures are of models that wait out a GPU's step times, "
            f"not of this machine's computation; in-process calls that overran their time: {overran or 'none timed'}"
        )
        for role, figures in timed["in_process"].items():
            if figures["calls"] and figures["overruns"] > OVERRUN_SHARE * figures["calls"]:
                lines.append(
                    f"warning: {figures['overruns'] / figures['calls']:.0%} of the {role}'s calls overran their timed "
                    "step: this machine's computation, not the timing, sets those figures; time longer steps"
                )
        if timed.get("served"):
            lines.append(f"the server's models: {timed['served']}")
    for note in doc.get("notes", []):
        lines.append(f"note: {note}")
    return "\n".join(lines)
