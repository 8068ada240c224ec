"""Prometheus metrics of the speculative BLS, exported through Triton's Python-backend custom metrics.

Counters are cumulative, so rates and ratios come from PromQL, e.g.
    acceptance rate          = rate(specbuild_accepted_tokens_total) / rate(specbuild_drafted_tokens_total)
    accepted tokens per step = rate(specbuild_generated_tokens_total) / rate(specbuild_verify_steps_total)
    acceptance at position i = specbuild_position_accepted_total{position="i"} / specbuild_position_drafted_total{position="i"}
    per drafter              = specbuild_drafter_{steps,proposals,drafted_tokens,accepted_tokens}_total{drafter="lookup"}
The lookup's pool (specbuild.drafters; one for every instance of the BLS, speculative.shared_pool) shows as the gauges
specbuild_lookup_pool_{tokens,sequences} and the counter specbuild_lookup_pool_evictions_total (each instance adds
the evictions its own requests caused).
Two gauges give the same running figures directly for dashboards without PromQL.

`QueueMetrics` is the BLS's queue, which it bounds itself (requests received and waiting for a slot, requests
running, time waited, requests refused); Triton's queue in front of it (nv_inference_pending_request_count,
nv_inference_queue_duration_us) is unbounded and holds a request only until `execute` takes it, which never waits
(specbuild.triton.configs: why no model has a Triton queue bound).

`pb_utils` is passed in (the module only exists inside the Triton stub), which keeps this testable.
A MetricFamily must outlive its Metric objects (else incrementing fails with "the corresponding
'MetricFamily' has been deleted"), so every family is kept here.
"""

from __future__ import annotations

import threading
from typing import Any

from specbuild.speculative.stats import SpeculationStats

COUNTERS = {
    "specbuild_requests_total": "Requests completed by the speculative BLS, by speculation on/off",
    "specbuild_drafted_tokens_total": "Draft tokens proposed (by every drafter)",
    "specbuild_accepted_tokens_total": "Draft tokens accepted by the target model",
    "specbuild_generated_tokens_total": "Tokens returned to clients (accepted + recovered/bonus)",
    "specbuild_verify_steps_total": "Target model calls (verify steps, or plain decoding steps when K = 0)",
    "specbuild_position_drafted_total": "Draft tokens proposed at each draft position (0-based)",
    "specbuild_position_accepted_total": "Draft tokens accepted at each draft position (0-based)",
    "specbuild_draft_seconds_total": "Wall time spent in draft model calls",
    "specbuild_target_seconds_total": "Wall time spent in target model calls",
    "specbuild_acceptance_disagreements_total": "Verify steps whose total_accepted_draft_tokens was missing or differed "
    "from the count the returned tokens give (the tokens decide)",
    "specbuild_cancelled_requests_total": "Requests the client cancelled, stopped before their end",
    "specbuild_target_retries_total": "Verify calls tried again because the target model failed (dead, frozen, not "
    "ready while reloaded): the request waited for it (triton.models.target_retry), its text unchanged",
    "specbuild_target_wait_seconds_total": "Time requests waited for a failed target model to serve again",
    "specbuild_draft_fallback_steps_total": "Steps whose draft model call failed (dead, frozen, an error answer) and "
    "which ran on the target alone (speculative.fallback): the text is the same, only slower",
    "specbuild_constrained_steps_total": "Target calls guided requests made where their grammar refused the target's "
    "own token, banning every refused one (speculative.guide)",
}
DRAFTER_COUNTERS = {  # by drafter (label "drafter": model, lookup), SpeculationStats.by_drafter
    "specbuild_drafter_steps_total": "Steps a drafter was asked to propose",
    "specbuild_drafter_proposals_total": "Steps a drafter proposed at least one token",
    "specbuild_drafter_drafted_tokens_total": "Draft tokens a drafter proposed",
    "specbuild_drafter_accepted_tokens_total": "Draft tokens of a drafter the target accepted",
}
POOL_GAUGES = {
    "specbuild_lookup_pool_tokens": "Tokens the lookup's pool holds (at most the spec's lookup.pool_max_tokens)",
    "specbuild_lookup_pool_sequences": "Finished requests' texts the lookup's pool holds",
}
POOL_COUNTERS = {"specbuild_lookup_pool_evictions_total": "Texts dropped from the lookup's pool to stay within its cap"}
GAUGES = {
    "specbuild_acceptance_rate": "Accepted / drafted draft tokens since the model loaded",
    "specbuild_mean_accepted_len": "Tokens produced per target step since the model loaded (bonus included)",
}


class SpeculationMetrics:
    def __init__(self, pb_utils: Any, model_name: str, max_positions: int):
        self._families = {}
        for name, description in COUNTERS.items():
            self._families[name] = pb_utils.MetricFamily(
                name=name, description=description, kind=pb_utils.MetricFamily.COUNTER
            )
        for name, description in {**DRAFTER_COUNTERS, **POOL_COUNTERS}.items():
            self._families[name] = pb_utils.MetricFamily(
                name=name, description=description, kind=pb_utils.MetricFamily.COUNTER
            )
        for name, description in {**GAUGES, **POOL_GAUGES}.items():
            self._families[name] = pb_utils.MetricFamily(
                name=name, description=description, kind=pb_utils.MetricFamily.GAUGE
            )
        labels = {"model": model_name}
        self._metrics = {
            name: family.Metric(labels=labels)
            for name, family in self._families.items()
            if name not in ("specbuild_requests_total",) and "position" not in name and name not in DRAFTER_COUNTERS
        }
        self._labels = labels
        self._by_drafter: dict[str, dict[str, Any]] = {}  # drafter -> counter name -> Metric, made when first seen
        self._evicted = 0
        self._requests = {
            mode: self._families["specbuild_requests_total"].Metric(labels={**labels, "speculation": mode})
            for mode in ("on", "off")
        }
        self._positions = {
            kind: [
                self._families[f"specbuild_position_{kind}_total"].Metric(labels={**labels, "position": str(i)})
                for i in range(max_positions)
            ]
            for kind in ("drafted", "accepted")
        }
        self._totals = SpeculationStats()

    def cancelled(self) -> None:
        """One request stopped because its client cancelled it."""
        self._metrics["specbuild_cancelled_requests_total"].increment(1)

    def target_retries(self, retries: int, waited_s: float) -> None:
        """One request's verify calls tried again, and the time it waited for the target (triton.models.target_retry)."""
        self._metrics["specbuild_target_retries_total"].increment(retries)
        self._metrics["specbuild_target_wait_seconds_total"].increment(waited_s)

    def disagreement(self) -> None:
        """One verify step whose acceptance figure the tokens contradicted (contract.adapters.ContractVerifier)."""
        self._metrics["specbuild_acceptance_disagreements_total"].increment(1)

    def record(self, stats: SpeculationStats, generated_tokens: int) -> None:
        """Add one finished request's statistics."""
        self._requests["on" if stats.drafted > 0 else "off"].increment(1)
        m = self._metrics
        m["specbuild_drafted_tokens_total"].increment(stats.drafted)
        m["specbuild_accepted_tokens_total"].increment(stats.accepted)
        m["specbuild_generated_tokens_total"].increment(generated_tokens)
        m["specbuild_verify_steps_total"].increment(stats.steps)
        if stats.fallback_steps:
            m["specbuild_draft_fallback_steps_total"].increment(stats.fallback_steps)
        if stats.constrained_steps:
            m["specbuild_constrained_steps_total"].increment(stats.constrained_steps)
        m["specbuild_draft_seconds_total"].increment(stats.draft_seconds)
        m["specbuild_target_seconds_total"].increment(stats.target_seconds)
        for kind, counts in (("drafted", stats.per_position_drafted), ("accepted", stats.per_position_accepted)):
            for position, count in enumerate(counts[: len(self._positions[kind])]):
                if count:
                    self._positions[kind][position].increment(count)
        for drafter, counts in stats.by_drafter.items():
            for name, metric in self._drafter_metrics(drafter).items():
                key = name.removeprefix("specbuild_drafter_").removesuffix("_total").removesuffix("_tokens")
                if counts.get(key):
                    metric.increment(counts[key])
        self._totals = self._totals.merge(stats)
        m["specbuild_acceptance_rate"].set(self._totals.acceptance_rate)
        m["specbuild_mean_accepted_len"].set(self._totals.mean_accepted_len)

    def pool(self, figures: dict[str, int]) -> None:
        """The lookup pool's figures (`speculative.lookup.LookupPool.figures`) after a request."""
        if not figures:
            return
        self._metrics["specbuild_lookup_pool_tokens"].set(figures["tokens"])
        self._metrics["specbuild_lookup_pool_sequences"].set(figures["sequences"])
        evicted = figures.get("evicted_here", figures["evicted"])  # a shared pool: this instance's own evictions
        if evicted > self._evicted:
            self._metrics["specbuild_lookup_pool_evictions_total"].increment(evicted - self._evicted)
            self._evicted = evicted

    def _drafter_metrics(self, drafter: str) -> dict[str, Any]:
        if drafter not in self._by_drafter:
            self._by_drafter[drafter] = {
                name: self._families[name].Metric(labels={**self._labels, "drafter": drafter})
                for name in DRAFTER_COUNTERS
            }
        return self._by_drafter[drafter]


QUEUE_GAUGES = {
    "specbuild_bls_queue_depth": "Requests the BLS has received and not yet started: each waits for one of its "
    "max_concurrent_requests slots, at most max_queue_size per instance",
    "specbuild_bls_active_requests": "Requests the BLS is running now (at most max_concurrent_requests per instance)",
}
QUEUE_COUNTERS = {
    "specbuild_bls_queue_seconds_total": "Seconds requests waited in the BLS for a slot, from execute to start "
    "(Triton's queue before that: nv_inference_queue_duration_us)",
    "specbuild_bls_started_requests_total": "Requests the BLS started running",
    "specbuild_bls_refused_requests_total": 'Requests the BLS refused with UNAVAILABLE "Exceeds maximum queue size": '
    "max_queue_size were already waiting",
}


class QueueMetrics:
    """The BLS's own queue: how many requests wait for a slot, how many run, and how long they waited.
    Thread-safe (requests are received on Triton's thread and started on the BLS's pool)."""

    def __init__(self, pb_utils: Any, model_name: str):
        self._lock = threading.Lock()
        self._families = {
            name: pb_utils.MetricFamily(name=name, description=text, kind=pb_utils.MetricFamily.GAUGE)
            for name, text in QUEUE_GAUGES.items()
        }
        self._families.update(
            {
                name: pb_utils.MetricFamily(name=name, description=text, kind=pb_utils.MetricFamily.COUNTER)
                for name, text in QUEUE_COUNTERS.items()
            }
        )
        self._metrics = {name: family.Metric(labels={"model": model_name}) for name, family in self._families.items()}
        self.waiting = 0
        self.active = 0

    def admit(self, slots: int, max_waiting: int) -> bool:
        """Count a request received, or refuse it (False, counted) when it would wait behind `max_waiting` others
        for one of `slots` (0 = no bound)."""
        with self._lock:
            if max_waiting and self.waiting + self.active >= slots + max_waiting:
                self._metrics["specbuild_bls_refused_requests_total"].increment(1)
                return False
            self.waiting += 1
            self._metrics["specbuild_bls_queue_depth"].set(self.waiting)
            return True

    def started(self, waited_s: float) -> None:
        with self._lock:
            self.waiting -= 1
            self.active += 1
            self._metrics["specbuild_bls_queue_depth"].set(self.waiting)
            self._metrics["specbuild_bls_active_requests"].set(self.active)
            self._metrics["specbuild_bls_queue_seconds_total"].increment(max(waited_s, 0.0))
            self._metrics["specbuild_bls_started_requests_total"].increment(1)

    def finished(self) -> None:
        with self._lock:
            self.active -= 1
            self._metrics["specbuild_bls_active_requests"].set(self.active)
