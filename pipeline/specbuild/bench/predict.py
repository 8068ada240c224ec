"""`bench --predict`: the speedup a pair would get where its step times are another machine's.

The acceptance a run measures (tokens per verify step and draft tokens per step, per K, on one stream) depends on the
pair and the workload, not on the machine: it holds on a GPU as on this CPU. The step times do not: they come from the
timing asked for, a fixed time per step or a named GPU's cost model (`specbuild.gpus`; the same grammar as the timed
stand-ins, `reference.timing`), applied to the spec's models (their parameter counts and layers read from the
checkpoints, their weight format from the spec) unless the timing names other sizes.

Per K, in units of one plain target step T (c = draft step / T, E = measured tokens per step, k = measured draft
tokens per step, h = the early-draft hit rate):
- sequential: E / (1 + k c);
- overlapped (drafting the next step while the target verifies): E / (max(1, (k + 1) c) + (1 - h) k c), with h as
  measured where the run drafted ahead, else alpha^(K+1) (docs/speculative.md derives both);
- bound: Leviathan et al.'s closed form from the measured alpha and c, for reference.
What it leaves out: the host's own time per step (the loop's and, served, Triton's: `serving_overhead`), a verify
step's extra cost over a plain one at large K, KV-cache reads (short contexts), batching.
"""

from __future__ import annotations

from typing import Any

from specbuild import gpus
from specbuild.bench import theory
from specbuild.config import ModelSpec, Spec
from specbuild.errors import BenchError
from specbuild.reference.timing import StandInTiming

SCHEDULES = ("sequential", "overlapped")


def step_times(spec: Spec, timing: StandInTiming) -> dict[str, float]:
    """Seconds per step of each role under `timing`: its fixed time, or the GPU's cost model of the model's size."""
    if timing.gpu is None:
        missing = [role for role in spec.roles if role not in timing.fixed]
        if missing:
            raise BenchError(f"--predict {timing.text!r} has no step time for the {missing[0]}: name both roles.")
        return {role: timing.fixed[role] for role in spec.roles}
    models: dict[str, ModelSpec | None] = {"target": spec.target, "draft": spec.draft}
    times = {}
    for role in spec.roles:
        model = models[role]
        assert model is not None
        size = theory.ModelSize.of_checkpoint(model.checkpoint, role)
        parameters = timing.parameters.get(role, size.parameters)
        if timing.bytes_per_weight is not None:
            weights = parameters * timing.bytes_per_weight
        else:
            weights = theory.weight_bytes(theory.ModelSize(int(parameters), size.layers), model)
        times[role] = gpus.step_seconds(timing.gpu, weights, size.layers)
    return times


def _overlapped(tokens: float, k: float, c: float, hit: float) -> float:
    return tokens / (max(1.0, (k + 1) * c) + (1.0 - hit) * k * c)


def prediction(rows: list[dict[str, Any]], times: dict[str, float], timing: StandInTiming) -> dict[str, Any]:
    """The predicted speedup per K and schedule from the run's one-stream cells (report.cells) and the step times."""
    target = times["target"]
    c = times.get("draft", 0.0) / target
    runs = []
    one_stream = (r for r in rows if r["concurrency"] == 1 and r["num_draft_tokens"] > 0)
    for row in sorted(one_stream, key=lambda r: r["num_draft_tokens"]):
        k, tokens, drafted = row["num_draft_tokens"], row["mean_accepted_len"], row["mean_k"]
        if not tokens or drafted is None:
            continue
        alpha, hit = row["alpha"], row["early_draft_hit_rate"]  # hit: None where the run did not draft ahead
        if hit is None:
            hit = theory.hit_rate(alpha, k) if alpha is not None else 0.0
        runs.append(
            {
                "num_draft_tokens": k,
                "tokens_per_step": tokens,
                "mean_k": drafted,
                "sequential": round(tokens / (1.0 + drafted * c), 4),
                "overlapped": round(_overlapped(tokens, drafted, c, hit), 4),
                "hit_rate": round(hit, 4),
                "bound": round(theory.bound(alpha, k, c), 4) if alpha is not None else None,
                "measured_speedup": row["speedup"],
            }
        )
    options = [(run[schedule], run["num_draft_tokens"], schedule) for run in runs for schedule in SCHEDULES]
    top = max(options, default=None)
    return {
        "timing": timing.text,
        "described": timing.describe(),
        "target_step_seconds": round(target, 9),
        "draft_step_seconds": round(times["draft"], 9) if "draft" in times else None,
        "cost_ratio": round(c, 6),
        "runs": runs,
        "best": {"num_draft_tokens": top[1], "schedule": top[2], "speedup": top[0]} if top else None,
        "leaves_out": "the host's time per step (the loop's, Triton's), KV-cache reads, batching",
    }
