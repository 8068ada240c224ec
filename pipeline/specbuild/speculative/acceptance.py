"""The acceptance rule: which drafted tokens the target keeps, and the one token it adds.

References: Leviathan, Kalman, Matias 2023, "Fast Inference from Transformers via Speculative
Decoding" (arXiv 2211.17192), Algorithm 1; Chen et al. 2023, "Accelerating Large Language Model
Decoding with Speculative Sampling" (arXiv 2302.01318), Algorithm 2.

Vocabulary. The drafter proposed k tokens x_1..x_k, drawn from its distributions q_1..q_k. One
target forward pass over prefix + draft gives k + 1 distributions p_1..p_{k+1} (p_i is the target's
distribution for the token at draft position i given everything before it).

- accepted tokens: the longest prefix x_1..x_a the rule keeps (0 <= a <= k).
- recovered token: when a < k, the target's replacement for the first rejected x_{a+1}.
  Greedy: argmax p_{a+1}. Sampling: drawn from norm(max(0, p_{a+1} - q_{a+1})).
- bonus token: when a = k (everything accepted), one more token from p_{k+1}
  (greedy: its argmax).

Every verification therefore yields a + 1 tokens: the accepted prefix, then one recovered or bonus
token. With an empty draft (k = 0) that is one plain decoding step from p_1.

Greedy rule: accept x_i while x_i == argmax p_i. The output equals target-only greedy decoding.

Sampling rule: accept x_i with probability min(1, p_i(x_i) / q_i(x_i)), one uniform u_i per
position, stopping at the first rejection. Each emitted token is then distributed exactly as p
(given the tokens before it), whatever q is. `q = None` means the drafter was deterministic (a
one-hot q at its own token): acceptance becomes u_i < p_i(x_i) and the recovered token is drawn
from p_i with x_i removed. That is still exact, only accepted less often.

p and q must be processed by the same temperature / top-k / top-p (`sampling.process_logits`).
The rule knows nothing about EOS: an EOS token is accepted or rejected like any other, and the
loop stops the sequence at it.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from specbuild.speculative.sampling import sample_rows

__all__ = ["Acceptance", "accept_greedy", "accept_sampling", "accept_sampling_batch"]


class Acceptance(NamedTuple):
    accepted: int  # number of leading draft tokens kept (0..k)
    tokens: list[int]  # [accepted + 1] the accepted draft tokens, then the recovered or bonus token


def _check_shapes(draft: np.ndarray, p: np.ndarray, q: np.ndarray | None) -> None:
    b, k = draft.shape
    if p.ndim != 3 or p.shape[:2] != (b, k + 1):
        raise ValueError(f"target distributions must be [batch, k + 1, vocab] = [{b}, {k + 1}, vocab], got {p.shape}")
    if q is not None and q.shape != (b, k, p.shape[2]):
        raise ValueError(f"draft distributions must be [batch, k, vocab] = [{b}, {k}, {p.shape[2]}], got {q.shape}")
    if k and (draft.min() < 0 or draft.max() >= p.shape[2]):
        raise ValueError(f"draft token ids must lie in [0, {p.shape[2]}), got {draft.tolist()}")


def accept_greedy(
    draft_tokens: list[int] | np.ndarray,  # [k]
    target_logits: np.ndarray,  # [k + 1, vocab] (logits or probabilities: only the argmax matters)
) -> Acceptance:
    """Accept while the draft matches the target's argmax; then add the target's argmax."""
    draft = np.asarray(draft_tokens, dtype=np.int64).reshape(1, -1)
    logits = np.asarray(target_logits)
    _check_shapes(draft, logits[None], None)
    target = np.argmax(logits, axis=-1)  # [k + 1]
    k = draft.shape[1]
    mismatch = np.flatnonzero(draft[0] != target[:k])
    accepted = int(mismatch[0]) if mismatch.size else k
    return Acceptance(accepted, [int(t) for t in draft[0, :accepted]] + [int(target[accepted])])


def accept_sampling_batch(
    draft_tokens: np.ndarray,  # [batch, k]
    q: np.ndarray | None,  # [batch, k, vocab] draft probabilities, or None: a deterministic drafter
    p: np.ndarray,  # [batch, k + 1, vocab] target probabilities
    rng: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray]:
    """The sampling rule for a batch of independent drafts of the same length k.

    Returns (accepted [batch], tokens [batch, k + 1]): row b's output is tokens[b, :accepted[b] + 1];
    the rest of the row is -1. Consumes batch * k uniforms (acceptance), then batch more (the
    recovered or bonus token), in that order.
    """
    draft = np.asarray(draft_tokens, dtype=np.int64)
    p = np.asarray(p, dtype=np.float64)
    q = None if q is None else np.asarray(q, dtype=np.float64)
    _check_shapes(draft, p, q)
    batch, k = draft.shape
    rows = np.arange(batch)[:, None]  # [batch, 1]
    cols = np.arange(k)[None, :]  # [1, k]

    p_x = p[rows, cols, draft]  # [batch, k] target probability of each drafted token
    q_x = np.ones_like(p_x) if q is None else q[rows, cols, draft]  # [batch, k]
    u = rng.random((batch, k))
    # Accept x with probability min(1, p(x) / q(x)); written without the division, so
    # q(x) >= p(x) accepts with probability p/q and q(x) <= p(x) always accepts (u < 1).
    keep = u * q_x < p_x  # [batch, k]
    if k:
        accepted = np.where(keep.all(axis=1), k, np.argmin(keep, axis=1))  # first rejection, or k
    else:
        accepted = np.zeros(batch, dtype=np.int64)

    p_next = p[np.arange(batch), accepted]  # [batch, vocab] p at the first rejected position (or bonus)
    residual = p_next.copy()
    rejected = accepted < k
    if rejected.any():
        r = np.flatnonzero(rejected)
        if q is None:
            q_rej = np.zeros_like(p_next[r])
            q_rej[np.arange(r.size), draft[r, accepted[r]]] = 1.0
        else:
            q_rej = q[r, accepted[r]]
        # Recovered token: from norm(max(0, p - q)). If rounding left that empty (p == q up to
        # float error, where rejection has ~zero probability), p itself is the right distribution.
        diff = np.maximum(p_next[r] - q_rej, 0.0)
        empty = diff.sum(axis=1) <= 0.0
        residual[r] = np.where(empty[:, None], p_next[r], diff)
    extra = sample_rows(residual, rng)  # [batch] recovered or bonus tokens

    tokens = np.full((batch, k + 1), -1, dtype=np.int64)
    tokens[:, :k] = np.where(cols < accepted[:, None], draft, -1)
    tokens[np.arange(batch), accepted] = extra
    return accepted.astype(np.int64), tokens


def accept_sampling(
    draft_tokens: list[int] | np.ndarray,  # [k]
    q: np.ndarray | None,  # [k, vocab] draft probabilities, or None: a deterministic drafter
    p: np.ndarray,  # [k + 1, vocab] target probabilities
    rng: np.random.Generator,
) -> Acceptance:
    """The sampling rule for one draft (see the module docstring)."""
    draft = np.asarray(draft_tokens, dtype=np.int64).reshape(1, -1)
    q_batch = None if q is None or draft.shape[1] == 0 else np.asarray(q)[None]  # no q is needed for an empty draft
    accepted, tokens = accept_sampling_batch(draft, q_batch, np.asarray(p)[None], rng)
    a = int(accepted[0])
    return Acceptance(a, [int(t) for t in tokens[0, : a + 1]])
