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
    "constrained_steps",
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


def test_constrained_steps_merge_round_trip_and_read_back_without_them():
    s = filled()
    s.constrained_steps = 2
    assert s.merge(s).constrained_steps == 4 and s.merge(filled()).constrained_steps == 2
    assert SpeculationStats.from_dict(s.to_dict()).constrained_steps == 2
    assert s.report_fields()["constrained_steps"] == 2
    without = {k: v for k, v in s.to_dict().items() if k != "constrained_steps"}
    assert SpeculationStats.from_dict(without).constrained_steps == 0


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


def every_field() -> SpeculationStats:
    """Statistics with every field away from its default: two drafters, a fallback step, two early hits."""
    s = SpeculationStats()
    s.record_step(3, 2, 0.01, 0.1, "model")
    s.record_step(1, 1, 0.002, 0.1, "lookup")
    s.record_step(0, 0, 0.0, 0.1, "lookup")  # asked, nothing found
    s.record_step(0, 0, 0.004, 0.1, "model", fallback=True)
    s.record_step(0, 0, 0.0, 0.1, "model", fallback=True)
    for _ in range(3):
        s.record_early_draft()
    s.record_early_hit(0.25)
    s.record_early_hit(0.5)
    return s


def test_every_field_survives_to_dict_and_back_and_the_optional_ones_default_to_zero():
    s = every_field()
    assert (s.fallback_steps, s.early_draft_hits, s.hidden_seconds) == (2, 2, 0.75)
    assert s.by_drafter == {
        "model": {"steps": 3, "proposals": 1, "drafted": 3, "accepted": 2},
        "lookup": {"steps": 2, "proposals": 1, "drafted": 1, "accepted": 1},
    }
    assert SpeculationStats.from_dict(json.loads(json.dumps(s.to_dict()))) == s
    d = s.to_dict()
    for key in ("early_drafts", "early_draft_hits", "early_draft_hit_rate", "hidden_seconds", "fallback_steps"):
        del d[key]
    d["by_drafter"] = {"model": {"steps": 2}}  # a drafter's counts with only some keys
    back = SpeculationStats.from_dict(d)
    assert (back.early_draft_hits, back.fallback_steps) == (0, 0)
    assert back.by_drafter == {"model": {"steps": 2, "proposals": 0, "drafted": 0, "accepted": 0}}
    del d["by_drafter"]
    assert SpeculationStats.from_dict(d).by_drafter == {}
    merged = SpeculationStats().merge(s)
    assert merged == s and merged.by_drafter is not s.by_drafter


def test_the_report_fields_are_exactly_these():
    s = every_field()
    assert s.report_fields() == {
        "acceptance_rate": 0.75,
        "mean_accepted_len": (3 + 5) / 5,
        "drafted": 4,
        "accepted": 3,
        "steps": 5,
        "per_position_acceptance": [2 / 2, 1 / 1, 0.0],
        "draft_seconds": pytest.approx(0.016),
        "target_seconds": pytest.approx(0.5),
        "early_drafts": 3,
        "early_draft_hits": 2,
        "early_draft_hit_rate": 2 / 3,
        "hidden_seconds": 0.75,
        "fallback_steps": 2,
        "constrained_steps": 0,
        "by_drafter": {
            "lookup": {"steps": 2, "proposals": 1, "drafted": 1, "accepted": 1, "acceptance_rate": 1.0},
            "model": {"steps": 3, "proposals": 1, "drafted": 3, "accepted": 2, "acceptance_rate": 2 / 3},
        },
    }
    idle = SpeculationStats()
    idle.record_step(0, 0, drafter="lookup")  # asked, never proposed: a rate of 0, not a division by zero
    assert idle.drafter_figures() == {
        "lookup": {"steps": 1, "proposals": 0, "drafted": 0, "accepted": 0, "acceptance_rate": 0.0}
    }
    assert (idle.draft_seconds, idle.target_seconds) == (0.0, 0.0)  # no time given: none counted


def test_a_length_mismatch_is_said_exactly():
    d = every_field().to_dict()
    d["per_position_accepted"] = [1]
    with pytest.raises(ValueError) as err:
        SpeculationStats.from_dict(d)
    assert str(err.value) == "per_position_drafted and per_position_accepted differ in length"


def test_drafter_counts_add_up_and_a_missing_count_is_zero():
    from specbuild.speculative.stats import add_drafter_counts

    table: dict = {}
    add_drafter_counts(table, "lookup", {"steps": 2, "drafted": 5})  # e.g. a bench cell's entry from JSON
    add_drafter_counts(table, "lookup", {"steps": 1, "proposals": 1, "drafted": 1, "accepted": 1})
    assert table == {"lookup": {"steps": 3, "proposals": 1, "drafted": 6, "accepted": 1}}
