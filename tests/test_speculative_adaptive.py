"""The closed-form speedup model and the adaptive K controller."""

from __future__ import annotations

import numpy as np
import pytest
from toy_model import NGramModel, ToyDrafter, ToyVerifier, random_model

from specbuild.speculative.adaptive import AdaptiveK, best_k, expected_tokens_per_step, predicted_speedup
from specbuild.speculative.loop import GenerationRequest, generate


@pytest.mark.parametrize("alpha", [0.0, 0.3, 0.6, 0.9])
@pytest.mark.parametrize("k", [0, 1, 3, 6])
def test_expected_tokens_matches_a_simulation_of_iid_acceptance(alpha, k):
    rng = np.random.default_rng(0)
    n = 200_000
    accepted_each = rng.random((n, k)) < alpha  # [n, k]
    accepted = np.cumprod(accepted_each, axis=1).sum(axis=1) if k else np.zeros(n)
    simulated = (accepted + 1).mean()
    standard_error = accepted.std() / np.sqrt(n)
    assert expected_tokens_per_step(alpha, k) == pytest.approx(simulated, abs=5 * standard_error + 1e-12)


def test_closed_form_edges():
    assert expected_tokens_per_step(1.0, 4) == 5.0
    assert expected_tokens_per_step(0.0, 4) == 1.0
    assert expected_tokens_per_step(0.5, 0) == 1.0
    assert predicted_speedup(0.8, 4, 0.0) == pytest.approx(expected_tokens_per_step(0.8, 4))
    assert predicted_speedup(0.8, 4, 0.1) == pytest.approx(expected_tokens_per_step(0.8, 4) / 1.4)
    with pytest.raises(ValueError):
        expected_tokens_per_step(1.2, 2)
    with pytest.raises(ValueError):
        predicted_speedup(0.5, 2, -0.1)


@pytest.mark.parametrize("c", [0.05, 0.2, 0.5])
def test_break_even_acceptance_is_about_c(c):
    assert best_k(c - 0.02, c, 8)[0] == 0
    k, speedup = best_k(c + 0.02, c, 8)
    assert k >= 1 and speedup > 1.0


def test_best_k_over_a_list_of_candidates_by_hand():
    # alpha 0.9, c 0.05: K=1 1.9/1.05 = 1.81, K=2 2.71/1.1 = 2.46, K=4 4.10/1.2 = 3.41, K=8 6.13/1.4 = 4.38
    k, speedup = best_k(0.9, 0.05, [1, 2, 4, 8])
    assert k == 8 and speedup == pytest.approx((1 - 0.9**9) / 0.1 / 1.4)
    assert best_k(0.1, 0.5, [1, 2, 4]) == (0, 1.0)  # speculation does not pay: K = 0


def test_ties_go_to_the_smaller_k():
    # alpha 0, c 0: every K yields one token per step at no cost, speedup 1 for all; K = 0 wins
    assert best_k(0.0, 0.0, [1, 2, 4]) == (0, 1.0)
    # speedups within 1e-9 of the best count as equal (float noise): the smaller K wins
    assert best_k(0.5, 0.0, [3, 2], speedup=lambda a, k, c: 1.5 + (1e-10 if k == 3 else 0.0))[0] == 2
    assert best_k(0.5, 0.0, [3, 2], speedup=lambda a, k, c: 1.5 + (1e-6 if k == 3 else 0.0))[0] == 3


def test_best_k_is_the_argmax_and_grows_with_alpha():
    for alpha in (0.5, 0.7, 0.9):
        k, s = best_k(alpha, 0.1, 8)
        assert s == pytest.approx(max(predicted_speedup(alpha, j, 0.1) for j in range(9)))
    assert best_k(0.5, 0.1, 8)[0] < best_k(0.9, 0.1, 8)[0]
    assert best_k(1.0, 0.0, 5)[0] == 5


def test_controller_falls_back_probes_and_recovers():
    ctl = AdaptiveK(k_max=4, cost_ratio=0.3, probe_every=8)
    assert ctl.choose() == 4  # optimistic prior
    for _ in range(30):
        k = ctl.choose()
        ctl.update(k, 0)
    assert ctl.alpha < 0.3  # below the break-even alpha ~ c
    ks = []
    for _ in range(40):  # the drafter keeps failing: plain steps, a K = 1 probe every 9th step
        k = ctl.choose()
        ks.append(k)
        ctl.update(k, 0)
    probes = [i for i, k in enumerate(ks) if k]
    assert set(ks) == {0, 1} and len(probes) >= 4
    assert set(np.diff(probes)) == {9}  # 8 plain steps, then one probe
    for _ in range(60):  # the drafter becomes perfect: probes succeed and K climbs back
        k = ctl.choose()
        ctl.update(k, k)
    assert ctl.choose() == 4 and ctl.alpha > 0.95


def test_controller_measures_the_cost_ratio():
    ctl = AdaptiveK(k_max=4)
    assert ctl.c == 0.0
    for _ in range(20):
        ctl.update(4, 3, draft_seconds=4 * 0.01, target_seconds=0.1)
    assert ctl.c == pytest.approx(0.1)
    expensive = AdaptiveK(k_max=4)
    for _ in range(20):
        expensive.update(2, 2, draft_seconds=2 * 0.3, target_seconds=0.1)  # a draft token costs 3 target steps
    assert expensive.alpha > 0.9 and expensive.choose() == 0


def test_k_0_is_plain_decoding_at_speedup_1_whatever_the_speedup_function_says():
    """K = 0 is the baseline the candidates are scored against, never a candidate: a 0 among them is dropped."""
    says = lambda alpha, k, c: 5.0 - k  # noqa: E731  (a function that would rate K = 0 at 5)
    assert best_k(0.5, 0.0, 2, speedup=says) == (1, 4.0)
    assert best_k(0.5, 0.0, [0, 2], speedup=says) == (2, 3.0)


def test_best_k_considers_k_1_from_a_list():
    # alpha 0.5, c 0.2: K=1 1.5/1.2 = 1.25, K=2 1.75/1.4 = 1.25 (a tie: the smaller), K=3 1.875/1.6 = 1.17
    assert best_k(0.5, 0.2, [3, 1])[0] == 1
    assert best_k(0.5, 0.2, [1, 2, 3]) == (1, pytest.approx(1.25))


def test_the_estimates_by_hand():
    """alpha: the prior (0.8 over 4 trials) decayed by 0.9, plus a successes in a + 1 trials on a rejection (k on a
    whole acceptance); c: the draft's seconds per token over the target's per step, each an EWMA (0.9 kept)."""
    ctl = AdaptiveK(k_max=4)
    ctl.update(4, 1)  # a rejection after one accepted token: 1 success in 2 trials
    assert ctl.alpha == pytest.approx((0.9 * 3.2 + 1) / (0.9 * 4 + 2))
    ctl.update(4, 4)  # all four accepted: 4 in 4
    assert ctl.alpha == pytest.approx((0.9 * (0.9 * 3.2 + 1) + 4) / (0.9 * (0.9 * 4 + 2) + 4))
    timed = AdaptiveK(k_max=4)
    timed.update(2, 1, draft_seconds=0.2, target_seconds=1.0)  # the first figures are taken as they are
    assert timed.c == pytest.approx(0.1)
    timed.update(4, 1, draft_seconds=0.8, target_seconds=0.5)  # then 0.9 of the old and 0.1 of the new
    assert timed.c == pytest.approx((0.9 * 0.1 + 0.1 * 0.2) / (0.9 * 1.0 + 0.1 * 0.5))
    timed.update(4, 1)  # a step without timings changes neither
    timed.update(0, 0)
    assert timed.c == pytest.approx((0.9 * 0.1 + 0.1 * 0.2) / (0.9 * 1.0 + 0.1 * 0.5))


def test_the_cost_ratio_needs_both_timings():
    drafted = AdaptiveK(k_max=4)
    drafted.update(2, 1, draft_seconds=0.2)  # no target time yet: c is not known
    assert drafted.c == 0.0
    verified = AdaptiveK(k_max=4)
    verified.update(2, 1, target_seconds=0.5)  # no draft time yet
    assert verified.c == 0.0


def test_a_probe_is_k_1_and_never_above_k_max():
    one = AdaptiveK(k_max=1, cost_ratio=0.9, probe_every=2)
    one.update(1, 0)  # seen failing: K = 0
    assert one.choose() == 0
    one.update(0, 0)
    one.update(0, 0)
    assert one.choose() == 1  # two plain steps, then a probe with K = 1 = k_max
    none = AdaptiveK(k_max=0, probe_every=1)
    none.update(1, 0)  # a draft verified although the request's K is 0 (a shared controller)
    none.update(0, 0)
    assert none.choose() == 0  # no probe above k_max


def test_controller_rejects_bad_settings():
    with pytest.raises(ValueError):
        AdaptiveK(k_max=-1)
    with pytest.raises(ValueError):
        AdaptiveK(k_max=2, decay=1.0)


def loop_ks(drafter_table, target, max_tokens=150):
    request = GenerationRequest(max_tokens=max_tokens, num_draft_tokens=4, adaptive=True, cost_ratio=0.3)
    steps = list(generate([1, 2], ToyDrafter(NGramModel(drafter_table)), ToyVerifier(target), request))
    assert sum(len(s.tokens) for s in steps) == max_tokens
    return [s.k for s in steps]


def test_loop_with_a_bad_drafter_falls_back_to_plain_decoding():
    target = random_model(12, seed=1)
    ks = loop_ks(random_model(12, seed=7).table, target)
    tail = ks[len(ks) // 2 :]
    assert tail.count(0) >= 0.8 * len(tail)
    assert max(tail) == 1  # only probes


def test_loop_with_a_perfect_drafter_stays_at_full_k():
    target = random_model(12, seed=1)
    ks = loop_ks(target.table, target)
    assert all(k == 4 for k in ks[:-1])  # the last step may be clamped by the budget


def test_a_shared_controller_carries_what_earlier_requests_measured():
    target = random_model(12, seed=1)
    drafter, verifier = ToyDrafter(NGramModel(random_model(12, seed=7).table)), ToyVerifier(target)
    request = GenerationRequest(max_tokens=60, num_draft_tokens=4, adaptive=True, cost_ratio=0.3)
    shared = AdaptiveK(k_max=4, cost_ratio=0.3)
    list(generate([1, 2], drafter, verifier, request, controller=shared))
    assert shared.choose() == 0
    second = list(generate([3, 4], drafter, verifier, request, controller=shared))
    assert second[0].k == 0  # a fresh controller would start at the requested K = 4
    fresh = list(generate([3, 4], drafter, verifier, request))
    assert fresh[0].k == 4
    not_adaptive = GenerationRequest(max_tokens=5, num_draft_tokens=2)
    assert next(generate([3, 4], drafter, verifier, not_adaptive, controller=shared)).k == 2  # ignored


def test_the_bounds_take_their_whole_domain_and_refuse_outside_it_in_these_words():
    from specbuild.speculative.adaptive import expected_hit_rate, predicted_overlap_speedup

    assert expected_hit_rate(0.0, 2) == 0.0 and expected_hit_rate(1.0, 3) == 1.0 and expected_hit_rate(0.5, 0) == 0.5
    assert predicted_overlap_speedup(0.0, 2, 0.5, hit=1.0) == pytest.approx(1.0 / 1.5)  # h = 1 is allowed
    assert predicted_overlap_speedup(0.5, 1, 0.5) == pytest.approx(1.5 / (1.0 + 0.75 * 0.5))  # K = 1 is no K = 0
    assert AdaptiveK(k_max=0, decay=0.0, probe_every=1).k_max == 0  # every edge of the settings is allowed
    refused = [
        (lambda: expected_tokens_per_step(0.5, -1), "need k >= 0 and 0 <= alpha <= 1, got k = -1, alpha = 0.5"),
        (lambda: expected_hit_rate(1.5, 2), "need k >= 0 and 0 <= alpha <= 1, got k = 2, alpha = 1.5"),
        (lambda: expected_hit_rate(0.5, -1), "need k >= 0 and 0 <= alpha <= 1, got k = -1, alpha = 0.5"),
        (lambda: predicted_speedup(0.5, 2, -0.1), "cost ratio c must be >= 0, got -0.1"),
        (lambda: predicted_overlap_speedup(0.5, 2, -0.1), "cost ratio c must be >= 0, got -0.1"),
        (lambda: predicted_overlap_speedup(0.5, 2, 0.1, hit=1.5), "hit rate must lie in [0, 1], got 1.5"),
        (lambda: AdaptiveK(k_max=-1), "k_max must be >= 0, got -1"),
        (lambda: AdaptiveK(k_max=4, decay=1.0), "need 0 <= decay < 1 and probe_every >= 1, got 1.0, 8"),
        (lambda: AdaptiveK(k_max=4, probe_every=0), "need 0 <= decay < 1 and probe_every >= 1, got 0.9, 0"),
    ]
    for call, message in refused:
        with pytest.raises(ValueError) as err:
            call()
        assert str(err.value) == message
