"""The overlapped (draft-ahead) schedule: the same text as the sequential loop whatever the timing,
the target's exact distribution, early drafts used exactly when they are valid, the auto gate, the bound.

Random timings: Jittered wraps a drafter or verifier and sleeps a random 0..max_ms before each call,
so early drafts finish before, during or after the verification they overlap.
"""

from __future__ import annotations

import os
import random
import threading
import time
from concurrent.futures import Future

import numpy as np
import pytest
from test_speculative_distribution import P_CORRECT, P_WRONG, chi_square_pvalue, exact_joint
from test_speculative_distribution import PROMPT as DIST_PROMPT
from test_speculative_distribution import pair as dist_pair
from toy_model import NGramModel, ToyDrafter, ToyVerifier, random_model

import specbuild.speculative.overlap as overlap_module
from specbuild.errors import RequestError
from specbuild.speculative.adaptive import expected_hit_rate, predicted_overlap_speedup, predicted_speedup
from specbuild.speculative.interfaces import Ahead, AheadDrafter, Draft, SamplingParams
from specbuild.speculative.loop import GenerationRequest, generate, run
from specbuild.speculative.overlap import AutoSchedule, ThreadedAhead, propose_ahead

V = 12
PROMPTS = [list(p) for p in np.random.default_rng(0).integers(0, V, size=(10, 3))]
TARGET = random_model(V, order=2, scale=2.0, seed=1)
OTHER = random_model(V, order=2, scale=2.0, seed=2)
DRAFTS = {"perfect": TARGET, "partial": NGramModel(TARGET.table + 0.9 * OTHER.table), "unrelated": OTHER}


class Jittered:
    """A drafter or verifier that sleeps a random 0..max_ms before each call (thread-safe rng)."""

    def __init__(self, inner, seed: int, max_ms: float):
        self.inner, self.max_ms = inner, max_ms
        self.rng, self.lock = random.Random(seed), threading.Lock()
        self.max_draft_len = getattr(inner, "max_draft_len", None)

    def _sleep(self):
        with self.lock:
            delay = self.rng.uniform(0.0, self.max_ms) / 1000
        time.sleep(delay)

    def propose(self, tokens, k, sampling):
        self._sleep()
        return self.inner.propose(tokens, k, sampling)

    def verify(self, tokens, draft, sampling):
        self._sleep()
        return self.inner.verify(tokens, draft, sampling)


TIMINGS = {"no delays": (0, 0), "slow drafter": (3, 0), "slow verifier": (0, 3), "both random": (2, 2)}


def both_schedules(prompt, draft_model, request, timing="no delays", seed=0):
    draft_ms, verify_ms = TIMINGS[timing]
    drafter = Jittered(ToyDrafter(draft_model), seed, draft_ms)
    verifier = Jittered(ToyVerifier(TARGET, max_draft_len=8), seed + 1, verify_ms)
    sequential = run(prompt, ToyDrafter(draft_model), ToyVerifier(TARGET, max_draft_len=8), request)
    overlapped = run(prompt, drafter, verifier, GenerationRequest(**{**vars(request), "overlap": True}))
    return sequential, overlapped


def same_work(a, b):
    keys = ("drafted", "accepted", "steps", "per_position_drafted", "per_position_accepted")
    return all(getattr(a.stats, key) == getattr(b.stats, key) for key in keys)


# --- greedy: bit-identical to the sequential loop and to target-only decoding ----------------------


@pytest.mark.parametrize("k", [1, 2, 4, 8])
@pytest.mark.parametrize("kind", list(DRAFTS))
def test_greedy_overlapped_equals_sequential_and_target_only(k, kind):
    hits = 0
    for i, prompt in enumerate(PROMPTS):
        end_id = V - 1 if i % 2 else None  # the toy target soon reaches EOS: half the prompts run to the budget
        request = GenerationRequest(max_tokens=30, num_draft_tokens=k, end_id=end_id)
        timing = list(TIMINGS)[i % len(TIMINGS)] if i < 4 else "no delays"
        sequential, overlapped = both_schedules(prompt, DRAFTS[kind], request, timing, seed=i)
        target_only = run(
            prompt,
            ToyDrafter(TARGET),
            ToyVerifier(TARGET),
            GenerationRequest(max_tokens=30, num_draft_tokens=0, end_id=end_id),
        )
        assert overlapped.tokens == sequential.tokens == target_only.tokens, (kind, k, prompt, timing)
        assert overlapped.finish_reason == sequential.finish_reason
        assert same_work(overlapped, sequential)
        hits += overlapped.stats.early_draft_hits
    if kind == "perfect":
        assert hits > 0


REPORTED_S = 60.0


class ReportsAMinute(ToyDrafter):
    """A drafter whose every draft says it took REPORTED_S (it takes microseconds): what the verify hid is then that
    less the time the loop waited for an early draft that was long done, a wait no busy machine brings near a minute."""

    def propose(self, tokens, k, sampling):
        draft = super().propose(tokens, k, sampling)
        draft.seconds = REPORTED_S
        return draft


def test_a_perfect_drafter_hits_every_early_draft_and_drafts_once_per_step():
    drafter = ReportsAMinute(TARGET)
    steps = list(
        generate(
            [1, 2], drafter, ToyVerifier(TARGET), GenerationRequest(max_tokens=40, num_draft_tokens=3, overlap=True)
        )
    )
    stats = steps[-1].stats
    assert [s.early_hit for s in steps] == [False] + [True] * (len(steps) - 1)
    assert stats.early_drafts == stats.early_draft_hits == len(steps) - 1
    assert drafter.calls == len(steps)  # one draft call in the first step, then one (greedy) early call per step
    # each hit hid its draft's time less the wait for it: greedy, an early draft is one call of K + 1 tokens reported
    # as REPORTED_S, K/(K + 1) of it the step's draft; the wait is short (the draft was done long before) but never 0
    # (the clock moves between asking and taking)
    assert 0 < stats.hidden_seconds < stats.early_draft_hits * REPORTED_S * 3 / 4
    assert stats.early_draft_hit_rate == 1.0


def test_k0_and_overlap_off_never_draft_ahead():
    for request in (
        GenerationRequest(max_tokens=12, num_draft_tokens=0, overlap=True),
        GenerationRequest(max_tokens=12, num_draft_tokens=3, overlap=False),
    ):
        drafter = ToyDrafter(TARGET)
        result = run([1, 2], drafter, ToyVerifier(TARGET), request)
        assert result.stats.early_drafts == 0
        assert drafter.calls == (0 if request.num_draft_tokens == 0 else result.stats.steps)


def test_no_early_draft_for_a_step_that_would_not_run():
    """The last step's draft ends the request under the hit hypothesis (budget, EOS, stop): nothing is started."""
    script = list(range(1, V - 1))
    for request in (
        GenerationRequest(max_tokens=4, num_draft_tokens=3, overlap=True),  # 3 + bonus = the budget
        GenerationRequest(max_tokens=30, num_draft_tokens=3, overlap=True, stop_sequences=[[2, 3]]),
    ):
        steps = list(generate([0], ScriptDrafter(script), ScriptVerifier(script), request))
        assert steps[-1].stats.early_drafts == 0, request


class ScriptDrafter:
    """Greedy continuation = the script (token n follows n tokens after the one-token prompt)."""

    def __init__(self, script):
        self.script = script

    def propose(self, tokens, k, sampling):
        n = len(tokens) - 1
        return Draft(list(self.script[n : n + k]))


class ScriptVerifier:
    max_draft_len = 8

    def __init__(self, script):
        self.script = script

    def verify(self, tokens, draft, sampling):
        from specbuild.speculative.acceptance import accept_greedy

        n, k = len(tokens) - 1, len(draft.tokens)
        logits = np.zeros((k + 1, V))
        logits[np.arange(k + 1), self.script[n : n + k + 1]] = 1.0
        accepted, out = accept_greedy(draft.tokens, logits)
        from specbuild.speculative.interfaces import Verification

        return Verification(accepted, out)


# --- seeded sampling: the same text as the sequential loop, whatever the timing -------------------


SAMPLINGS = [SamplingParams(temperature=1.0), SamplingParams(temperature=0.7, top_k=5, top_p=0.9)]


@pytest.mark.parametrize("adaptive", [False, True])
@pytest.mark.parametrize("timing", list(TIMINGS))
def test_seeded_sampling_overlapped_equals_sequential_whatever_the_timing(timing, adaptive):
    hits = 0
    for seed in range(6):
        sampling = SamplingParams(**{**vars(SAMPLINGS[seed % 2]), "seed": seed})
        request = GenerationRequest(max_tokens=24, num_draft_tokens=1 + seed % 3, sampling=sampling, adaptive=adaptive)
        sequential, overlapped = both_schedules(
            [1, 2], DRAFTS["partial" if seed % 3 else "perfect"], request, timing, seed=seed
        )
        assert overlapped.tokens == sequential.tokens, (timing, adaptive, seed)
        assert same_work(overlapped, sequential)
        hits += overlapped.stats.early_draft_hits
    assert hits > 0  # the comparison covered steps that used an early draft


def sampled_pairs(n=12):
    for seed in range(n):
        request = GenerationRequest(
            max_tokens=24, num_draft_tokens=2, sampling=SamplingParams(temperature=1.0, seed=seed)
        )
        yield both_schedules([1, 2], DRAFTS["perfect"], request)


def test_the_comparison_catches_an_early_draft_drawn_with_the_wrong_seed(monkeypatch):
    """Negative control: the early draft for step i + 1 drawn with step i's drafter seed."""
    real = overlap_module.DraftAhead.start
    monkeypatch.setattr(
        overlap_module.DraftAhead,
        "start",
        lambda self, context, output, draft, seconds, step, stats: real(
            self, context, output, draft, seconds, step - 1, stats
        ),
    )
    assert any(o.tokens != s.tokens for s, o in sampled_pairs())


def wrong_take(self, context, k):
    """Uses the early draft whenever the whole draft was accepted, whatever the bonus token."""
    if k != self.k or len(context) != len(self.tokens) + 1 or context[:-1] != self.tokens:
        self.handle.cancel()
        return None, 0.0
    return self.handle.result(), 0.0


def test_the_comparison_catches_an_early_draft_used_on_a_wrong_context(monkeypatch):
    """Negative control: an early draft used although the bonus token is not the guess it continued."""
    monkeypatch.setattr(overlap_module.EarlyDraft, "take", wrong_take)
    assert any(o.tokens != s.tokens for s, o in sampled_pairs())


# --- the target's exact distribution through the overlapped loop ----------------------------------


def overlapped_samples(n: int) -> np.ndarray:
    """[n, 5] tokens: K = 2, 5 tokens per request, so the second step can use an early draft."""
    target, draft = dist_pair(4)
    drafter, verifier = ToyDrafter(draft), ToyVerifier(target)
    out = np.zeros((n, 5), dtype=np.int64)
    hits = 0
    for i in range(n):
        request = GenerationRequest(
            max_tokens=5, num_draft_tokens=2, overlap=True, sampling=SamplingParams(temperature=1.0, seed=i)
        )
        result = run(DIST_PROMPT, drafter, verifier, request)
        out[i], hits = result.tokens, hits + result.stats.early_draft_hits
    assert hits > n // 5  # a real share of the samples went through an early draft
    return out


@pytest.mark.slow
def test_overlapped_output_matches_the_target_distribution_and_a_seed_bug_is_caught(monkeypatch):
    target, _ = dist_pair(4)
    joint = exact_joint(target, DIST_PROMPT, 5, SamplingParams(temperature=1.0))
    assert chi_square_pvalue(overlapped_samples(12_000), joint) > P_CORRECT
    real = overlap_module.DraftAhead.start  # negative control: the early draft reuses the current step's drafter seed
    monkeypatch.setattr(
        overlap_module.DraftAhead,
        "start",
        lambda self, context, output, draft, seconds, step, stats: real(
            self, context, output, draft, seconds, step - 1, stats
        ),
    )
    assert chi_square_pvalue(overlapped_samples(6_000), joint) < P_WRONG


# --- propose_ahead, the threaded default, a drafter's own asynchronous proposal -------------------


@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(temperature=0.8, seed=3)])
def test_propose_ahead_equals_the_call_it_replaces(sampling):
    drafter = ToyDrafter(DRAFTS["partial"])
    context = [1, 2, 3, 4]
    ahead = propose_ahead(drafter, context, 3, sampling)
    guess = int(np.argmax(DRAFTS["partial"].logits(context)))
    assert ahead.guess == guess
    direct = drafter.propose(context + [guess], 3, sampling)
    assert ahead.draft.tokens == direct.tokens
    if not sampling.greedy:
        assert np.array_equal(ahead.draft.probs, direct.probs)


def test_a_drafter_with_its_own_propose_ahead_is_used_as_is():
    class Own(ToyDrafter):
        started = 0

        def propose_ahead(self, tokens, k, sampling):

            Own.started += 1
            future = Future()
            future.set_result(propose_ahead(self, tokens, k, sampling))
            return future

    drafter = Own(TARGET)
    assert isinstance(drafter, AheadDrafter) and not isinstance(ToyDrafter(TARGET), AheadDrafter)
    result = run(
        [1, 2], drafter, ToyVerifier(TARGET), GenerationRequest(max_tokens=20, num_draft_tokens=2, overlap=True)
    )
    assert Own.started == result.stats.early_drafts > 0 and result.stats.early_draft_hits == Own.started


def test_threaded_ahead_runs_off_the_callers_thread_and_closes():
    seen = []

    class Recording(ToyDrafter):
        def propose(self, tokens, k, sampling):
            seen.append(threading.current_thread().name)
            return super().propose(tokens, k, sampling)

    ahead = ThreadedAhead(Recording(TARGET))
    result = ahead.propose_ahead([1, 2], 2, SamplingParams()).result()
    assert isinstance(result, Ahead) and len(result.draft.tokens) == 2
    assert seen and all(name.startswith("specbuild-draft-ahead") for name in seen)
    ahead.close()
    assert ahead._pool is None


def test_the_worker_thread_ends_with_the_request():
    before = {t.name for t in threading.enumerate()}
    run(
        [1, 2],
        ToyDrafter(TARGET),
        ToyVerifier(TARGET),
        GenerationRequest(max_tokens=20, num_draft_tokens=2, overlap=True),
    )
    steps = generate(
        [1, 2],
        ToyDrafter(TARGET),
        ToyVerifier(TARGET),
        GenerationRequest(max_tokens=20, num_draft_tokens=2, overlap=True),
    )
    next(steps)
    steps.close()  # a consumer that stops reading
    left = {t.name for t in threading.enumerate()} - before
    assert not any(name.startswith("specbuild-draft-ahead") for name in left)


# --- "auto": the schedule that has been faster, measured ----------------------------------------------


def test_auto_measures_each_schedule_then_runs_the_faster_and_looks_at_the_other_now_and_then():
    schedule = AutoSchedule(explore_every=3, margin=0.02, explore_cost=1.0)  # looks every 3 whatever the gap
    assert schedule.choose() is True  # nothing measured: drafting ahead first
    schedule.report(True, 1.0, 10)
    assert schedule.choose() is False  # then the sequential schedule once
    schedule.report(False, 0.8, 10)
    assert [schedule.choose() for _ in range(5)] == [False, False, False, True, False]  # one look at the other
    assert schedule.figures()["drafting_ahead"] is False
    for _ in range(6):  # the text changes: drafting ahead becomes the faster
        schedule.report(True, 0.5, 10)
    assert schedule.faster() is True and schedule.choose() is True
    close = AutoSchedule()
    close.report(True, 0.99, 10)
    close.report(False, 1.0, 10)
    assert close.faster() is False  # 1 % faster does not pay for a second busy core (margin 2 %)


def test_auto_looks_at_the_slower_schedule_less_often_the_wider_the_gap():
    """Each look costs the gap for a segment: a 25 % gap is looked at every 25 segments (about 1 % of the time), a
    1 % gap every `explore_every`, a huge one at most every `max_explore_every`."""
    wide = AutoSchedule(explore_every=3)
    wide.report(True, 1.0, 10)
    wide.report(False, 0.8, 10)  # sequential 1.25x as fast
    assert wide.explore_interval() == 25
    assert [wide.choose() for _ in range(27)] == [False] * 25 + [True, False]
    narrow = AutoSchedule(explore_every=3, margin=0.0)
    narrow.report(True, 1.0, 10)
    narrow.report(False, 0.99, 10)
    assert narrow.explore_interval() == 3
    huge = AutoSchedule()
    huge.report(True, 1.0, 10)
    huge.report(False, 0.1, 10)
    assert huge.explore_interval() == huge.max_explore_every == 32
    assert AutoSchedule().explore_interval() == 8  # nothing measured yet


class Machine:
    """A modelled machine for the auto schedule's clock: time is the sum of the calls' modelled costs, never the
    wall clock, so how busy the test's own machine is cannot change what "auto" measures. A call from the caller's
    thread (a step's own draft, the verification) costs its time; an early draft (on the draft-ahead thread) runs
    beside the verification: on a core of its own it costs only what it takes beyond the verification
    (`own_core`), sharing the verifier's core it delays it by its whole time."""

    def __init__(self, verify_ms: float, own_core: bool):
        self.verify_ms, self.own_core = verify_ms, own_core
        self.caller = threading.get_ident()
        self.ms = 0.0
        self.lock = threading.Lock()

    def spend(self, ms: float) -> None:
        if threading.get_ident() != self.caller and self.own_core:
            ms = max(0.0, ms - self.verify_ms)
        with self.lock:
            self.ms += ms

    def now(self) -> float:
        with self.lock:
            return self.ms / 1000


class Costed:
    """A drafter or verifier whose calls cost `ms` plus `per_token_ms` per token asked for on a Machine."""

    def __init__(self, inner, machine: Machine, ms: float, per_token_ms: float = 0.0):
        self.inner, self.machine, self.ms, self.per_token_ms = inner, machine, ms, per_token_ms
        self.max_draft_len = getattr(inner, "max_draft_len", None)

    def propose(self, tokens, k, sampling):
        self.machine.spend(self.ms + self.per_token_ms * k)
        return self.inner.propose(tokens, k, sampling)

    def verify(self, tokens, draft, sampling):
        self.machine.spend(self.ms)
        return self.inner.verify(tokens, draft, sampling)


class SameCore:
    """Early drafts on the verifier's core: each runs to its end when it is asked for, before the verification it
    would overlap (one core runs one thing at a time), so none is dropped unstarted and every one costs its time."""

    def __init__(self, drafter):
        self.drafter = drafter

    def propose(self, tokens, k, sampling):
        return self.drafter.propose(tokens, k, sampling)

    def propose_ahead(self, tokens, k, sampling):
        done = Future()
        done.set_result(propose_ahead(self.drafter, tokens, k, sampling))
        return done


def run_on(machine: Machine, draft_model, request: GenerationRequest):
    """The request with a 1 + 1.5 ms/token drafter and a 4 ms verifier on `machine`, "auto" timed by its clock."""
    schedule = AutoSchedule(clock=machine.now)
    drafter, verifier = Costed(ToyDrafter(draft_model), machine, 1.0, 1.5), Costed(ToyVerifier(TARGET), machine, 4.0)
    early = None if machine.own_core else SameCore(drafter)
    tokens, last = [], None
    for last in generate([1, 2], drafter, verifier, request, schedule=schedule, ahead_drafter=early):
        tokens.extend(last.tokens)
    return tokens, last.stats, schedule


def test_auto_drafts_ahead_where_it_is_faster_and_not_where_it_costs():
    """A drafter whose early drafts always hit, beside a verifier on its own core: drafting ahead hides most of
    the drafting (5.5 ms a step against 8 sequentially), and "auto" keeps it. One whose early drafts never hit,
    sharing the verifier's core: each early draft delays the verification (13.5 ms a step against 8), and "auto"
    stops drafting ahead (but for a segment now and then). The clock is the modelled machine's, so the outcome is
    the rule's, not the test machine's load."""
    request = GenerationRequest(max_tokens=150, num_draft_tokens=2, overlap="auto")
    machine = Machine(verify_ms=4.0, own_core=True)
    _, fast, schedule = run_on(machine, TARGET, request)
    assert schedule.seconds_per_token(True) < schedule.seconds_per_token(False)
    assert fast.early_drafts >= 0.6 * fast.steps
    assert fast.early_draft_hits >= fast.early_drafts - 1  # each was the next step's draft (but a last one, unused)
    machine = Machine(verify_ms=4.0, own_core=False)
    tokens, slow, schedule = run_on(machine, OTHER, request)
    assert schedule.seconds_per_token(True) > schedule.seconds_per_token(False)
    always = run(
        [1, 2], ToyDrafter(OTHER), ToyVerifier(TARGET), GenerationRequest(**{**vars(request), "overlap": True})
    )
    assert tokens == always.tokens  # the schedule never changes the text
    assert 1 <= slow.early_drafts <= 0.4 * slow.steps  # measured once, then a look now and then


def test_a_deployments_schedule_learns_across_requests():
    schedule = AutoSchedule(segment=2)
    request = GenerationRequest(max_tokens=12, num_draft_tokens=2, overlap="auto")
    for _ in range(3):
        list(generate([1, 2], ToyDrafter(TARGET), ToyVerifier(TARGET), request, schedule=schedule))
    measured = schedule.figures()["segments"]
    assert measured["ahead"] >= 1 and measured["sequential"] >= 1


def test_invalid_overlap_setting_is_a_request_error():
    with pytest.raises(RequestError, match=r"overlap = 'yes' is invalid: use true, false or \"auto\""):
        run([1], ToyDrafter(TARGET), ToyVerifier(TARGET), GenerationRequest(max_tokens=2, overlap="yes"))


def test_settings_and_the_auto_rule_for_a_deployment():
    assert [overlap_module.parse_setting(v) for v in (True, "False", " auto ", "on", "0")] == [
        True,
        False,
        "auto",
        True,
        False,
    ]
    with pytest.raises(ValueError, match=r"request parameter 'overlap' = 'sometimes' is invalid"):
        overlap_module.parse_setting("sometimes", "request parameter 'overlap'")
    assert overlap_module.resolve_auto("auto", 2, 2, "two model processes") == (
        "auto",
        "auto: 2 cores for two model processes",
    )
    assert overlap_module.resolve_auto("auto", 1, 2, "two model processes") == (
        False,
        "auto: off, 1 core cannot run two model processes at once",
    )
    assert overlap_module.resolve_auto(True, 1, 2, "x") == (True, "overlap on as asked")  # as asked, whatever the cores
    assert overlap_module.resolve_auto(False, 8, 2, "x") == (False, "overlap off as asked")
    assert overlap_module.available_cores() >= 1


def test_the_cores_are_the_fewer_of_the_mask_and_the_quota_unless_set(tmp_path, monkeypatch):
    monkeypatch.delenv(overlap_module.CORES_ENV, raising=False)
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "cpu.max").write_text("max 100000\n")
    assert overlap_module.cgroup_cpu_quota(v2) is None  # no limit
    (v2 / "cpu.max").write_text("150000 100000\n")
    assert overlap_module.cgroup_cpu_quota(v2) == 1.5
    v1 = tmp_path / "v1"
    (v1 / "cpu").mkdir(parents=True)
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    (v1 / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert overlap_module.cgroup_cpu_quota(v1) is None
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("400000\n")
    assert overlap_module.cgroup_cpu_quota(v1) == 4.0
    assert overlap_module.cgroup_cpu_quota(tmp_path / "none") is None

    mask = len(os.sched_getaffinity(0))
    monkeypatch.setattr(overlap_module, "cgroup_cpu_quota", lambda: 0.5)
    assert overlap_module.available_cores() == 1  # half a CPU still runs one thread
    monkeypatch.setattr(overlap_module, "cgroup_cpu_quota", lambda: mask + 0.5)
    assert overlap_module.available_cores() == mask  # a quota above the mask: the mask
    monkeypatch.setattr(overlap_module, "cgroup_cpu_quota", lambda: None)
    assert overlap_module.available_cores() == mask
    monkeypatch.setenv(overlap_module.CORES_ENV, "64")
    assert overlap_module.available_cores() == 64
    for bad in ("0", "two", "-3", ""):
        monkeypatch.setenv(overlap_module.CORES_ENV, bad)
        with pytest.raises(ValueError, match=f"SPECBUILD_CORES = {bad!r}: must be a whole number of cores >= 1"):
            overlap_module.available_cores()


# --- the closed form -----------------------------------------------------------------------------


def test_overlap_bound_limits_and_simulation():
    assert predicted_overlap_speedup(0.8, 0, 0.2) == 1.0
    assert predicted_overlap_speedup(0.8, 3, 0.0) == pytest.approx(predicted_speedup(0.8, 3, 0.0))  # free drafts
    assert predicted_overlap_speedup(1.0, 3, 0.2) == pytest.approx(4.0)  # every draft hidden
    assert predicted_overlap_speedup(0.8, 3, 0.2, hit=0.0) == pytest.approx(predicted_speedup(0.8, 3, 0.2))
    assert expected_hit_rate(0.9, 3) == pytest.approx(0.9**4)
    # a draft longer than the verification delays the next step: (K + 1) c > 1
    assert predicted_overlap_speedup(0.9, 4, 0.5, hit=1.0) == pytest.approx((1 - 0.9**5) / 0.1 / 2.5)
    # against a simulated schedule with i.i.d. acceptance and the guess accepted like a draft token
    rng = np.random.default_rng(0)
    alpha, k, c = 0.8, 3, 0.2
    tokens = time_used = 0.0
    hit = False
    for _ in range(200_000):
        trials = rng.random(k + 1) < alpha
        accepted = k if trials[:k].all() else int(np.argmin(trials[:k]))
        time_used += (0 if hit else k * c) + max(1.0, (k + 1) * c)
        tokens += accepted + 1
        hit = bool(trials.all())
    assert tokens / time_used == pytest.approx(predicted_overlap_speedup(alpha, k, c), rel=0.01)


def test_a_missed_early_draft_that_has_started_is_waited_for_one_not_started_is_dropped():
    """The drafter is busy with a started early draft, so the step's own draft is sent only when it is done (sent
    beside it to a one-instance Triton model it would queue behind it, where Triton's batcher can hold it 500 ms).
    Events order the two threads (running, then take() asked to drop it, then 0.1 s, then done), so `waited` is at
    least 0.1 s however busy the machine: no sleep has to outlast a thread's start."""
    from concurrent.futures import Future, ThreadPoolExecutor

    running, asked, release = threading.Event(), threading.Event(), threading.Event()

    class Watched:  # the pending early draft, noting when take() tries to drop it
        def __init__(self, future):
            self.future = future

        def cancel(self):
            asked.set()
            return self.future.cancel()

        def result(self, timeout=None):
            return self.future.result(timeout)

    def draft():
        running.set()
        assert release.wait(60)  # a deadline, not a figure
        return Ahead(draft=Draft(tokens=[1, 2]), guess=7)

    def release_later():
        if asked.wait(60):
            time.sleep(0.1)  # take() has begun by now and must still be waiting when this ends
        release.set()

    with ThreadPoolExecutor(max_workers=1) as pool:
        started = pool.submit(draft)
        assert running.wait(60)  # it is running now: cancel() cannot stop it
        releaser = threading.Thread(target=release_later)
        releaser.start()
        early = overlap_module.EarlyDraft(tokens=[5, 6], k=2, handle=Watched(started))
        taken, waited = early.take([5, 9, 3], 2)  # a rejected draft token: a clear miss
        releaser.join(60)
        assert taken is None and started.done() and not started.cancelled() and waited >= 0.1
    pending = Future()  # not started: dropped, not waited for
    guard = threading.Timer(30, lambda: pending.done() or pending.set_result(None))  # ends a wait that would hang
    guard.start()
    taken, waited = overlap_module.EarlyDraft(tokens=[5, 6], k=2, handle=pending).take([5, 9, 3], 2)
    guard.cancel()
    assert taken is None and pending.cancelled()


def test_the_auto_schedule_follows_recent_segments_and_forgets_old_ones():
    """Drafting ahead was slow for 20 segments (1 s a token) and then got fast (0.1 s a token) while the sequential
    schedule stayed at 0.5 s: with the decay, five fast segments outweigh the old ones and drafting ahead wins; a
    schedule that never forgets (decay 1) would still call it slower."""

    def history(schedule: AutoSchedule) -> AutoSchedule:
        for _ in range(20):
            schedule.report(True, 10.0, 10)
            schedule.report(False, 5.0, 10)
        assert not schedule.faster()
        for _ in range(5):
            schedule.report(True, 1.0, 10)
        return schedule

    assert history(AutoSchedule()).faster()
    assert not history(AutoSchedule(decay=1.0)).faster()


def test_an_auto_request_without_a_deployments_schedule_gets_one_of_its_own():
    """generate() gives an "auto" request without a schedule a fresh AutoSchedule: it drafts ahead for its first
    segment, then measures the sequential schedule for one (whatever the timings), so not every step drafts ahead."""
    request = GenerationRequest(max_tokens=150, num_draft_tokens=2, overlap="auto")
    stats = run([1, 2], ToyDrafter(TARGET), ToyVerifier(TARGET), request).stats
    assert stats.steps > 2 * AutoSchedule().segment + 2
    assert 0 < stats.early_drafts < stats.steps - 1
