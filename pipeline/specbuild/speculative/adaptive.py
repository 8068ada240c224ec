"""Choosing K from the running acceptance, and when to stop speculating.

Model (Leviathan et al. 2023, arXiv 2211.17192, section 3.1): each draft token is accepted
independently with probability alpha, and one drafted token costs c target steps
(c = draft seconds per drafted token / target seconds per verify step). Then

    E[tokens per target step] = (1 - alpha^(K+1)) / (1 - alpha)        (K + 1 when alpha = 1)
    speedup(alpha, K, c)      = E / (K c + 1)

The overlapped (draft-ahead) schedule drafts the next step while the target verifies this one and
skips the next draft call on a hit (whole draft accepted, bonus token = the drafter's guess), with
probability h (alpha^(K+1) under the same model, greedy). The early draft (guess + K tokens) costs
(K + 1) c beside a verification of 1, so (docs/speculative.md derives it)

    overlapped_speedup(alpha, K, c, h) = E / (max(1, (K+1) c) + (1 - h) K c)

K = 0 is plain decoding (speedup 1). K = 1 beats it exactly when alpha > c, so the break-even
acceptance is alpha ~ c; the controller falls back to K = 0 below it and probes with K = 1 every
`probe_every` plain steps so it can notice when drafting starts paying again.

alpha is estimated from what verification reveals: a step with k drafted and a accepted shows
a successes in a + 1 trials (a < k) or k successes in k trials (a = k); positions after the first
rejection are never tested. Successes and trials are exponentially weighted (factor `decay` per
step) and start from a prior of `prior_weight` trials at `prior_alpha`. Until the first draft
has been verified the controller uses the requested K as given.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

__all__ = [
    "AdaptiveK",
    "best_k",
    "expected_hit_rate",
    "expected_tokens_per_step",
    "predicted_overlap_speedup",
    "predicted_speedup",
]


def expected_tokens_per_step(alpha: float, k: int) -> float:
    """Expected tokens per verify step (accepted + the recovered/bonus token) with K = k."""
    if k < 0 or not 0.0 <= alpha <= 1.0:
        raise ValueError(f"need k >= 0 and 0 <= alpha <= 1, got k = {k}, alpha = {alpha}")
    if alpha == 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def predicted_speedup(alpha: float, k: int, c: float) -> float:
    """Speedup over plain decoding of K = k with acceptance alpha and cost ratio c."""
    if c < 0:
        raise ValueError(f"cost ratio c must be >= 0, got {c}")
    return expected_tokens_per_step(alpha, k) / (k * c + 1.0)


def expected_hit_rate(alpha: float, k: int) -> float:
    """P(an early draft is used) for K = k: all k tokens accepted and the bonus token equal to the guess
    (alpha^(k+1): for greedy decoding the guess is the drafter's next draft token, accepted with alpha)."""
    if k < 0 or not 0.0 <= alpha <= 1.0:
        raise ValueError(f"need k >= 0 and 0 <= alpha <= 1, got k = {k}, alpha = {alpha}")
    return alpha ** (k + 1)


def predicted_overlap_speedup(alpha: float, k: int, c: float, hit: float | None = None) -> float:
    """Speedup over plain decoding of the overlapped schedule with K = k (hit: the early-draft hit rate,
    default expected_hit_rate(alpha, k)). Assumes the drafter runs beside the target without slowing it."""
    if c < 0:
        raise ValueError(f"cost ratio c must be >= 0, got {c}")
    if k == 0:
        return 1.0
    h = expected_hit_rate(alpha, k) if hit is None else hit
    if not 0.0 <= h <= 1.0:
        raise ValueError(f"hit rate must lie in [0, 1], got {h}")
    return expected_tokens_per_step(alpha, k) / (max(1.0, (k + 1) * c) + (1.0 - h) * k * c)


def best_k(
    alpha: float, c: float, ks: int | Iterable[int], speedup: Callable[[float, int, float], float] = predicted_speedup
) -> tuple[int, float]:
    """(K, speedup) with the highest predicted speedup among K = 0 (speedup 1) and `ks` (an int n: 1..n).

    Ties go to the smaller K: speedups within 1e-9 of the best count as equal (float noise), and a smaller
    K drafts less and holds less KV cache for the same predicted gain.
    """
    candidates = range(1, ks + 1) if isinstance(ks, int) else sorted({k for k in ks if k > 0})
    scored = [(0, 1.0)] + [(k, speedup(alpha, k, c)) for k in candidates]
    top = max(s for _, s in scored)
    return next((k, s) for k, s in scored if s >= top - 1e-9)


@dataclass
class AdaptiveK:
    k_max: int  # the request's K, already clamped to the engine's max_draft_len
    cost_ratio: float | None = None  # fixed c (e.g. from `check --measure`); None = measure from step timings
    decay: float = 0.9  # weight kept by the past at each step (memory ~ 1 / (1 - decay) steps)
    prior_alpha: float = 0.8  # optimistic prior, so a few early rejections do not stop speculation
    prior_weight: float = 4.0  # the prior counts as this many trials
    probe_every: int = 8  # plain steps between K = 1 probes
    _successes: float = field(init=False, repr=False)
    _trials: float = field(init=False, repr=False)
    _draft_per_token: float | None = field(default=None, init=False, repr=False)
    _target_per_step: float | None = field(default=None, init=False, repr=False)
    _plain_streak: int = field(default=0, init=False, repr=False)
    _observed: bool = field(default=False, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.k_max < 0:
            raise ValueError(f"k_max must be >= 0, got {self.k_max}")
        if not 0.0 <= self.decay < 1.0 or self.probe_every < 1:
            raise ValueError(f"need 0 <= decay < 1 and probe_every >= 1, got {self.decay}, {self.probe_every}")
        self._successes = self.prior_alpha * self.prior_weight
        self._trials = self.prior_weight

    @property
    def alpha(self) -> float:
        """Current estimate of the per-token acceptance probability."""
        return self._successes / self._trials if self._trials > 0 else self.prior_alpha

    @property
    def c(self) -> float:
        """Cost ratio in use: the fixed one, else the measured one, else 0 (not yet measured)."""
        if self.cost_ratio is not None:
            return self.cost_ratio
        if self._draft_per_token is None or not self._target_per_step:
            return 0.0
        return self._draft_per_token / self._target_per_step

    def choose(self) -> int:
        """K for the next step (0 = plain decoding, 1 = a probe after a long plain streak)."""
        if not self._observed:
            return self.k_max
        k, _ = best_k(self.alpha, self.c, self.k_max)
        if k == 0 and self.k_max > 0 and self._plain_streak >= self.probe_every:
            return 1
        return k

    def update(self, k: int, accepted: int, draft_seconds: float = 0.0, target_seconds: float = 0.0) -> None:
        """Feed back one verify step that was shown k draft tokens and kept `accepted`."""
        if k > 0:
            trials = accepted + (1 if accepted < k else 0)
            self._successes = self.decay * self._successes + accepted
            self._trials = self.decay * self._trials + trials
            self._plain_streak = 0
            self._observed = True
            if draft_seconds > 0:
                self._draft_per_token = self._ewma(self._draft_per_token, draft_seconds / k)
        else:
            self._plain_streak += 1
        if target_seconds > 0:
            self._target_per_step = self._ewma(self._target_per_step, target_seconds)

    def _ewma(self, old: float | None, new: float) -> float:
        return new if old is None else self.decay * old + (1.0 - self.decay) * new
