"""The acceptance rule as a table of hand-built distributions (greedy and sampling)."""

from __future__ import annotations

import numpy as np
import pytest

from specbuild.speculative.acceptance import accept_greedy, accept_sampling, accept_sampling_batch

V = 5  # vocabulary of the hand-built cases


def onehot(*tokens: int) -> np.ndarray:
    out = np.zeros((len(tokens), V))
    out[np.arange(len(tokens)), tokens] = 1.0
    return out


def logits_for(*argmaxes: int) -> np.ndarray:
    """[len, V] logits whose row i has its argmax at argmaxes[i] (other entries distinct)."""
    rows = np.tile(np.linspace(0.0, 1.0, V), (len(argmaxes), 1))
    rows[np.arange(len(argmaxes)), argmaxes] = 5.0
    return rows


# --- greedy -----------------------------------------------------------------------------------

GREEDY_TABLE = [
    # id, draft, target argmax per position (k + 1), accepted, tokens
    ("perfect match -> bonus", [1, 2, 3], [1, 2, 3, 4], 3, [1, 2, 3, 4]),
    ("mismatch at position 0", [1, 2, 3], [0, 2, 3, 4], 0, [0]),
    ("mismatch in the middle", [1, 2, 3], [1, 0, 3, 4], 1, [1, 0]),
    ("mismatch at the last position", [1, 2, 3], [1, 2, 0, 4], 2, [1, 2, 0]),
    ("K = 1 accepted", [3], [3, 1], 1, [3, 1]),
    ("K = 1 rejected", [3], [2, 1], 0, [2]),
    ("empty draft = plain step", [], [4], 0, [4]),
    ("EOS (4) inside the draft is an ordinary token", [1, 4, 2], [1, 4, 2, 0], 3, [1, 4, 2, 0]),
    ("later positions cannot rescue an early mismatch", [1, 2, 3], [2, 2, 3, 4], 0, [2]),
]


@pytest.mark.parametrize("case,draft,target,accepted,tokens", GREEDY_TABLE, ids=[c[0] for c in GREEDY_TABLE])
def test_accept_greedy_table(case, draft, target, accepted, tokens):
    result = accept_greedy(draft, logits_for(*target))
    assert result.accepted == accepted
    assert result.tokens == tokens
    assert len(result.tokens) == result.accepted + 1


def test_accept_greedy_uses_first_index_on_ties():
    logits = np.array([[1.0, 3.0, 3.0, 0.0, 0.0], [0.0, 0.0, 2.0, 2.0, 0.0]])
    assert accept_greedy([2], logits) == (0, [1])
    assert accept_greedy([1], logits) == (1, [1, 2])


# --- sampling: deterministic cases (the outcome has probability 1) ------------------------------

SAMPLING_TABLE = [
    # id, draft, q rows, p rows (k + 1), accepted, tokens
    ("p == q -> all accepted, bonus from p[k]", [1, 2], onehot(1, 2), onehot(1, 2, 3), 2, [1, 2, 3]),
    (
        "p(x) > q(x) always accepts",
        [1],
        np.array([[0.5, 0.2, 0.1, 0.1, 0.1]]),
        np.vstack([[0.0, 0.9, 0.1, 0.0, 0.0], onehot(4)]),
        1,
        [1, 4],
    ),
    (
        "mismatch at position 0: p(x) = 0 rejects, recovered from max(0, p - q)",
        [1, 2],
        np.array([[0.2, 0.8, 0.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0, 0.0]]),
        np.vstack([[0.0, 0.0, 1.0, 0.0, 0.0], onehot(2), onehot(3)]),
        0,
        [2],
    ),
    (
        "mismatch in the middle",
        [1, 2, 3],
        np.vstack([onehot(1), [[0.5, 0.0, 0.5, 0.0, 0.0]], onehot(3)]),
        np.vstack([onehot(1), [[0.6, 0.0, 0.0, 0.4, 0.0]], onehot(3), onehot(0)]),
        1,
        # residual max(0, p - q) = [0.1, 0, 0, 0.4, 0] -> token 0 or 3; see the seeded check below
        None,
    ),
    (
        "mismatch at the last position",
        [1, 2, 3],
        onehot(1, 2, 3),
        np.vstack([onehot(1), onehot(2), [[0.0, 0.0, 0.0, 0.0, 1.0]], onehot(0)]),
        2,
        [1, 2, 4],
    ),
    ("K = 1 rejected", [0], onehot(0), np.vstack([[0.0, 1.0, 0.0, 0.0, 0.0], onehot(2)]), 0, [1]),
    ("empty draft = plain step from p[0]", [], np.zeros((0, V)), onehot(3), 0, [3]),
    ("EOS (4) inside the draft is an ordinary token", [4, 1], onehot(4, 1), onehot(4, 1, 2), 2, [4, 1, 2]),
]


@pytest.mark.parametrize("case,draft,q,p,accepted,tokens", SAMPLING_TABLE, ids=[c[0] for c in SAMPLING_TABLE])
def test_accept_sampling_table(case, draft, q, p, accepted, tokens):
    for seed in range(20):  # the outcome must not depend on the random draws
        result = accept_sampling(draft, q, p, np.random.default_rng(seed))
        assert result.accepted == accepted
        if tokens is not None:
            assert result.tokens == tokens
        else:
            assert result.tokens[:accepted] == draft[:accepted]
            assert result.tokens[accepted] in (0, 3)  # the support of max(0, p - q)
        assert len(result.tokens) == result.accepted + 1


def test_recovered_token_follows_the_residual_distribution():
    # Middle-mismatch case: residual max(0, p - q) = [0.1, 0, 0, 0.4, 0] -> P(0) = 0.2, P(3) = 0.8.
    _, _, q, p, _, _ = SAMPLING_TABLE[3]
    n = 20000
    draft = np.tile([1, 2, 3], (n, 1))
    accepted, tokens = accept_sampling_batch(
        draft, np.tile(q, (n, 1, 1)), np.tile(p, (n, 1, 1)), np.random.default_rng(0)
    )
    assert (accepted == 1).all()
    share_of_0 = np.mean(tokens[:, 1] == 0)
    assert abs(share_of_0 - 0.2) < 4 * np.sqrt(0.2 * 0.8 / n)
    assert set(np.unique(tokens[:, 1])) == {0, 3}


@pytest.mark.parametrize("p_x,q_x", [(0.3, 0.6), (0.1, 0.5), (0.45, 0.5), (0.7, 0.7), (0.9, 0.2)])
def test_acceptance_probability_is_min_one_p_over_q(p_x, q_x):
    n = 40000
    q = np.full((n, 1, V), (1 - q_x) / (V - 1))
    q[:, 0, 2] = q_x
    p = np.full((n, 2, V), (1 - p_x) / (V - 1))
    p[:, 0, 2] = p_x
    accepted, _ = accept_sampling_batch(np.full((n, 1), 2), q, p, np.random.default_rng(1))
    expected = min(1.0, p_x / q_x)
    assert abs(accepted.mean() - expected) <= 4 * np.sqrt(expected * (1 - expected) / n) + 1e-12


def test_deterministic_drafter_q_none_accepts_with_p_and_recovers_without_the_draft_token():
    n = 40000
    p_row = np.array([0.1, 0.3, 0.2, 0.4, 0.0])
    p = np.tile(np.vstack([p_row, onehot(0)]), (n, 1, 1))
    accepted, tokens = accept_sampling_batch(np.full((n, 1), 1), None, p, np.random.default_rng(2))
    assert abs(accepted.mean() - 0.3) < 4 * np.sqrt(0.3 * 0.7 / n)
    recovered = tokens[accepted == 0, 0]
    assert 1 not in recovered and 4 not in recovered  # the draft token and a zero-probability token
    shares = np.bincount(recovered, minlength=V) / recovered.size
    np.testing.assert_allclose(shares[[0, 2, 3]], np.array([0.1, 0.2, 0.4]) / 0.7, atol=0.015)


def test_single_and_batch_agree_and_are_seeded():
    rng = np.random.default_rng(3)
    k = 4
    q = rng.dirichlet(np.ones(V), size=k)
    p = rng.dirichlet(np.ones(V), size=k + 1)
    draft = [0, 3, 1, 2]
    single = accept_sampling(draft, q, p, np.random.default_rng(7))
    accepted, tokens = accept_sampling_batch(np.array([draft]), q[None], p[None], np.random.default_rng(7))
    assert single.accepted == accepted[0]
    assert single.tokens == tokens[0, : single.accepted + 1].tolist()
    assert (tokens[0, single.accepted + 1 :] == -1).all()
    runs = {tuple(accept_sampling(draft, q, p, np.random.default_rng(s)).tokens) for s in range(40)}
    assert len(runs) > 1  # different seeds explore different outcomes
    assert accept_sampling(draft, q, p, np.random.default_rng(11)) == accept_sampling(
        draft, q, p, np.random.default_rng(11)
    )


def test_never_emits_a_zero_probability_token():
    rng = np.random.default_rng(4)
    n, k = 5000, 3
    p = rng.dirichlet(np.ones(V), size=(n, k + 1))
    p[..., 4] = 0.0  # token 4 is masked out by the target (e.g. top-k)
    p /= p.sum(axis=-1, keepdims=True)
    q = rng.dirichlet(np.ones(V), size=(n, k))
    draft = np.stack([np.array([rng.choice(V, p=row) for row in q[:, i]]) for i in range(k)], axis=1)
    accepted, tokens = accept_sampling_batch(draft, q, p, rng)
    emitted = np.concatenate([tokens[b, : accepted[b] + 1] for b in range(n)])
    assert 4 not in emitted


@pytest.mark.parametrize(
    "draft,q,p,message",
    [
        ([1, 2], onehot(1, 2), onehot(1, 2), r"must be \[batch, k \+ 1, vocab\] = \[1, 3, vocab\], got \(1, 2, 5\)"),
        ([1, 2], onehot(1), onehot(1, 2, 3), r"must be \[batch, k, vocab\] = \[1, 2, 5\], got \(1, 1, 5\)"),
        ([1, 9], onehot(1, 2), onehot(1, 2, 3), r"draft token ids must lie in \[0, 5\)"),
        ([1, 5], onehot(1, 2), onehot(1, 2, 3), r"draft token ids must lie in \[0, 5\), got \[\[1, 5\]\]"),  # = vocab
    ],
)
def test_shape_errors(draft, q, p, message):
    with pytest.raises(ValueError, match=message):
        accept_sampling(draft, q, p, np.random.default_rng(0))


def test_empty_draft_ignores_whatever_q_is_passed():
    p = np.array([[0.0, 0.0, 1.0, 0.0, 0.0]])
    for q in (None, [], np.zeros((0, V))):
        assert accept_sampling([], q, p, np.random.default_rng(0)) == (0, [2])


def test_greedy_shape_error():
    with pytest.raises(ValueError, match=r"k \+ 1"):
        accept_greedy([1, 2, 3], logits_for(1, 2))


def test_a_rejection_whose_residual_rounds_to_nothing_recovers_from_the_target_distribution():
    """norm(max(0, p - q)) is empty where q >= p at every token (p == q up to rounding, or a drafter whose q does not
    sum to 1): the recovered token then comes from p itself, never from a row with no mass (an error)."""
    batch = 4000
    draft = np.ones((batch, 1), dtype=np.int64)
    p = np.tile(np.array([[0.3, 0.7], [0.5, 0.5]]), (batch, 1, 1))  # [batch, k + 1, vocab]
    q = np.tile(np.array([[0.6, 0.9]]), (batch, 1, 1))  # >= p everywhere: p - q has no positive part
    accepted, tokens = accept_sampling_batch(draft, q, p, np.random.default_rng(0))
    rejected = accepted == 0
    assert 0.15 < rejected.mean() < 0.3  # P(reject) = 1 - 0.7 / 0.9
    recovered = tokens[rejected, 0]
    assert set(recovered.tolist()) == {0, 1} and 0.25 < (recovered == 0).mean() < 0.35  # drawn from p = [0.3, 0.7]


class Zeros:
    """An rng whose uniforms are all exactly 0: the edge of the acceptance test u * q(x) < p(x)."""

    def random(self, shape):
        return np.zeros(shape)


def test_a_token_the_target_gives_no_probability_is_never_accepted_even_at_u_0():
    """u * q(x) < p(x) is strict: with p(x) = 0 a draft token is rejected even when the uniform is exactly 0 (a rule
    written with <= would accept it, emitting a token the target never samples)."""
    p = np.array([[[0.0, 1.0, 0.0, 0.0, 0.0], [0.2, 0.2, 0.2, 0.2, 0.2]]])  # [batch, k + 1, vocab]
    q = np.array([[[1.0, 0.0, 0.0, 0.0, 0.0]]])
    accepted, tokens = accept_sampling_batch(np.array([[0]]), q, p, Zeros())
    assert accepted.tolist() == [0] and tokens[0, 0] == 1  # rejected; recovered from max(p - q, 0) = token 1
