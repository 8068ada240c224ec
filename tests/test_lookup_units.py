"""speculative/lookup.py's rules one at a time, each figure exact: where a match may start and end, the pool's
bound and counters, which pool a drafter is given, and the hybrid's bookkeeping of time and acceptance under a
scripted clock (the behaviour on whole generations is in tests/test_drafters.py)."""

from __future__ import annotations

import numpy as np
import pytest

from specbuild import drafters
from specbuild.drafters import LookupSettings
from specbuild.speculative import lookup as lookup_module
from specbuild.speculative.adaptive import expected_tokens_per_step
from specbuild.speculative.interfaces import Draft, SamplingParams
from specbuild.speculative.lookup import HybridDrafter, LookupDrafter, LookupPool, find_match, make_drafter

GREEDY = SamplingParams()
NEWEST = LookupSettings(is_use_oldest=False, is_public_pool=True)
OLDEST = LookupSettings(is_use_oldest=True, is_public_pool=True)


class Clock:
    """A clock that reads the times it is given, one per call."""

    def __init__(self, *times: float):
        self.times = list(times)

    def __call__(self) -> float:
        return self.times.pop(0)


class ScriptedModel:
    """A draft model that proposes `tokens` and reports `seconds` (0: it reports none, so the caller times it)."""

    def __init__(self, tokens: list[int], seconds: list[float]):
        self.tokens, self.seconds, self.calls = tokens, list(seconds), 0

    def propose(self, tokens, k, sampling):
        self.calls += 1
        return Draft(tokens=self.tokens[:k], seconds=self.seconds.pop(0))


# ---- where a match starts and ends -------------------------------------------------------------------------------
def test_a_pattern_longer_than_the_text_has_no_start():
    starts = lookup_module._starts(np.array([1]), np.array([1, 2]))
    assert starts.size == 0 and starts.dtype == np.int64


def test_a_pool_occurrence_at_a_sequences_end_is_no_match_and_the_one_before_it_is_taken():
    pool = LookupPool(max_tokens=100)
    pool.add([1, 2, 9, 8, 1, 2])  # "1 2" at 0 (followed by 9 8) and at 4 (nothing follows)
    found = find_match([7, 1, 2], 2, NEWEST, pool)
    assert (found.tokens, found.where) == ([9, 8], "pool")


def test_the_newest_of_three_occurrences_is_the_last_and_the_oldest_the_first():
    context = [1, 10, 1, 20, 1, 30, 1]
    assert find_match(context, 1, LookupSettings(max_matching_ngram_size=1, is_use_oldest=False)).tokens == [30]
    assert find_match(context, 1, LookupSettings(max_matching_ngram_size=1, is_use_oldest=True)).tokens == [10]


def test_the_pool_honours_oldest_and_newest_too():
    pool = LookupPool(max_tokens=100)
    pool.add([1, 2, 5, 1, 2, 6, 0])
    assert find_match([3, 1, 2], 1, OLDEST, pool).tokens == [5]
    assert find_match([3, 1, 2], 1, NEWEST, pool).tokens == [6]


def test_a_one_token_context_is_looked_up_in_the_pool_but_not_in_itself():
    pool = LookupPool(max_tokens=100)
    pool.add([4, 5, 6])
    assert find_match([4], 2, NEWEST, pool) == lookup_module.Match([5, 6], 1, "pool")
    assert find_match([4], 2, NEWEST) is None
    assert find_match([4, 5, 4], 0, NEWEST, pool) is None  # K = 0: no proposal


# ---- the pool's bound and counters ---------------------------------------------------------------------------------
def test_a_pool_needs_room_for_a_token():
    assert LookupPool(1).max_tokens == 1
    with pytest.raises(ValueError) as err:
        LookupPool(0)
    assert str(err.value) == "pool max_tokens = 0: must be >= 1"


def test_a_pool_filled_exactly_evicts_nothing_and_each_eviction_is_counted():
    pool = LookupPool(max_tokens=10)
    pool.add([1, 2, 3, 4, 5])
    pool.add([6, 7, 8, 9, 10])
    assert pool.figures() == {"sequences": 2, "tokens": 10, "max_tokens": 10, "added": 2, "evicted": 0}
    pool.add(list(range(20, 30)))  # ten tokens: both earlier sequences go
    assert pool.figures() == {"sequences": 1, "tokens": 10, "max_tokens": 10, "added": 3, "evicted": 2}


def test_a_two_token_sequence_is_kept_and_a_shorter_one_is_not():
    pool = LookupPool(max_tokens=10)
    pool.add([3])
    pool.add([])
    assert pool.figures()["added"] == 0
    pool.add([3, 4])
    assert [s.tolist() for s in pool.sequences()] == [[3, 4]] and pool.sequences()[0].dtype == np.int64


# ---- which drafter, with which pool ------------------------------------------------------------------------------
def test_a_drafter_gets_the_pool_only_where_the_settings_ask_for_it():
    pool = LookupPool(max_tokens=100)
    assert make_drafter(drafters.LOOKUP, None, LookupSettings(is_public_pool=True), pool).pool is pool
    assert make_drafter(drafters.LOOKUP, None, LookupSettings(is_public_pool=False), pool).pool is None
    hybrid = make_drafter("hybrid", ScriptedModel([1], [0.1]), LookupSettings(is_public_pool=True), pool)
    assert hybrid.lookup.pool is pool
    pool.add([4, 5, 6])
    assert LookupDrafter(NEWEST, pool).match([4], 2).tokens == [5, 6]


def test_the_model_drafters_refuse_a_deployment_without_a_draft_model():
    for name in (drafters.MODEL, "hybrid"):
        with pytest.raises(ValueError) as err:
            make_drafter(name, None, LookupSettings(), None)
        assert str(err.value) == f"drafter {name!r} needs a draft model"


def test_a_drafter_with_a_record_but_no_construction_is_a_bug_said_by_name(monkeypatch):
    record = drafters.get(drafters.LOOKUP)
    monkeypatch.setattr(drafters, "get", lambda name: record)
    with pytest.raises(AssertionError) as err:
        make_drafter("newcomer", None, LookupSettings(), None)
    assert str(err.value) == "drafter 'newcomer' has a record but no construction here"


def test_a_lookup_draft_reports_the_time_it_took():
    drafter = LookupDrafter(LookupSettings(), clock=Clock(10.0, 10.25))
    draft = drafter.propose([1, 2, 1], 2, GREEDY)
    assert (draft.tokens, draft.probs, draft.seconds, draft.source) == ([2, 1], None, 0.25, "lookup")


def test_a_hybrid_lookup_draft_reports_the_time_it_took():
    model = ScriptedModel([7, 7], [0.4])
    clock = Clock(10.0, 10.25, 10.5)  # the proposal's start, its lookup's end, when it was returned
    hybrid = HybridDrafter(LookupDrafter(LookupSettings(hybrid_min_match=1), clock=clock), model)
    draft = hybrid.propose([1, 2, 1], 2, GREEDY)  # "1" recurs: a tie with the model's 2 tokens goes to the lookup
    assert (draft.tokens, draft.seconds, draft.source, model.calls) == ([2, 1], 0.25, "lookup", 0)


# ---- the hybrid's bookkeeping --------------------------------------------------------------------------------------
NO_MATCH = [1, 2, 3]  # nothing recurs: the hybrid asks the model


def test_the_cost_ratio_is_the_mean_model_call_over_the_mean_verify_step():
    model = ScriptedModel([7, 7], [0.4, 0.0, 0.0])
    # calls: propose t0, proposed | propose t0 (verify 1.0), model times itself (0.6), proposed | ...
    clock = Clock(0.0, 0.5, 1.5, 2.1, 2.2, 5.2, 5.5, 5.6)
    hybrid = HybridDrafter(LookupDrafter(LookupSettings(), clock=clock), model)
    assert hybrid.cost_ratio() == HybridDrafter.SEEDED_C  # nothing measured
    hybrid.propose(NO_MATCH, 2, GREEDY)  # model: 0.4 s reported
    assert hybrid.cost_ratio() == HybridDrafter.SEEDED_C  # no verify step seen yet
    hybrid.propose(NO_MATCH, 2, GREEDY)  # verify 1.0 s (0.5 -> 1.5); model reports none: timed 1.5 -> 2.1
    assert hybrid.cost_ratio() == pytest.approx(((0.4 + 0.6) / 2) / (1.0 / 1))
    hybrid.propose(NO_MATCH, 2, GREEDY)  # verify 3.0 s (2.2 -> 5.2); model timed 5.2 -> 5.5
    assert hybrid.cost_ratio() == pytest.approx(((0.4 + 0.6 + 0.3) / 3) / ((1.0 + 3.0) / 2))
    assert model.calls == 3


def test_a_verify_step_of_no_time_leaves_the_prior_cost_ratio():
    model = ScriptedModel([7], [0.4, 0.4])
    hybrid = HybridDrafter(LookupDrafter(LookupSettings(), clock=Clock(0.0, 1.0, 1.0, 1.0)), model)
    hybrid.propose(NO_MATCH, 1, GREEDY)
    hybrid.propose(NO_MATCH, 1, GREEDY)  # the next proposal asked for at the instant the last was returned
    assert hybrid.cost_ratio() == HybridDrafter.SEEDED_C


def test_acceptance_counts_what_the_text_kept_of_each_proposal():
    model = ScriptedModel([5, 6, 7], [0.1] * 4)
    hybrid = HybridDrafter(LookupDrafter(LookupSettings(), clock=Clock(*range(20))), model)
    hybrid.propose(NO_MATCH, 3, GREEDY)  # proposes 5 6 7 after the 3 context tokens
    hybrid.propose([*NO_MATCH, 5], 3, GREEDY)  # the text went on with 5 only so far: 1 of 3
    assert hybrid.counts[drafters.MODEL] == [1.0 + 1, 2.0 + 3]
    hybrid.propose([*NO_MATCH, 5, 9, 6, 7], 3, GREEDY)  # proposed at 4: 9 is not 5, so 0 of 3 (6 7 later don't count)
    assert hybrid.counts[drafters.MODEL] == [1.0 + 1, 2.0 + 6]
    assert hybrid.counts[drafters.LOOKUP] == list(HybridDrafter.PRIOR)


def lookup_or_model(sampling: SamplingParams, model_seconds: float, verify_seconds: float, k: int, n: int) -> str:
    """The source of the hybrid's second proposal: the first (a model step that proposes nothing, so both drafters
    keep the prior acceptance) measures c = model_seconds / verify_seconds; the second has a lookup match whose
    proposal is n tokens long, against the model's k."""
    model = ScriptedModel([], [model_seconds, model_seconds])
    # the clock: the first proposal's start, its model timing when the model reports none, its end; then the second's
    times = [0.0, *([0.0] if model_seconds == 0 else []), 0.0, verify_seconds, verify_seconds, verify_seconds]
    hybrid = HybridDrafter(LookupDrafter(LookupSettings(hybrid_min_match=1), clock=Clock(*times)), model)
    hybrid.propose(NO_MATCH, k, sampling)
    context = [20, *range(40, 40 + n - 1), 20]  # "20" recurs: the proposal is what followed it, n tokens
    return hybrid.propose(context, k, sampling).source


def test_the_hybrid_weighs_the_lookup_by_the_measured_cost_unless_sampling_is_seeded():
    # E(0.5, 1) (1 + c) >= E(0.5, 4) holds from c = 1.9375 / 1.5 - 1 = 0.29: above SEEDED_C = 0.25
    assert expected_tokens_per_step(0.5, 1) * (1 + HybridDrafter.SEEDED_C) < expected_tokens_per_step(0.5, 4)
    assert lookup_or_model(GREEDY, model_seconds=1.0, verify_seconds=1.0, k=4, n=1) == "lookup"  # c = 1
    assert lookup_or_model(GREEDY, model_seconds=0.1, verify_seconds=1.0, k=4, n=1) == "model"  # c = 0.1
    unseeded = SamplingParams(temperature=1.0)
    assert lookup_or_model(unseeded, model_seconds=1.0, verify_seconds=1.0, k=4, n=1) == "lookup"  # measured c
    seeded = SamplingParams(temperature=1.0, seed=3)
    assert lookup_or_model(seeded, model_seconds=1.0, verify_seconds=1.0, k=4, n=1) == "model"  # SEEDED_C
    seeded_greedy = SamplingParams(temperature=0.0, seed=3)  # greedy: the seed plays no part, the measured c does
    assert lookup_or_model(seeded_greedy, model_seconds=1.0, verify_seconds=1.0, k=4, n=1) == "lookup"


def test_a_tie_goes_to_the_lookup():
    """n = k and a model that costs nothing (c = 0): as many tokens per step either way, and the lookup calls no
    model; a model that costs anything at all loses to it too."""
    assert lookup_or_model(GREEDY, model_seconds=0.0, verify_seconds=1.0, k=2, n=2) == "lookup"


def test_the_pools_index_finds_what_a_search_of_each_sequence_in_turn_finds():
    """PoolIndex against the plain rule (`_continuation` over the sequences, newest first, the first that matches):
    random pools over a small vocabulary, so that most tails match several times, across sequence boundaries too
    (such a match is none), with sequences of 2 tokens, and a tail longer than every sequence."""
    rng = np.random.default_rng(11)
    compared = found = 0
    for _ in range(300):
        sequences = [rng.integers(0, 4, size=int(rng.integers(2, 9))) for _ in range(int(rng.integers(0, 6)))]
        index = lookup_module.PoolIndex(sequences)
        for n in (1, 2, 3, 9):
            tail = rng.integers(0, 4, size=n)
            for k, oldest in ((1, True), (3, False), (8, True)):
                plain = next(
                    (c for s in sequences if (c := lookup_module._continuation(s, tail, k, oldest)) is not None), None
                )
                assert index.continuation(tail, k, oldest) == plain, (sequences, tail, k, oldest)
                compared, found = compared + 1, found + (plain is not None)
    assert compared / 5 < found < compared  # both outcomes, many times (1,014 matches of 3,600 here)


def test_the_pools_index_is_made_again_after_an_add_and_only_then():
    pool = LookupPool(100)
    pool.add([1, 2, 3])
    first = pool.index()
    assert pool.index() is first and first.continuation(np.array([2]), 2, True) == [3]
    pool.add([2, 9])
    assert pool.index() is not first and pool.index().continuation(np.array([2]), 2, True) == [9]  # newest first


def test_an_early_draft_taken_is_learned_as_the_models_proposal():
    """Drafting ahead, the loop takes the draft model's early draft on a hit and tells the hybrid (`adopt`): that
    proposal is the one the next step learns from, and the time until then is a verify step's."""
    model = ScriptedModel([7, 7], [0.4])
    clock = Clock(0.0, 0.1, 1.1, 1.6)  # adopt: its learn, its end | propose: start (verify 1.0), end
    hybrid = HybridDrafter(LookupDrafter(LookupSettings(), clock=clock), model)
    assert hybrid.early_drafter is model
    hybrid.adopt([1, 2, 3], Draft(tokens=[4, 5]))
    hybrid.propose([1, 2, 3, 4, 9], 2, GREEDY)  # the text took 4, not 5; nothing recurs: the model proposes
    assert hybrid.counts["model"] == [HybridDrafter.PRIOR[0] + 1, HybridDrafter.PRIOR[1] + 2]
    assert hybrid.cost_ratio() == pytest.approx(0.4 / 1.0) and model.calls == 1
