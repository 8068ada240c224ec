"""Speculative sampling reproduces the target's distribution exactly; wrong rules are caught.

Method: the toy n-gram target gives the exact probability of every N-token continuation. We draw
many speculative samples (fixed seeds), count each continuation, and run a chi-square
goodness-of-fit test (cells with expected count < 5 pooled). A correct sampler must give
p-value > 1e-3; the same test must give p-value < 1e-6 for deliberately wrong acceptance rules.

Test A (>= 200k samples, vectorised): one speculative step through the real batched acceptance
rule, then the sequence is completed to N = K + 1 tokens by plain target sampling. If the step is
exact, the N tokens follow the target's joint distribution, so every accepted, recovered and
bonus position is checked at once.
Test B (loop level): the same check through `loop.run` with the toy Drafter/Verifier, covering
seed derivation, q passing and truncation; fewer samples because each is a Python-level request.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy import stats as scipy_stats
from toy_model import NGramModel, ToyDrafter, ToyVerifier, random_model

from specbuild.speculative.acceptance import accept_sampling_batch
from specbuild.speculative.interfaces import SamplingParams, Verification
from specbuild.speculative.loop import GenerationRequest, run
from specbuild.speculative.sampling import process_logits, sample_rows

PROMPT = [2, 3]
P_CORRECT, P_WRONG = 1e-3, 1e-6


def pair(vocab: int) -> tuple[NGramModel, NGramModel]:
    """A bigram target and a drafter that only partly agrees with it (acceptance ~0.5-0.7)."""
    target = random_model(vocab, order=2, scale=1.5, seed=10)
    noise = random_model(vocab, order=2, scale=1.5, seed=11)
    return target, NGramModel(0.6 * target.table + 0.8 * noise.table)


def exact_joint(target: NGramModel, prompt: list[int], n: int, sampling: SamplingParams) -> np.ndarray:
    """[vocab] * n probabilities of every n-token continuation."""
    vocab = target.vocab
    joint = np.zeros((vocab,) * n)
    for seq in itertools.product(range(vocab), repeat=n):
        prob, ctx = 1.0, list(prompt)
        for t in seq:
            prob *= process_logits(target.logits(ctx), sampling)[t]
            ctx.append(t)
        joint[seq] = prob
    return joint


def chi_square_pvalue(samples: np.ndarray, joint: np.ndarray) -> float:
    """samples [n, len]: goodness of fit against joint ([vocab] * len), pooling cells with expected < 5."""
    n = samples.shape[0]
    counts = np.bincount(np.ravel_multi_index(samples.T, joint.shape), minlength=joint.size).astype(float)
    expected = joint.ravel() * n
    assert counts[expected == 0].sum() == 0, "a zero-probability continuation was produced"
    big = expected >= 5
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    keep = exp > 0
    stat = ((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum()
    return float(scipy_stats.chi2.sf(stat, df=keep.sum() - 1))


# --- deliberately wrong rules (same signature as accept_sampling_batch) -------------------------


def accept_always(draft, q, p, rng):
    batch, k = draft.shape
    bonus = sample_rows(p[:, k], rng)
    return np.full(batch, k), np.concatenate([draft, bonus[:, None]], axis=1)


def resample_from_p(draft, q, p, rng):
    """Right acceptance test, wrong recovery: samples the recovered token from p, not max(0, p - q)."""
    batch, k = draft.shape
    rows, cols = np.arange(batch)[:, None], np.arange(k)[None, :]
    keep = rng.random((batch, k)) * q[rows, cols, draft] < p[rows, cols, draft]
    accepted = np.argmin(np.append(keep, np.zeros((batch, 1), bool), axis=1), axis=1)  # first rejection, or k
    extra = sample_rows(p[np.arange(batch), accepted], rng)
    tokens = np.where(cols < accepted[:, None], draft, -1)
    tokens = np.concatenate([tokens, np.full((batch, 1), -1)], axis=1)
    tokens[np.arange(batch), accepted] = extra
    return accepted, tokens


# --- test A: one vectorised speculative step, completed by the target ---------------------------


def speculative_samples(target, drafter, k, sampling, n, seed, rule=accept_sampling_batch, send_q=True):
    """[n, k + 1] tokens: one speculative step of K = k, then plain target sampling to k + 1 tokens."""
    rng = np.random.default_rng(seed)
    ctx = np.tile(PROMPT[-2:], (n, 1))  # [n, 2] the bigram context of each sample
    draft = np.zeros((n, k), dtype=np.int64)
    q = np.zeros((n, k, target.vocab))
    p = np.zeros((n, k + 1, target.vocab))
    for i in range(k + 1):
        p[:, i] = process_logits(target.logits_for(ctx), sampling)
        if i == k:
            break
        q[:, i] = process_logits(drafter.logits_for(ctx), sampling)
        draft[:, i] = sample_rows(q[:, i], rng)
        ctx = np.stack([ctx[:, 1], draft[:, i]], axis=1)
    accepted, tokens = rule(draft, q if send_q else None, p, rng)
    seq = tokens.copy()
    for j in range(1, k + 1):  # complete with the target where the step stopped early
        prev = np.stack([np.full(n, PROMPT[-1]) if j == 1 else seq[:, j - 2], seq[:, j - 1]], axis=1)
        fill = sample_rows(process_logits(target.logits_for(prev), sampling), rng)
        seq[:, j] = np.where(j > accepted, fill, seq[:, j])
    return seq


CASES = [
    ("temperature 1", SamplingParams(temperature=1.0), 6, 2),
    ("temperature 0.7, top-k 4, top-p 0.9", SamplingParams(temperature=0.7, top_k=4, top_p=0.9), 6, 2),
    ("K = 3 on vocab 4", SamplingParams(temperature=1.0), 4, 3),
]


@pytest.mark.parametrize("case,sampling,vocab,k", CASES, ids=[c[0] for c in CASES])
def test_speculative_step_matches_the_target_distribution(case, sampling, vocab, k):
    target, drafter = pair(vocab)
    joint = exact_joint(target, PROMPT, k + 1, sampling)
    seq = speculative_samples(target, drafter, k, sampling, n=200_000, seed=1)
    assert chi_square_pvalue(seq, joint) > P_CORRECT
    assert chi_square_pvalue(seq[:, :1], joint.sum(axis=tuple(range(1, k + 1)))) > P_CORRECT  # first token alone


def test_deterministic_drafter_without_q_is_still_exact():
    sampling = SamplingParams(temperature=1.0)
    target, drafter = pair(6)
    seq = speculative_samples(target, drafter, 2, sampling, n=200_000, seed=2, send_q=False)
    assert chi_square_pvalue(seq, exact_joint(target, PROMPT, 3, sampling)) > P_CORRECT


@pytest.mark.parametrize("rule", [accept_always, resample_from_p], ids=["accept always", "recover from p"])
def test_the_same_test_rejects_a_wrong_rule(rule):
    sampling = SamplingParams(temperature=1.0)
    target, drafter = pair(6)
    seq = speculative_samples(target, drafter, 2, sampling, n=200_000, seed=1, rule=rule)
    assert chi_square_pvalue(seq, exact_joint(target, PROMPT, 3, sampling)) < P_WRONG


def test_the_draft_differs_enough_for_the_test_to_have_power():
    sampling = SamplingParams(temperature=1.0)
    target, drafter = pair(6)
    p = process_logits(target.logits(PROMPT), sampling)
    q = process_logits(drafter.logits(PROMPT), sampling)
    assert 0.5 * np.abs(p - q).sum() > 0.2  # total variation between draft and target


# --- test B: through loop.run ---------------------------------------------------------------------


class WrongVerifier(ToyVerifier):
    """Applies the recover-from-p rule instead of the real one."""

    def verify(self, tokens, draft, sampling):
        logits = self.model.positions(tokens, draft.tokens)
        p = process_logits(logits, sampling)[None]
        q = np.asarray(draft.probs)[None] if draft.tokens else np.zeros((1, 0, p.shape[2]))
        rng = np.random.default_rng(sampling.seed)
        accepted, out = resample_from_p(np.array([draft.tokens], dtype=np.int64).reshape(1, -1), q, p, rng)
        return Verification(int(accepted[0]), out[0, : accepted[0] + 1].tolist())


def loop_samples(verifier_cls, n: int) -> np.ndarray:
    target, drafter = pair(4)
    drafter_, verifier = ToyDrafter(drafter), verifier_cls(target)
    out = np.zeros((n, 3), dtype=np.int64)
    for i in range(n):
        request = GenerationRequest(max_tokens=3, num_draft_tokens=2, sampling=SamplingParams(temperature=1.0, seed=i))
        out[i] = run(PROMPT, drafter_, verifier, request).tokens
    return out


@pytest.mark.slow
def test_loop_output_matches_the_target_distribution():
    target, _ = pair(4)
    joint = exact_joint(target, PROMPT, 3, SamplingParams(temperature=1.0))
    assert chi_square_pvalue(loop_samples(ToyVerifier, 20_000), joint) > P_CORRECT
    assert chi_square_pvalue(loop_samples(WrongVerifier, 10_000), joint) < P_WRONG


@pytest.mark.slow
@pytest.mark.parametrize("bug", ["drafter and verifier share a seed", "every step reuses step 0's seeds"])
def test_loop_level_test_catches_seed_plumbing_bugs(bug, monkeypatch):
    import specbuild.speculative.loop as loop_module

    real = loop_module.derive_seed
    if bug.startswith("drafter"):
        monkeypatch.setattr(loop_module, "derive_seed", lambda seed, step, role: real(seed, step, 0))
    else:
        monkeypatch.setattr(loop_module, "derive_seed", lambda seed, step, role: real(seed, 0, role))
    target, _ = pair(4)
    joint = exact_joint(target, PROMPT, 3, SamplingParams(temperature=1.0))
    assert chi_square_pvalue(loop_samples(ToyVerifier, 10_000), joint) < P_WRONG
