"""The draft-ahead schedule's parts one by one (speculative/overlap.py): the reference early draft and its timings,
an early draft's take, the worker thread, the auto schedule's bookkeeping and segments, and the cores and settings
a deployment plans with. Timings come from scripted clocks (the module's `time` replaced), never from the machine."""

from __future__ import annotations

import threading
from concurrent.futures import Future
from types import SimpleNamespace

import numpy as np
import pytest

import specbuild.speculative.overlap as overlap
from specbuild.contract.adapters import ContractDraft
from specbuild.speculative.interfaces import Ahead, Draft, SamplingParams
from specbuild.speculative.overlap import AutoSchedule, DraftAhead, EarlyDraft, Segments, ThreadedAhead
from specbuild.speculative.stats import SpeculationStats

GREEDY = SamplingParams()
SAMPLED = SamplingParams(temperature=1.0, seed=7)


def scripted_time(monkeypatch, *readings: float) -> None:
    """overlap's time.perf_counter returns `readings` in turn."""
    times = iter(readings)
    monkeypatch.setattr(overlap, "time", SimpleNamespace(perf_counter=lambda: next(times)))


class Scripted:
    """A drafter that proposes `tokens[:k]` (after any in `first`), reporting `seconds` (0: says nothing), and
    records each call's (tokens, k, sampling)."""

    def __init__(self, tokens, seconds=0.0, probs=None, logits=None):
        self.tokens, self.seconds, self.probs, self.logits = list(tokens), seconds, probs, logits
        self.calls = []

    def propose(self, tokens, k, sampling):
        self.calls.append((list(tokens), k, sampling))
        out = self.tokens[:k]
        probs = None if self.probs is None else self.probs[:k]
        if self.logits is not None:
            return ContractDraft(tokens=out, probs=probs, seconds=self.seconds, logits=self.logits[:k])
        return Draft(tokens=out, probs=probs, seconds=self.seconds)


# --- propose_ahead: the reference early draft -------------------------------------------------------------------


def test_a_greedy_early_draft_is_one_call_split_into_the_guess_and_the_rest_with_their_shares_of_its_time():
    probs = np.arange(12, dtype=np.float32).reshape(3, 4)
    drafter = Scripted([7, 8, 9], seconds=0.3, probs=probs)
    ahead = overlap.propose_ahead(drafter, [1, 2], 2, GREEDY)
    assert drafter.calls == [([1, 2], 3, GREEDY)]
    assert (ahead.guess, ahead.draft.tokens, ahead.guess_seconds) == (7, [8, 9], pytest.approx(0.1))
    assert ahead.draft.seconds == pytest.approx(0.2)  # two of the call's three tokens
    assert np.array_equal(ahead.draft.probs, probs[1:])


def test_a_greedy_early_draft_keeps_the_contract_drafts_logits_for_its_rest():
    logits = np.arange(8, dtype=np.float32).reshape(2, 4)
    ahead = overlap.propose_ahead(Scripted([7, 8], seconds=0.2, logits=logits), [1], 1, GREEDY)
    assert isinstance(ahead.draft, ContractDraft) and ahead.draft.tokens == [8]
    assert np.array_equal(ahead.draft.logits, logits[1:])


def test_an_early_drafts_time_is_read_around_the_call_when_the_drafter_does_not_say(monkeypatch):
    scripted_time(monkeypatch, 10.0, 10.5)
    ahead = overlap.propose_ahead(Scripted([7, 8, 9, 4, 5]), [1], 4, GREEDY)
    assert (ahead.guess_seconds, ahead.draft.seconds) == (pytest.approx(0.1), pytest.approx(0.4))
    scripted_time(monkeypatch, 3.0, 3.25)
    assert overlap.propose_ahead(Scripted([]), [1], 2, GREEDY) == Ahead(None, Draft([]), 0.25)
    scripted_time(monkeypatch, 0.0)  # read before the call, never after: the drafter says
    assert overlap.propose_ahead(Scripted([], seconds=0.5), [1], 2, GREEDY) == Ahead(None, Draft([]), 0.5)


def test_a_sampled_early_draft_finds_the_guess_greedily_then_makes_the_next_steps_very_call(monkeypatch):
    drafter = Scripted([7, 8, 9], seconds=0.25)
    ahead = overlap.propose_ahead(drafter, [1, 2], 2, SAMPLED)
    assert drafter.calls == [([1, 2], 1, GREEDY), ([1, 2, 7], 2, SAMPLED)]
    assert ahead == Ahead(7, Draft([7, 8], seconds=0.25), 0.25)  # the drafter's own times kept
    scripted_time(monkeypatch, 1.0, 1.5, 2.0, 2.75)  # the guess took 0.5 s, the proposal 0.75 s
    ahead = overlap.propose_ahead(Scripted([7, 8, 9]), [1, 2], 2, SAMPLED)
    assert (ahead.guess, ahead.guess_seconds, ahead.draft.seconds) == (7, 0.5, 0.75)
    scripted_time(monkeypatch, 4.0, 4.5)
    assert overlap.propose_ahead(Scripted([]), [1], 2, SAMPLED) == Ahead(None, Draft([]), 0.5)
    scripted_time(monkeypatch, 0.0)
    assert overlap.propose_ahead(Scripted([], seconds=0.1), [1], 2, SAMPLED) == Ahead(None, Draft([]), 0.1)


# --- EarlyDraft.take and DraftAhead ----------------------------------------------------------------------------


def done(ahead: Ahead) -> Future:
    future = Future()
    future.set_result(ahead)
    return future


def test_an_early_draft_is_taken_only_for_its_own_context_and_k(monkeypatch):
    ahead = Ahead(5, Draft([6, 7]))
    early = EarlyDraft(tokens=[1, 2], k=2, handle=done(ahead))
    assert early.take([1, 3, 5], 2)[0] is None  # the same length, another context: a miss, whatever the guess
    assert early.take([1, 2, 5], 3)[0] is None  # its context, another K: a miss
    assert early.take([1, 2, 4], 2)[0] is None  # the guess was not the bonus token
    assert early.take([1, 2, 5], 2)[0] is ahead
    scripted_time(monkeypatch, 2.0, 2.25, 3.0, 3.5)
    assert early.take([9], 2) == (None, 0.25)  # the seconds waited, on a miss too
    assert early.take([1, 2, 5], 2) == (ahead, 0.5)


def test_a_failed_early_draft_is_a_miss_and_a_started_one_is_waited_for_before_the_step_drafts_anew(monkeypatch):
    failed = Future()
    failed.set_running_or_notify_cancel()  # started: it cannot be cancelled
    failed.set_exception(RuntimeError("drafter died"))
    scripted_time(monkeypatch, 1.0, 1.25, 2.0, 2.5)
    assert EarlyDraft(tokens=[1], k=1, handle=failed).take([2, 3], 1) == (None, 0.25)  # a clear miss
    assert EarlyDraft(tokens=[1], k=1, handle=failed).take([1, 3], 1) == (None, 0.5)  # a would-be hit


def test_the_drafting_a_hit_hid_is_its_time_less_the_wait_and_never_below_zero(monkeypatch):
    schedule = DraftAhead(Scripted([]), None, next_k=lambda *a: 1, seed_for=lambda step: GREEDY)
    stats = SpeculationStats()
    schedule.early = EarlyDraft(tokens=[1], k=1, handle=done(Ahead(5, Draft([6], seconds=0.1))))
    scripted_time(monkeypatch, 0.0, 0.3)  # waited 0.3 s for a 0.1 s draft
    assert schedule.take([1, 5], 1, stats).tokens == [6]
    assert (stats.early_draft_hits, stats.hidden_seconds) == (1, 0.0)


def test_a_closed_schedule_has_no_early_draft_left_to_take():
    schedule = DraftAhead(Scripted([]), None, next_k=lambda *a: 1, seed_for=lambda step: GREEDY)
    schedule.early = EarlyDraft(tokens=[1], k=1, handle=done(Ahead(5, Draft([6]))))
    schedule.close()
    assert schedule.take([1, 5], 1, SpeculationStats()) is None


# --- ThreadedAhead: one worker per request ---------------------------------------------------------------------


class Gated(Scripted):
    """Its first call waits for `gate`; every call records the thread it ran on."""

    def __init__(self):
        super().__init__([7, 8, 9])
        self.gate, self.threads = threading.Event(), []

    def propose(self, tokens, k, sampling):
        self.threads.append(threading.current_thread().name)
        if len(self.threads) == 1:
            assert self.gate.wait(30)
        return super().propose(tokens, k, sampling)


def test_early_drafts_run_one_at_a_time_on_one_worker():
    drafter = Gated()
    proposer = ThreadedAhead(drafter)
    first = proposer.propose_ahead([1], 1, GREEDY)
    second = proposer.propose_ahead([2], 1, GREEDY)  # queued behind the first: a second worker would run it now
    drafter.gate.set()
    assert first.result(30).guess == 7 and second.result(30).guess == 7
    proposer.close()
    assert len(drafter.threads) == 2 and len(set(drafter.threads)) == 1
    assert drafter.threads[0].startswith("specbuild-draft-ahead")


def test_closing_drops_the_queued_early_drafts_and_waits_for_the_running_one():
    drafter = Gated()
    proposer = ThreadedAhead(drafter)
    running = proposer.propose_ahead([1], 1, GREEDY)
    queued = proposer.propose_ahead([2], 1, GREEDY)
    dropped = threading.Event()
    queued.add_done_callback(lambda _: dropped.set())
    closer = threading.Thread(target=proposer.close)
    closer.start()
    dropped_at_once = dropped.wait(30)  # close cancels the queue before it waits for the running draft
    drafter.gate.set()
    closer.join(30)
    assert dropped_at_once and queued.cancelled() and running.done() and not closer.is_alive()
    assert drafter.threads == [drafter.threads[0]]  # the queued draft never ran


# --- AutoSchedule: the bookkeeping -----------------------------------------------------------------------------


def test_a_segment_without_tokens_or_time_is_not_counted():
    schedule = AutoSchedule()
    for seconds, tokens in ((1.0, 0), (0.0, 5), (-1.0, 5), (1.0, -1)):
        schedule.report(True, seconds, tokens)
    assert schedule.figures()["segments"] == {"ahead": 0, "sequential": 0}
    schedule.report(True, 0.5, 1)  # one token is a segment
    schedule.report(True, 0.5, 1)
    assert schedule.figures() == {
        "drafting_ahead": True,
        "segments": {"ahead": 2, "sequential": 0},
        "seconds_per_token": {"ahead": 0.5, "sequential": None},
    }
    schedule.report(False, 0.2, 1)
    assert schedule.figures()["seconds_per_token"] == {"ahead": 0.5, "sequential": pytest.approx(0.2)}
    assert schedule.figures()["segments"] == {"ahead": 2, "sequential": 1}


def test_drafting_ahead_is_the_first_guess_and_must_be_strictly_faster_to_stay():
    schedule = AutoSchedule(margin=0.0)
    assert schedule.faster() is True  # nothing measured
    schedule.report(True, 1.0, 10)
    assert schedule.faster() is True and schedule.explore_interval() == schedule.explore_every  # one measured
    schedule.report(False, 1.0, 10)
    assert schedule.faster() is False  # as fast is not faster: the second core is not worth it


def test_the_looks_at_the_other_schedule_keep_their_rhythm():
    schedule = AutoSchedule(explore_every=2, explore_cost=1.0)
    schedule.report(True, 1.0, 10)
    schedule.report(False, 2.0, 10)
    assert [schedule.choose() for _ in range(9)] == [True, True, False] * 3


# --- Segments: a request's side of the schedule ----------------------------------------------------------------


def test_segments_skip_the_prefill_step_and_report_each_segments_time_and_tokens():
    clock = SimpleNamespace(now=0.0)
    schedule = AutoSchedule(segment=2, clock=lambda: clock.now)
    segments = Segments(schedule)
    assert segments.ahead is True  # the first guess, before any segment
    reports = []
    schedule.report = lambda ahead, seconds, tokens: reports.append((ahead, seconds, tokens))
    for step, tokens in enumerate([10, 20, 23, 26, 29, 32, 35]):
        clock.now = 100.0 * step * step  # the prefill step (0 -> 100) would stand out
        segments.step(tokens)
    # segments start at the second step (t 100, 20 tokens) and end after two steps
    assert reports == [(True, 900.0 - 100.0, 6), (True, 2500.0 - 900.0, 6)]


# --- settings and cores ----------------------------------------------------------------------------------------


def test_every_spelling_of_a_setting_and_the_error_that_names_where_it_came_from():
    words = {True: ("true", "1", "yes", "on", "TRUE", " Yes "), False: ("false", "0", "no", "off", "NO", "Off ")}
    for value, spellings in words.items():
        assert [overlap.parse_setting(word) for word in spellings] == [value] * len(spellings)
        assert overlap.parse_setting(value) is value
    assert overlap.parse_setting("AUTO") == "auto"
    with pytest.raises(ValueError) as error:
        overlap.parse_setting(2)
    assert str(error.value) == 'overlap = 2 is invalid: use true, false or "auto".'


def test_a_deployment_short_of_cores_says_how_many_it_has():
    assert overlap.resolve_auto("auto", 2, 3, "three models") == (
        False,
        "auto: off, 2 cores cannot run three models at once",
    )


def test_the_v2_quota_file_decides_and_v1_quotas_at_their_edges(tmp_path):
    both = tmp_path / "both"
    (both / "cpu").mkdir(parents=True)
    (both / "cpu.max").write_text("max 100000\n")  # v2 says: no limit; a v1 file beside it is not read
    (both / "cpu" / "cpu.cfs_quota_us").write_text("200000\n")
    (both / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert overlap.cgroup_cpu_quota(both) is None
    (both / "cpu.max").write_text("max 100000 extra\n")  # not the kernel's format: the v1 files are read
    assert overlap.cgroup_cpu_quota(both) == 2.0
    v1 = tmp_path / "v1"
    (v1 / "cpu").mkdir(parents=True)
    for quota, period, expected in (("0", "100000", None), ("1", "100000", 1e-5), ("1", "1", 1.0), ("5", "0", None)):
        (v1 / "cpu" / "cpu.cfs_quota_us").write_text(quota)
        (v1 / "cpu" / "cpu.cfs_period_us").write_text(period)
        assert overlap.cgroup_cpu_quota(v1) == expected, (quota, period)


def test_one_core_may_be_asked_for_and_the_cpu_count_stands_in_for_a_missing_mask(monkeypatch):
    monkeypatch.setenv(overlap.CORES_ENV, "1")
    assert overlap.available_cores() == 1
    monkeypatch.delenv(overlap.CORES_ENV)
    monkeypatch.setattr(overlap, "cgroup_cpu_quota", lambda: None)
    monkeypatch.delattr(overlap.os, "sched_getaffinity")  # macOS has none
    monkeypatch.setattr(overlap.os, "cpu_count", lambda: 3)
    assert overlap.available_cores() == 3
    monkeypatch.setattr(overlap.os, "cpu_count", lambda: None)  # unknown: one
    assert overlap.available_cores() == 1
