"""Per-request measurements and their aggregation (median, p90, p99, mean, max over requests).

One `RequestResult` per request, whatever the transport (in-process, Triton, Hugging Face).
One `RunSummary` per (K, concurrency) cell of a benchmark, built by `summarize`.

Vocabulary as in `specbuild.speculative.interfaces`: drafted, accepted, steps (target forward
passes), acceptance_rate = accepted / drafted, mean_accepted_len = (accepted + steps) / steps
(tokens per target step, the recovered or bonus token included), as in `speculative.stats`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass
class RequestResult:
    prompt_index: int
    num_draft_tokens: int  # K asked for (0 = target only)
    output_tokens: int
    seconds: float  # request start to last token
    ttft_seconds: float  # request start to first output token
    drafted: int = 0
    accepted: int = 0
    steps: int = 0  # target forward passes (verify steps); 0 when the transport does not say
    rejections: int | None = None  # draft steps that had a rejected token; None when the transport does not say
    per_position_drafted: list[int] = field(default_factory=list)  # [K] drafts that reached position i
    per_position_accepted: list[int] = field(default_factory=list)  # [K] accepted at position i
    draft_seconds: float = 0.0  # time inside the drafter
    target_seconds: float = 0.0  # time inside the verifier (target forward passes)
    text: str | None = None
    concurrency: int = 1
    per_position_tried: list[int] = field(default_factory=list)  # [K] position i drafted with all before it accepted
    top_token_share: float | None = None  # share of the output taken by its most frequent token (degenerate text ~ 1)
    output_ids: list[int] | None = None  # [n] the generated tokens, when the transport returns them
    early_drafts: int = 0  # overlapped schedule: drafts started while the target verified
    early_draft_hits: int = 0  # ... and used by the next step
    hidden_seconds: float = 0.0  # drafter time of the used early drafts that overlapped the target
    by_drafter: dict[str, dict[str, int]] = field(default_factory=dict)  # SpeculationStats.by_drafter

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def tpot_seconds(self) -> float:
        """Time per output token after the first one."""
        if self.output_tokens <= 1:
            return 0.0
        return (self.seconds - self.ttft_seconds) / (self.output_tokens - 1)

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    @property
    def mean_accepted_len(self) -> float | None:
        return (self.accepted + self.steps) / self.steps if self.steps else None


def top_token_share(tokens: Sequence[int]) -> float | None:
    """How much of `tokens` is its most frequent token: near 1 for degenerate, repeating output."""
    if not tokens:
        return None
    counts: dict[int, int] = {}
    for t in tokens:
        counts[t] = counts.get(t, 0) + 1
    return max(counts.values()) / len(tokens)


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default method), q in [0, 100]."""
    if not values:
        return math.nan
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


@dataclass(frozen=True)
class Distribution:
    median: float
    p90: float
    p99: float
    mean: float
    max: float  # the longest (e.g. a stall that one request of a cell met)

    @classmethod
    def of(cls, values: Sequence[float]) -> Distribution:
        values = [v for v in values if v is not None]
        if not values:
            return cls(math.nan, math.nan, math.nan, math.nan, math.nan)
        return cls(
            percentile(values, 50),
            percentile(values, 90),
            percentile(values, 99),
            sum(values) / len(values),
            max(values),
        )

    def to_dict(self, digits: int = 6) -> dict[str, float | None]:
        return {k: (None if math.isnan(v) else round(v, digits)) for k, v in vars(self).items()}


@dataclass
class RunSummary:
    """All requests of one (K, concurrency) cell."""

    num_draft_tokens: int
    concurrency: int
    requests: int
    output_tokens: int
    wall_seconds: float  # elapsed time of the cell's batches (sum over batches when interleaved)
    tokens_per_s: float  # throughput: output tokens / wall_seconds
    request_tokens_per_s: Distribution  # per-request output tokens / request seconds
    ttft_seconds: Distribution
    tpot_seconds: Distribution
    drafted: int
    accepted: int
    steps: int
    acceptance_rate: float | None  # accepted / drafted
    alpha: float | None  # per-token acceptance probability: accepted / (accepted + rejections)
    mean_accepted_len: float | None  # (accepted + steps) / steps: tokens per target step, bonus/recovered included
    per_position_acceptance: list[float | None]  # [K] P(position i accepted | position i drafted)
    per_position_alpha: list[float | None]  # [K] P(position i accepted | positions before it accepted)
    top_token_share: float | None  # median over requests of the output's most frequent token share
    draft_seconds: float
    target_seconds: float
    draft_seconds_per_token: float | None  # drafter time per drafted token
    target_seconds_per_step: float | None  # verifier time per target forward pass
    early_drafts: int = 0  # overlapped schedule (speculative.stats): early drafts started
    early_draft_hits: int = 0  # ... and used
    hidden_seconds: float = 0.0  # drafting that ran beside the target and was used

    @property
    def early_draft_hit_rate(self) -> float | None:
        return self.early_draft_hits / self.early_drafts if self.early_drafts else None


def per_token_alpha(accepted: int, rejections: int) -> float | None:
    """Maximum-likelihood per-token acceptance under the i.i.d. model of the closed form.

    Each draft step is a run of Bernoulli(alpha) trials that stops at the first rejection or after
    all K accepts, so trials = accepted + rejections. (accepted / drafted understates alpha for
    K > 1: positions after a rejection are drafted but never tried.)
    """
    trials = accepted + rejections
    return accepted / trials if trials else None


def alpha_from_acceptance_rate(rate: float, k: int) -> float:
    """Invert acceptance_rate = (alpha + alpha^2 + ... + alpha^K) / K for alpha (bisection).

    Used when a transport reports only totals (drafted, accepted), assuming full-length drafts.
    """
    if k <= 1 or rate <= 0.0 or rate >= 1.0:
        return min(max(rate, 0.0), 1.0)
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if sum(mid**i for i in range(1, k + 1)) / k < rate:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def summarize(results: Sequence[RequestResult], wall_seconds: float) -> RunSummary:
    """Aggregate one (K, concurrency) cell over its requests."""
    if not results:
        raise ValueError("summarize() needs at least one request")  # a bug in the caller, not user input
    k = results[0].num_draft_tokens
    width = max((len(r.per_position_drafted) for r in results), default=0)
    pos_drafted = [
        sum(r.per_position_drafted[i] for r in results if i < len(r.per_position_drafted)) for i in range(width)
    ]
    pos_accepted = [
        sum(r.per_position_accepted[i] for r in results if i < len(r.per_position_accepted)) for i in range(width)
    ]
    pos_tried = [sum(r.per_position_tried[i] for r in results if i < len(r.per_position_tried)) for i in range(width)]
    drafted = sum(r.drafted for r in results)
    accepted = sum(r.accepted for r in results)
    steps = sum(r.steps for r in results)
    output_tokens = sum(r.output_tokens for r in results)
    alpha = None
    if drafted:
        if all(r.rejections is not None for r in results):
            alpha = per_token_alpha(accepted, sum(r.rejections or 0 for r in results))
        else:
            alpha = alpha_from_acceptance_rate(accepted / drafted, k)
    draft_s = sum(r.draft_seconds for r in results)
    target_s = sum(r.target_seconds for r in results)
    return RunSummary(
        num_draft_tokens=k,
        concurrency=results[0].concurrency,
        requests=len(results),
        output_tokens=output_tokens,
        wall_seconds=wall_seconds,
        tokens_per_s=output_tokens / wall_seconds if wall_seconds > 0 else 0.0,
        request_tokens_per_s=Distribution.of([r.tokens_per_s for r in results]),
        ttft_seconds=Distribution.of([r.ttft_seconds for r in results]),
        tpot_seconds=Distribution.of([r.tpot_seconds for r in results if r.output_tokens > 1]),
        drafted=drafted,
        accepted=accepted,
        steps=steps,
        acceptance_rate=accepted / drafted if drafted else None,
        alpha=alpha,
        mean_accepted_len=(accepted + steps) / steps if steps else None,
        per_position_acceptance=[a / d if d else None for a, d in zip(pos_accepted, pos_drafted)],
        per_position_alpha=[a / t if t else None for a, t in zip(pos_accepted, pos_tried)],
        top_token_share=Distribution.of([r.top_token_share for r in results]).median
        if any(r.top_token_share is not None for r in results)
        else None,
        draft_seconds=draft_s,
        target_seconds=target_s,
        draft_seconds_per_token=draft_s / drafted if drafted else None,
        target_seconds_per_step=target_s / steps if steps else None,
        early_drafts=sum(r.early_drafts for r in results),
        early_draft_hits=sum(r.early_draft_hits for r in results),
        hidden_seconds=sum(r.hidden_seconds for r in results),
    )
