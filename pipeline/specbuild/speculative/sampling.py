"""Turn logits into the distributions that drafting, sampling and the acceptance rule use.

Temperature, top-k and top-p are applied by the same function to the target's logits (p) and the
drafter's logits (q), so the acceptance rule compares like with like (Leviathan et al. 2023,
arXiv 2211.17192, section 3; the rule is exact for whatever p the target samples from).

Order, as in Hugging Face and TensorRT-LLM: temperature, then top-k on the logits, then top-p on
the probabilities. Greedy (temperature 0 or top_k 1) gives a one-hot row at the argmax (first
index on ties, like `np.argmax`). All math is float64 with a max-subtracted softmax, so rows with
`-inf` entries (padded vocabulary rows) are fine.
"""

from __future__ import annotations

import numpy as np

from specbuild.errors import RequestError
from specbuild.speculative.interfaces import SamplingParams

__all__ = ["process_logits", "sample", "sample_rows", "validate_sampling"]


def validate_sampling(sampling: SamplingParams) -> None:
    """Raise RequestError for a temperature, top_k or top_p no sampler can use."""
    t, k, p = sampling.temperature, sampling.top_k, sampling.top_p
    if not np.isfinite(t) or t < 0:
        raise RequestError(f"temperature = {t!r} is invalid: use 0 (greedy) or a positive number such as 0.7.")
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 0:
        raise RequestError(f"top_k = {k!r} is invalid: use 0 (off) or a positive integer such as 50.")
    if not np.isfinite(p) or not 0.0 < p <= 1.0:
        raise RequestError(f"top_p = {p!r} is invalid: use a number in (0, 1]; 1 turns it off.")
    seed = sampling.seed
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0):
        raise RequestError(f"seed = {seed!r} is invalid: use a non-negative integer, or leave it unset.")


def process_logits(logits: np.ndarray, sampling: SamplingParams) -> np.ndarray:
    """Probabilities after temperature, top-k and top-p.

    logits: [n, vocab] (a single [vocab] row is accepted and returned as [vocab]).
    Returns float64 probs of the same shape; every row sums to 1.
    """
    x = np.asarray(logits, dtype=np.float64)
    single = x.ndim == 1
    if single:
        x = x[None, :]
    if x.ndim != 2 or x.shape[1] == 0:
        raise ValueError(f"logits must be [n, vocab] with vocab > 0, got shape {np.shape(logits)}")
    if np.isnan(x).any() or (x == np.inf).any():
        raise ValueError("logits contain NaN or +inf: the model produced invalid scores")
    if (x == -np.inf).all(axis=1).any():
        raise ValueError("a logits row is entirely -inf: no token can be produced")
    vocab = x.shape[1]

    if sampling.greedy:
        probs = np.zeros_like(x)
        probs[np.arange(x.shape[0]), np.argmax(x, axis=1)] = 1.0
        return probs[0] if single else probs

    x = x / sampling.temperature
    if 0 < sampling.top_k < vocab:
        # Keep every logit >= the k-th largest (ties at the boundary are all kept).
        kth = np.partition(x, vocab - sampling.top_k, axis=1)[:, vocab - sampling.top_k]
        x = np.where(x >= kth[:, None], x, -np.inf)
    x = x - x.max(axis=1, keepdims=True)
    probs = np.exp(x)
    probs /= probs.sum(axis=1, keepdims=True)

    if sampling.top_p < 1.0:
        # Keep the smallest prefix of tokens (most likely first) whose mass reaches top_p:
        # a token stays when the mass strictly before it is still below top_p.
        order = np.argsort(-probs, axis=1, kind="stable")
        sorted_probs = np.take_along_axis(probs, order, axis=1)
        mass_before = np.cumsum(sorted_probs, axis=1) - sorted_probs
        keep_sorted = mass_before < sampling.top_p
        keep = np.zeros_like(keep_sorted)
        np.put_along_axis(keep, order, keep_sorted, axis=1)
        probs = np.where(keep, probs, 0.0)
        probs /= probs.sum(axis=1, keepdims=True)
    return probs[0] if single else probs


def sample_rows(probs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One token per row by inverse CDF; a zero-probability token is never drawn.

    probs: [n, vocab], non-negative, rows need not be normalised (each must have positive mass).
    Returns [n] int64 token ids. Consumes exactly n uniforms from rng.
    """
    p = np.asarray(probs, dtype=np.float64)
    cdf = np.cumsum(p, axis=1)  # [n, vocab]
    total = cdf[:, -1]
    if not (total > 0).all():
        raise ValueError("cannot sample from a row with no probability mass")
    u = rng.random(p.shape[0]) * total  # [n]
    idx = (cdf <= u[:, None]).sum(axis=1)
    # u * total can round up to total: fall back to the last token with mass.
    last_nonzero = p.shape[1] - 1 - np.argmax(p[:, ::-1] > 0, axis=1)
    return np.minimum(idx, last_nonzero).astype(np.int64)


def sample(probs: np.ndarray, rng: np.random.Generator) -> int:
    """One token from probs: [vocab]."""
    return int(sample_rows(np.asarray(probs)[None, :], rng)[0])
