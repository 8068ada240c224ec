"""Aggregation of per-request measurements and the closed-form theory, on hand-built numbers."""

import math

import pytest

from specbuild.bench import theory
from specbuild.bench.stats import (
    Distribution,
    RequestResult,
    alpha_from_acceptance_rate,
    per_token_alpha,
    percentile,
    summarize,
)


def test_percentile_matches_numpy_linear_interpolation():
    np = pytest.importorskip("numpy")
    values = [3.0, 1.0, 4.0, 1.5, 9.0, 2.6, 5.0]
    for q in (0, 10, 50, 90, 99, 100):
        assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))
    assert math.isnan(percentile([], 50))


def test_distribution_of_values():
    d = Distribution.of([1.0, 2.0, 3.0, 4.0, 100.0])
    assert d.median == 3.0
    assert d.mean == pytest.approx(22.0)
    assert 4.0 < d.p90 < d.p99 < d.max == 100.0
    assert Distribution.of([]).to_dict() == {"median": None, "p90": None, "p99": None, "mean": None, "max": None}


def test_per_token_alpha_counts_only_tried_positions():
    # K = 4; steps accepted 4, 2, 0: trials = 4 + 3 + 1, successes = 6
    assert per_token_alpha(6, 2) == pytest.approx(6 / 8)
    assert per_token_alpha(0, 0) is None


def test_alpha_from_acceptance_rate_inverts_the_iid_model():
    for alpha in (0.1, 0.5, 0.8, 0.95):
        for k in (1, 2, 4, 8):
            rate = sum(alpha**i for i in range(1, k + 1)) / k
            assert alpha_from_acceptance_rate(rate, k) == pytest.approx(alpha, abs=1e-6)


def _request(i, k, tokens, seconds, ttft, drafted=0, accepted=0, steps=0, rejections=None, pos=None):
    pos_d, pos_a = pos or ([], [])
    return RequestResult(
        prompt_index=i,
        num_draft_tokens=k,
        output_tokens=tokens,
        seconds=seconds,
        ttft_seconds=ttft,
        drafted=drafted,
        accepted=accepted,
        steps=steps,
        rejections=rejections,
        per_position_drafted=pos_d,
        per_position_accepted=pos_a,
        draft_seconds=0.1 * drafted,
        target_seconds=0.2 * steps,
    )


def test_summarize_one_cell():
    results = [
        _request(0, 2, 10, 2.0, 0.5, drafted=8, accepted=6, steps=4, rejections=2, pos=([4, 4], [4, 2])),
        _request(1, 2, 20, 2.0, 0.3, drafted=12, accepted=12, steps=6, rejections=0, pos=([6, 6], [6, 6])),
    ]
    s = summarize(results, wall_seconds=4.0)
    assert (s.requests, s.output_tokens, s.drafted, s.accepted, s.steps) == (2, 30, 20, 18, 10)
    assert s.tokens_per_s == pytest.approx(7.5)
    assert s.request_tokens_per_s.median == pytest.approx(7.5)  # 5 and 10 tok/s
    assert s.acceptance_rate == pytest.approx(0.9)
    assert s.alpha == pytest.approx(18 / 20)
    assert s.mean_accepted_len == pytest.approx((18 + 10) / 10)
    assert s.per_position_acceptance == [pytest.approx(1.0), pytest.approx(0.8)]
    assert s.tpot_seconds.median == pytest.approx(((2.0 - 0.5) / 9 + (2.0 - 0.3) / 19) / 2)
    assert s.draft_seconds_per_token == pytest.approx(0.1)
    assert s.target_seconds_per_step == pytest.approx(0.2)


def test_summarize_without_rejection_counts_falls_back_to_the_iid_inverse():
    r = _request(0, 4, 10, 1.0, 0.1, drafted=40, accepted=20, steps=10)
    s = summarize([r], 1.0)
    assert s.alpha == pytest.approx(alpha_from_acceptance_rate(0.5, 4))


def test_target_only_cell_has_no_acceptance():
    s = summarize([_request(0, 0, 8, 1.0, 0.2, steps=8)], 1.0)
    assert s.drafted == 0 and s.acceptance_rate is None and s.alpha is None
    assert s.mean_accepted_len == 1.0


def test_bound_uses_the_loop_formula():
    from specbuild.speculative.adaptive import predicted_speedup

    assert theory.bound(0.8, 4, 0.1) == pytest.approx(predicted_speedup(0.8, 4, 0.1))
    assert theory.bound(0.8, 0, 0.1) == 1.0
    # (1 - 0.8^5) / 0.2 / 1.4
    assert theory.bound(0.8, 4, 0.1) == pytest.approx((1 - 0.8**5) / 0.2 / 1.4)


def test_cost_ratio():
    assert theory.cost_ratio(0.002, 0.01) == pytest.approx(0.2)
    assert theory.cost_ratio(None, 0.01) is None


def test_degenerate_output_is_flagged():
    from specbuild.bench import report
    from specbuild.bench.stats import top_token_share

    assert top_token_share([7, 7, 7, 1]) == 0.75
    assert top_token_share([]) is None
    rows = [{"num_draft_tokens": 0, "concurrency": 1, "top_token_share": 0.9}]
    assert report.degenerate_notes(rows)[0].startswith("the output is degenerate: its most frequent token is 90%")
    rows[0]["top_token_share"] = 0.2
    assert report.degenerate_notes(rows) == []
    s = summarize([_request(0, 0, 4, 1.0, 0.1, steps=4)], 1.0)
    assert s.top_token_share is None


def test_a_served_answer_without_tokens_keeps_its_empty_ids_so_greedy_equality_is_still_judged():
    """A request whose first token ends it answers output_ids []: the Triton transport keeps [] (an answer), where
    it used to turn it into None ("no ids sent"), which made a whole workload's greedy check read "unknown"."""
    from specbuild.bench.remote import RemoteTransport
    from specbuild.bench.runner import Settings
    from specbuild.bench.workloads import Prompt
    from specbuild.decode.generation import Generation
    from specbuild.speculative.stats import SpeculationStats

    class Answers:
        def __init__(self, ids):
            self.ids = ids

        def generate(self, prompt, options):
            return Generation("", self.ids, "stop", None, None, None, SpeculationStats(), 0.01, None)

    transport = RemoteTransport("127.0.0.1:1", "grpc")
    for ids, expected in (([], []), ([5, 6], [5, 6]), (None, None)):
        transport._local.session = Answers(ids)
        result = transport.request(Prompt("p", "x"), 0, 8, Settings())
        assert result.output_ids == expected
