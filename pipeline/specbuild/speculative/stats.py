"""Per-request speculation statistics, in the project's one vocabulary.

- drafted: draft tokens the verifier was shown; accepted: those it kept.
- steps: verify calls (target forward passes), plain steps with an empty draft included.
- acceptance_rate = accepted / drafted (0.0 when nothing was drafted).
- mean_accepted_len = (accepted + steps) / steps: tokens produced per target step, the recovered or
  bonus token included (1.0 for plain decoding). Counted before EOS / stop / budget truncation,
  because it measures the verifier, not the request.
- per_position_drafted[i] / per_position_accepted[i]: how many steps drafted / accepted a token at
  draft position i (0-based). Their ratio, per_position_acceptance, is cumulative (as in vLLM):
  position i counts as accepted only when positions 0..i all were, so it falls with i
  (about alpha^(i + 1) for i.i.d. acceptance).
- draft_seconds, target_seconds: wall time in the drafter and the verifier. With the overlapped
  schedule draft_seconds still counts every draft the verifier was shown, early ones included.
- early_drafts / early_draft_hits (overlapped schedule): early drafts started while the target
  verified, and those used by the next step; early_draft_hit_rate = hits / early drafts.
- hidden_seconds: drafter time of the used early drafts that ran while the target verified
  (their draft seconds minus the time the loop waited for them): draft time taken off the request.
- fallback_steps: steps whose drafter failed (its model dead, frozen or answering an error; speculative.fallback)
  and which ran on the target alone; they count as steps of that drafter with no proposal.
- constrained_steps (guided requests, speculative.guide): extra plain target steps made where the guide refused the
  verifier's own token, to find the target's choice among the allowed ones (not counted in steps).
- by_drafter[name] (name: "model" or "lookup", `Draft.source`): per drafter, the steps it was asked to propose,
  the proposals it made (steps with at least one token), and its drafted and accepted tokens. Steps with K = 0 ask no
  drafter and are in no entry.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["DRAFTER_COUNTS", "SpeculationStats", "add_drafter_counts"]

DRAFTER_COUNTS = ("steps", "proposals", "drafted", "accepted")  # the counts of one by_drafter entry

_KEYS = (
    "drafted",
    "accepted",
    "steps",
    "acceptance_rate",
    "mean_accepted_len",
    "per_position_drafted",
    "per_position_accepted",
    "draft_seconds",
    "target_seconds",
)


@dataclass
class SpeculationStats:
    drafted: int = 0
    accepted: int = 0
    steps: int = 0
    per_position_drafted: list[int] = field(default_factory=list)  # [max k seen]
    per_position_accepted: list[int] = field(default_factory=list)  # [max k seen]
    draft_seconds: float = 0.0
    target_seconds: float = 0.0
    early_drafts: int = 0
    early_draft_hits: int = 0
    hidden_seconds: float = 0.0
    fallback_steps: int = 0
    constrained_steps: int = 0
    by_drafter: dict[str, dict[str, int]] = field(default_factory=dict)  # name -> steps, proposals, drafted, accepted

    @property
    def early_draft_hit_rate(self) -> float:
        return self.early_draft_hits / self.early_drafts if self.early_drafts else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_accepted_len(self) -> float:
        return (self.accepted + self.steps) / self.steps if self.steps else 0.0

    @property
    def per_position_acceptance(self) -> list[float]:
        """accepted / drafted at each draft position (0.0 where never drafted)."""
        return [a / d if d else 0.0 for a, d in zip(self.per_position_accepted, self.per_position_drafted)]

    def record_step(
        self,
        drafted: int,
        accepted: int,
        draft_seconds: float = 0.0,
        target_seconds: float = 0.0,
        drafter: str | None = None,
        fallback: bool = False,
    ) -> None:
        """Count one verify call that was shown `drafted` tokens and kept `accepted` of them; `drafter`: who was
        asked for them (None: nobody, K = 0); `fallback`: the drafter failed, so the step ran on the target alone."""
        if not 0 <= accepted <= drafted:
            raise ValueError(f"accepted = {accepted} must lie in [0, drafted = {drafted}]")
        if fallback and drafted:
            raise ValueError(f"a fallback step drafts nothing, not {drafted} tokens")
        self.fallback_steps += int(fallback)
        if drafter is not None:
            add_drafter_counts(
                self.by_drafter,
                drafter,
                {"steps": 1, "proposals": int(drafted > 0), "drafted": drafted, "accepted": accepted},
            )
        self.steps += 1
        self.drafted += drafted
        self.accepted += accepted
        self._grow(drafted)
        for i in range(drafted):
            self.per_position_drafted[i] += 1
        for i in range(accepted):
            self.per_position_accepted[i] += 1
        self.draft_seconds += draft_seconds
        self.target_seconds += target_seconds

    def record_early_draft(self) -> None:
        """Count one early draft started while the target verified."""
        self.early_drafts += 1

    def record_early_hit(self, hidden_seconds: float) -> None:
        """Count one early draft the next step used; hidden_seconds of its drafting overlapped the target."""
        self.early_draft_hits += 1
        self.hidden_seconds += hidden_seconds

    def merge(self, other: SpeculationStats) -> SpeculationStats:
        """A new SpeculationStats holding both (for aggregating across requests)."""
        out = SpeculationStats(
            drafted=self.drafted + other.drafted,
            accepted=self.accepted + other.accepted,
            steps=self.steps + other.steps,
            draft_seconds=self.draft_seconds + other.draft_seconds,
            target_seconds=self.target_seconds + other.target_seconds,
            early_drafts=self.early_drafts + other.early_drafts,
            early_draft_hits=self.early_draft_hits + other.early_draft_hits,
            hidden_seconds=self.hidden_seconds + other.hidden_seconds,
            fallback_steps=self.fallback_steps + other.fallback_steps,
            constrained_steps=self.constrained_steps + other.constrained_steps,
        )
        for src in (self, other):
            for name, counts in src.by_drafter.items():
                add_drafter_counts(out.by_drafter, name, counts)
        out._grow(max(len(self.per_position_drafted), len(other.per_position_drafted)))
        for src in (self, other):
            for i, (d, a) in enumerate(zip(src.per_position_drafted, src.per_position_accepted)):
                out.per_position_drafted[i] += d
                out.per_position_accepted[i] += a
        return out

    def report_fields(self) -> dict[str, Any]:
        """The figures a generation report carries (`generate --json`, local or served)."""
        return {
            "acceptance_rate": self.acceptance_rate,
            "mean_accepted_len": self.mean_accepted_len,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "steps": self.steps,
            "per_position_acceptance": self.per_position_acceptance,
            "draft_seconds": self.draft_seconds,
            "target_seconds": self.target_seconds,
            "early_drafts": self.early_drafts,
            "early_draft_hits": self.early_draft_hits,
            "early_draft_hit_rate": self.early_draft_hit_rate,
            "hidden_seconds": self.hidden_seconds,
            "fallback_steps": self.fallback_steps,
            "constrained_steps": self.constrained_steps,
            "by_drafter": self.drafter_figures(),
        }

    def drafter_figures(self) -> dict[str, dict[str, Any]]:
        """by_drafter with each drafter's acceptance_rate (accepted / drafted)."""
        return {
            name: {**counts, "acceptance_rate": counts["accepted"] / counts["drafted"] if counts["drafted"] else 0.0}
            for name, counts in sorted(self.by_drafter.items())
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "drafted": self.drafted,
            "accepted": self.accepted,
            "steps": self.steps,
            "acceptance_rate": self.acceptance_rate,
            "mean_accepted_len": self.mean_accepted_len,
            "per_position_drafted": list(self.per_position_drafted),
            "per_position_accepted": list(self.per_position_accepted),
            "draft_seconds": self.draft_seconds,
            "target_seconds": self.target_seconds,
            "early_drafts": self.early_drafts,
            "early_draft_hits": self.early_draft_hits,
            "early_draft_hit_rate": self.early_draft_hit_rate,
            "hidden_seconds": self.hidden_seconds,
            "fallback_steps": self.fallback_steps,
            "constrained_steps": self.constrained_steps,
            "by_drafter": {name: dict(counts) for name, counts in sorted(self.by_drafter.items())},
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SpeculationStats:
        """Inverse of to_dict (derived keys are recomputed, not trusted; the early-draft and fallback keys may be
        absent)."""
        missing = [k for k in _KEYS if k not in data]
        if missing:
            raise ValueError(f"speculation stats are missing keys {missing}")
        drafted, accepted = list(data["per_position_drafted"]), list(data["per_position_accepted"])
        if len(drafted) != len(accepted):
            raise ValueError("per_position_drafted and per_position_accepted differ in length")
        return cls(
            drafted=int(data["drafted"]),
            accepted=int(data["accepted"]),
            steps=int(data["steps"]),
            per_position_drafted=[int(x) for x in drafted],
            per_position_accepted=[int(x) for x in accepted],
            draft_seconds=float(data["draft_seconds"]),
            target_seconds=float(data["target_seconds"]),
            early_drafts=int(data.get("early_drafts", 0)),
            early_draft_hits=int(data.get("early_draft_hits", 0)),
            hidden_seconds=float(data.get("hidden_seconds", 0.0)),
            fallback_steps=int(data.get("fallback_steps", 0)),
            constrained_steps=int(data.get("constrained_steps", 0)),
            by_drafter={
                str(name): {key: int(counts.get(key, 0)) for key in DRAFTER_COUNTS}
                for name, counts in dict(data.get("by_drafter") or {}).items()
            },
        )

    def _grow(self, n: int) -> None:
        while len(self.per_position_drafted) < n:
            self.per_position_drafted.append(0)
            self.per_position_accepted.append(0)


def add_drafter_counts(into: dict[str, dict[str, int]], name: str, counts: dict[str, int]) -> None:
    """Add one drafter's counts (DRAFTER_COUNTS) into a by_drafter table."""
    entry = into.setdefault(name, dict.fromkeys(DRAFTER_COUNTS, 0))
    for key in DRAFTER_COUNTS:
        entry[key] += int(counts.get(key, 0))
