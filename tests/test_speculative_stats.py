"""SpeculationStats arithmetic, merge and the --json key names."""

from __future__ import annotations

import json

import pytest

from specbuild.speculative.stats import SpeculationStats

KEYS = {
    "drafted",
    "accepted",
    "steps",
    "by_drafter",
    "acceptance_rate",
    "mean_accepted_len",
    "per_position_drafted",
    "per_position_accepted",
    "draft_seconds",
    "target_seconds",
    "early_drafts",
    "early_draft_hits",
    "fallback_steps",
    "early_draft_hit_rate",
    "hidden_seconds",
}


def filled() -> SpeculationStats:
    s = SpeculationStats()
    s.record_step(4, 4, 0.01, 0.1)  # all accepted + bonus: 5 tokens
    s.record_step(4, 1, 0.01, 0.1)  # 1 accepted + recovered: 2 tokens
    s.record_step(2, 0, 0.005, 0.1)  # rejected at once: 1 token
    s.record_step(0, 0, 0.0, 0.05)  # plain step: 1 token
    for _ in range(3):
        s.record_early_draft()
    s.record_early_hit(0.004)
    return s


def test_record_step_arithmetic():
    s = filled()
    assert (s.steps, s.drafted, s.accepted) == (4, 10, 5)
    assert s.acceptance_rate == pytest.approx(0.5)
    assert s.mean_accepted_len == pytest.approx((5 + 2 + 1 + 1) / 4)  # tokens per verify step, bonus included
    assert s.per_position_drafted == [3, 3, 2, 2]
    assert s.per_position_accepted == [2, 1, 1, 1]
    assert s.per_position_acceptance == pytest.approx([2 / 3, 1 / 3, 0.5, 0.5])
    assert s.draft_seconds == pytest.approx(0.025) and s.target_seconds == pytest.approx(0.35)


def test_empty_stats_are_zero_not_nan():
    s = SpeculationStats()
    assert s.acceptance_rate == 0.0 and s.mean_accepted_len == 0.0 and s.per_position_acceptance == []
    s.record_step(0, 0)
    assert s.acceptance_rate == 0.0 and s.mean_accepted_len == 1.0


def test_record_step_rejects_more_accepted_than_drafted():
    with pytest.raises(ValueError, match=r"accepted = 3 must lie in \[0, drafted = 2\]"):
        SpeculationStats().record_step(2, 3)


def test_a_fallback_step_counts_as_its_drafters_step_with_no_proposal():
    s = filled()
    s.record_step(0, 0, 0.02, 0.05, "model", fallback=True)  # the draft model failed: a target-only step
    assert s.fallback_steps == 1 and s.by_drafter["model"] == {"steps": 1, "proposals": 0, "drafted": 0, "accepted": 0}
    assert s.merge(s).fallback_steps == 2 and s.merge(filled()).fallback_steps == 1
    assert (
        SpeculationStats.from_dict({k: v for k, v in s.to_dict().items() if k != "fallback_steps"}).fallback_steps == 0
    )
    with pytest.raises(ValueError, match="a fallback step drafts nothing, not 2 tokens"):
        SpeculationStats().record_step(2, 0, drafter="model", fallback=True)


def test_merge_sums_counts_and_aligns_positions():
    a = filled()
    b = SpeculationStats()
    b.record_step(6, 5, 0.02, 0.2)
    m = a.merge(b)
    assert (m.steps, m.drafted, m.accepted) == (5, 16, 10)
    assert m.per_position_drafted == [4, 4, 3, 3, 1, 1]
    assert m.per_position_accepted == [3, 2, 2, 2, 1, 0]
    assert m.mean_accepted_len == pytest.approx((10 + 5) / 5)
    assert m.target_seconds == pytest.approx(0.55)
    assert a.steps == 4 and b.steps == 1  # inputs untouched
    assert SpeculationStats().merge(a).to_dict() == a.to_dict()


def test_to_dict_has_exactly_the_vocabulary_keys_and_round_trips():
    d = filled().to_dict()
    assert set(d) == KEYS
    json.dumps(d)
    back = SpeculationStats.from_dict(json.loads(json.dumps(d)))
    assert back.to_dict() == d


def test_from_dict_errors():
    d = filled().to_dict()
    del d["steps"]
    with pytest.raises(ValueError, match=r"missing keys \['steps'\]"):
        SpeculationStats.from_dict(d)
    d = filled().to_dict()
    d["per_position_accepted"] = [1]
    with pytest.raises(ValueError, match="differ in length"):
        SpeculationStats.from_dict(d)


def test_early_draft_counts_merge_and_read_back_without_them():
    s = filled()
    assert (s.early_drafts, s.early_draft_hits) == (3, 1) and s.early_draft_hit_rate == pytest.approx(1 / 3)
    m = s.merge(filled())
    assert (m.early_drafts, m.early_draft_hits, m.hidden_seconds) == (6, 2, pytest.approx(0.008))
    assert SpeculationStats().early_draft_hit_rate == 0.0
    d = s.to_dict()
    for key in ("early_drafts", "early_draft_hits", "early_draft_hit_rate", "hidden_seconds"):
        del d[key]  # a document from a server that predates the overlapped schedule
    back = SpeculationStats.from_dict(d)
    assert (back.steps, back.early_drafts, back.hidden_seconds) == (4, 0, 0.0)
    fields = s.report_fields()
    assert fields["early_drafts"] == 3 and fields["early_draft_hit_rate"] == pytest.approx(1 / 3)
    assert fields["hidden_seconds"] == pytest.approx(0.004)
