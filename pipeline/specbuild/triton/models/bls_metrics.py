"""Prometheus metrics of the speculative BLS, exported through Triton's Python-backend custom metrics.

Counters are cumulative, so rates and ratios come from PromQL, e.g.
    acceptance rate          = rate(specbuild_accepted_tokens_total) / rate(specbuild_drafted_tokens_total)
    accepted tokens per step = rate(specbuild_generated_tokens_total) / rate(specbuild_verify_steps_total)
    acceptance at position i = specbuild_position_accepted_total{position="i"} / specbuild_position_drafted_total{position="i"}
Two gauges give the same running figures directly for dashboards without PromQL.

`pb_utils` is passed in (the module only exists inside the Triton stub), which keeps this testable.
A MetricFamily must outlive its Metric objects (else incrementing fails with "the corresponding
'MetricFamily' has been deleted"), so every family is kept here.
"""

from __future__ import annotations

from typing import Any

from specbuild.speculative.stats import SpeculationStats

COUNTERS = {
    "specbuild_requests_total": "Requests completed by the speculative BLS, by speculation on/off",
    "specbuild_drafted_tokens_total": "Draft tokens proposed by the draft model",
    "specbuild_accepted_tokens_total": "Draft tokens accepted by the target model",
    "specbuild_generated_tokens_total": "Tokens returned to clients (accepted + recovered/bonus)",
    "specbuild_verify_steps_total": "Target model calls (verify steps, or plain decoding steps when K = 0)",
    "specbuild_position_drafted_total": "Draft tokens proposed at each draft position (0-based)",
    "specbuild_position_accepted_total": "Draft tokens accepted at each draft position (0-based)",
    "specbuild_draft_seconds_total": "Wall time spent in draft model calls",
    "specbuild_target_seconds_total": "Wall time spent in target model calls",
}
GAUGES = {
    "specbuild_acceptance_rate": "Accepted / drafted draft tokens since the model loaded",
    "specbuild_mean_accepted_len": "Tokens produced per target step since the model loaded (bonus included)",
}


class SpeculationMetrics:
    def __init__(self, pb_utils: Any, model_name: str, max_positions: int):
        self._families = {}
        for name, description in COUNTERS.items():
            self._families[name] = pb_utils.MetricFamily(name=name, description=description,
                                                          kind=pb_utils.MetricFamily.COUNTER)
        for name, description in GAUGES.items():
            self._families[name] = pb_utils.MetricFamily(name=name, description=description,
                                                          kind=pb_utils.MetricFamily.GAUGE)
        labels = {"model": model_name}
        self._metrics = {
            name: family.Metric(labels=labels)
            for name, family in self._families.items()
            if name not in ("specbuild_requests_total",) and "position" not in name
        }
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

    def record(self, stats: SpeculationStats, generated_tokens: int) -> None:
        """Add one finished request's statistics."""
        self._requests["on" if stats.drafted > 0 else "off"].increment(1)
        m = self._metrics
        m["specbuild_drafted_tokens_total"].increment(stats.drafted)
        m["specbuild_accepted_tokens_total"].increment(stats.accepted)
        m["specbuild_generated_tokens_total"].increment(generated_tokens)
        m["specbuild_verify_steps_total"].increment(stats.steps)
        m["specbuild_draft_seconds_total"].increment(stats.draft_seconds)
        m["specbuild_target_seconds_total"].increment(stats.target_seconds)
        for kind, counts in (("drafted", stats.per_position_drafted), ("accepted", stats.per_position_accepted)):
            for position, count in enumerate(counts[: len(self._positions[kind])]):
                if count:
                    self._positions[kind][position].increment(count)
        self._totals = self._totals.merge(stats)
        m["specbuild_acceptance_rate"].set(self._totals.acceptance_rate)
        m["specbuild_mean_accepted_len"].set(self._totals.mean_accepted_len)
