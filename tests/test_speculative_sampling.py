"""process_logits (temperature, top-k, top-p, greedy) and the samplers."""

from __future__ import annotations

import numpy as np
import pytest

from specbuild.errors import RequestError
from specbuild.speculative.interfaces import SamplingParams
from specbuild.speculative.sampling import process_logits, sample, sample_rows, validate_sampling

LOGITS = np.array([[2.0, 1.0, 0.5, -1.0, 3.0], [0.0, 0.0, 0.0, 0.0, 0.0]])


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def test_greedy_is_one_hot_at_the_argmax():
    for sampling in (SamplingParams(), SamplingParams(temperature=0.8, top_k=1)):
        probs = process_logits(LOGITS, sampling)
        np.testing.assert_array_equal(probs, [[0, 0, 0, 0, 1], [1, 0, 0, 0, 0]])  # ties: first index


@pytest.mark.parametrize("t", [0.5, 1.0, 2.0])
def test_temperature_is_softmax_of_scaled_logits(t):
    probs = process_logits(LOGITS, SamplingParams(temperature=t))
    np.testing.assert_allclose(probs, softmax(LOGITS / t), rtol=1e-12)
    assert probs.dtype == np.float64


def test_top_k_keeps_the_k_largest_and_renormalises():
    probs = process_logits(LOGITS[:1], SamplingParams(temperature=1.0, top_k=2))
    expected = np.zeros(5)
    expected[[0, 4]] = softmax(np.array([2.0, 3.0]))
    np.testing.assert_allclose(probs[0], expected, rtol=1e-12)


def test_top_k_keeps_ties_at_the_boundary_and_is_off_at_vocab_size():
    probs = process_logits(np.array([1.0, 2.0, 2.0, 0.0]), SamplingParams(temperature=1.0, top_k=2))
    assert probs[1] == probs[2] > 0 and probs[0] == probs[3] == 0
    full = process_logits(LOGITS, SamplingParams(temperature=1.0, top_k=5))
    np.testing.assert_allclose(full, softmax(LOGITS), rtol=1e-12)


@pytest.mark.parametrize(
    "top_p,kept",
    [(0.1, [4]), (0.62, [4]), (0.63, [4, 0]), (0.9, [4, 0, 1]), (0.95, [4, 0, 1, 2]), (0.999, [4, 0, 1, 2, 3])],
)
def test_top_p_keeps_the_smallest_set_reaching_the_mass(top_p, kept):
    base = softmax(LOGITS[0])  # by mass: 4 (.624), 0 (.229), 1 (.084), 2 (.051), 3 (.011)
    probs = process_logits(LOGITS[0], SamplingParams(temperature=1.0, top_p=top_p))
    expected = np.zeros(5)
    expected[kept] = base[kept] / base[kept].sum()
    np.testing.assert_allclose(probs, expected, rtol=1e-12)


def test_top_k_then_top_p():
    probs = process_logits(LOGITS[0], SamplingParams(temperature=1.0, top_k=3, top_p=0.75))
    within_k = softmax(np.array([2.0, 1.0, 3.0]))  # tokens 0, 1, 4 -> .245, .090, .665
    assert within_k[2] < 0.75 < within_k[2] + within_k[0]
    expected = np.zeros(5)
    expected[[0, 4]] = within_k[[0, 2]] / within_k[[0, 2]].sum()
    np.testing.assert_allclose(probs, expected, rtol=1e-12)


def test_minus_inf_logits_are_zero_probability_and_large_logits_are_stable():
    probs = process_logits(np.array([[1000.0, -np.inf, 999.0, -np.inf]]), SamplingParams(temperature=1.0))
    assert np.isfinite(probs).all()
    np.testing.assert_allclose(probs[0], [1 / (1 + np.e**-1), 0, np.e**-1 / (1 + np.e**-1), 0], rtol=1e-12)


@pytest.mark.parametrize(
    "logits,message",
    [
        (np.array([[1.0, np.nan]]), "NaN"),
        (np.array([[1.0, np.inf]]), r"\+inf"),
        (np.array([[-np.inf, -np.inf]]), "entirely -inf"),
        (np.zeros((2, 3, 4)), r"\[n, vocab\]"),
    ],
)
def test_invalid_logits(logits, message):
    with pytest.raises(ValueError, match=message):
        process_logits(logits, SamplingParams(temperature=1.0))


@pytest.mark.parametrize(
    "sampling,message",
    [
        (SamplingParams(temperature=-0.5), r"temperature = -0.5 is invalid"),
        (SamplingParams(temperature=float("nan")), r"temperature = nan is invalid"),
        (SamplingParams(temperature=1.0, top_k=-1), r"top_k = -1 is invalid"),
        (SamplingParams(temperature=1.0, top_p=0.0), r"top_p = 0.0 is invalid: use a number in \(0, 1\]"),
        (SamplingParams(temperature=1.0, top_p=1.5), r"top_p = 1.5 is invalid"),
        (SamplingParams(temperature=1.0, seed=-3), r"seed = -3 is invalid"),
    ],
)
def test_validate_sampling(sampling, message):
    with pytest.raises(RequestError, match=message):
        validate_sampling(sampling)


def test_validate_sampling_accepts_good_params():
    validate_sampling(SamplingParams(temperature=0.7, top_k=50, top_p=0.9, seed=0))


def test_sample_rows_matches_the_distribution_and_skips_zero_mass():
    probs = np.array([0.0, 0.5, 0.0, 0.3, 0.2, 0.0])
    n = 50000
    draws = sample_rows(np.tile(probs, (n, 1)), np.random.default_rng(0))
    shares = np.bincount(draws, minlength=6) / n
    assert shares[0] == shares[2] == shares[5] == 0.0
    np.testing.assert_allclose(shares, probs, atol=4 * np.sqrt(0.25 / n))


def test_sample_rows_accepts_unnormalised_rows_and_is_seeded():
    rows = np.array([[0.0, 2.0, 0.0], [3.0, 0.0, 0.0]])
    assert sample_rows(rows, np.random.default_rng(1)).tolist() == [1, 0]
    probs = np.full(7, 1 / 7)
    assert sample(probs, np.random.default_rng(5)) == sample(probs, np.random.default_rng(5))
    with pytest.raises(ValueError, match="no probability mass"):
        sample_rows(np.zeros((1, 3)), np.random.default_rng(0))


def test_sample_rows_never_returns_past_the_last_nonzero_token():
    class MaxUniform:  # a generator whose uniforms are the largest double below 1
        def random(self, n):
            return np.full(n, np.nextafter(1.0, 0.0))

    rows = np.array([[0.1, 0.2, 0.7, 0.0, 0.0]])
    assert sample_rows(rows, MaxUniform()).tolist() == [2]


def test_each_row_is_processed_on_its_own():
    """Two rows of different scale: the max, the sums and the nucleus are per row (a whole-array one would mix them)."""
    logits = np.array([[0.0, 1.0, 2.0, 3.0], [40.0, 0.0, 0.0, 0.0]])
    for sampling in (SamplingParams(temperature=1.0), SamplingParams(temperature=1.0, top_p=0.9)):
        probs = process_logits(logits, sampling)
        assert probs.sum(axis=1) == pytest.approx([1.0, 1.0])
        assert probs[0] == pytest.approx(process_logits(logits[0], sampling))
        assert probs[1] == pytest.approx(process_logits(logits[1], sampling))


def test_top_k_at_its_edges_one_and_the_vocabulary():
    logits = np.array([0.0, 1.0, 2.0, 3.0])
    assert process_logits(logits, SamplingParams(temperature=1.0, top_k=1)).tolist() == [0.0, 0.0, 0.0, 1.0]
    every = process_logits(logits, SamplingParams(temperature=1.0, top_k=4))
    assert every == pytest.approx(process_logits(logits, SamplingParams(temperature=1.0)))
    assert (every > 0).all()


def test_bad_logits_are_refused_in_these_words():
    cases = [
        (np.zeros((2, 0)), "logits must be [n, vocab] with vocab > 0, got shape (2, 0)"),
        (np.zeros((1, 2, 3)), "logits must be [n, vocab] with vocab > 0, got shape (1, 2, 3)"),
        (np.array([[0.0, np.nan]]), "logits contain NaN or +inf: the model produced invalid scores"),
        (np.array([[0.0, -np.inf], [-np.inf, -np.inf]]), "a logits row is entirely -inf: no token can be produced"),
    ]
    for logits, message in cases:
        with pytest.raises(ValueError) as err:
            process_logits(logits, SamplingParams(temperature=1.0))
        assert str(err.value) == message
    assert process_logits(np.array([[5.0]]), SamplingParams(temperature=1.0)).tolist() == [[1.0]]  # a vocab of one
    # one -inf per row, but no row all -inf: fine
    assert process_logits(np.array([[0.0, -np.inf], [-np.inf, 0.0]]), SamplingParams(temperature=1.0)).tolist() == [
        [1.0, 0.0],
        [0.0, 1.0],
    ]
    with pytest.raises(ValueError) as err:
        sample_rows(np.array([[0.0, 0.0]]), np.random.default_rng(0))
    assert str(err.value) == "cannot sample from a row with no probability mass"


def test_a_draw_that_rounds_up_to_the_total_takes_the_last_token_with_mass():
    class Top:
        def random(self, n):
            return np.full(n, 1.0)  # u * total == total: past every cdf entry

    probs = np.array([[0.2, 0.8, 0.0, 0.0], [0.0, 0.0, 0.5, 0.5], [0.0, 0.0, 0.0, 1.0]])
    assert sample_rows(probs, Top()).tolist() == [1, 3, 3]


def test_top_p_keeps_a_token_whose_mass_before_is_exactly_top_p_out():
    """The nucleus stops where the mass before a token reaches top_p: [0.5, 0.25, 0.25] at top_p 0.5 keeps the first
    token only (the second's mass before it is exactly 0.5)."""
    logits = np.log(np.array([0.5, 0.25, 0.25]))
    probs = process_logits(logits, SamplingParams(temperature=1.0, top_p=0.5))
    assert probs.tolist() == [1.0, 0.0, 0.0]


def test_top_p_one_is_off_even_where_the_running_mass_rounds_to_one():
    """top_p = 1 keeps every token with mass, the tail too, although the mass before it rounds to exactly 1.0."""
    probs = process_logits(np.array([0.0, -50.0]), SamplingParams(temperature=1.0, top_p=1.0))
    assert probs[1] > 0.0 and probs.shape == (2,)  # a single row comes back as a row


def test_ties_enter_the_nucleus_lowest_index_first():
    """Equal probabilities are ordered by index (a stable sort): half of 64 equal tokens is the first 32."""
    probs = process_logits(np.zeros(64), SamplingParams(temperature=1.0, top_p=0.5))
    assert np.flatnonzero(probs).tolist() == list(range(32))


def test_logits_of_any_number_type_give_float64_probabilities():
    for logits in (np.array([1, 5, 2]), [1, 5, 2], np.array([1, 5, 2], np.float16)):
        for sampling in (SamplingParams(), SamplingParams(temperature=1.0)):
            assert process_logits(logits, sampling).dtype == np.float64


def test_rows_far_apart_in_scale_are_each_stable():
    """Each row is shifted by its own max: a row 1000 below another does not underflow to nothing."""
    probs = process_logits(np.array([[1000.0, 0.0], [0.0, 1.0]]), SamplingParams(temperature=1.0))
    assert np.isfinite(probs).all() and probs.sum(axis=1) == pytest.approx([1.0, 1.0])
    assert probs[1] == pytest.approx(softmax(np.array([0.0, 1.0])))


@pytest.mark.parametrize(
    "sampling,message",
    [
        (SamplingParams(temperature=1.0, top_k=2.5), r"top_k = 2.5 is invalid"),
        (SamplingParams(temperature=1.0, seed=1.5), r"seed = 1.5 is invalid"),
        (SamplingParams(temperature=1.0, top_k=True), r"top_k = True is invalid"),
    ],
)
def test_validate_sampling_wants_integers(sampling, message):
    with pytest.raises(RequestError, match=message):
        validate_sampling(sampling)
