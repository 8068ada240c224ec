"""A tiny numpy "language model" implementing Drafter and Verifier, for tests and demos.

The model's next-token logits are a table lookup on the last `order` tokens (an n-gram table of
shape [vocab] * order + [vocab]), so its exact distribution over any continuation is known and
cheap to compute. It needs no torch and no weights, which makes it the reference point for the
loop's statistical tests and for exercising transports (e.g. the Triton BLS) without a model.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from specbuild.speculative.acceptance import accept_greedy, accept_sampling
from specbuild.speculative.interfaces import Draft, SamplingParams, Verification
from specbuild.speculative.sampling import process_logits, sample

__all__ = ["NGramModel", "ToyDrafter", "ToyVerifier", "random_model"]


@dataclass(frozen=True)
class NGramModel:
    table: np.ndarray  # [vocab] * order + [vocab] logits indexed by the last `order` tokens

    @property
    def order(self) -> int:
        return self.table.ndim - 1

    @property
    def vocab(self) -> int:
        return self.table.shape[-1]

    def logits(self, context: Sequence[int]) -> np.ndarray:
        """Next-token logits [vocab] after `context` (shorter contexts are left-padded with token 0)."""
        last = [0] * max(0, self.order - len(context)) + [int(t) for t in context[-self.order :]]
        return self.table[tuple(last)]

    def logits_for(self, contexts: np.ndarray) -> np.ndarray:
        """Vectorised lookup: contexts [n, order] (the last `order` tokens of each) -> logits [n, vocab]."""
        return self.table[tuple(np.asarray(contexts, dtype=np.int64).T)]

    def positions(self, context: Sequence[int], continuation: Sequence[int]) -> np.ndarray:
        """Logits [len(continuation) + 1, vocab]: one forward pass over context + continuation."""
        seq = list(context)
        rows = [self.logits(seq)]
        for t in continuation:
            seq.append(int(t))
            rows.append(self.logits(seq))
        return np.stack(rows)


def random_model(vocab: int, order: int = 2, scale: float = 2.0, seed: int = 0) -> NGramModel:
    """Gaussian logits table with standard deviation `scale` (higher = more peaked distributions)."""
    rng = np.random.default_rng(seed)
    return NGramModel(rng.normal(0.0, scale, size=(vocab,) * order + (vocab,)))


class ToyDrafter:
    """Drafts token by token from an NGramModel; stops after end_id."""

    def __init__(self, model: NGramModel, end_id: int | None = None, send_probs: bool = True):
        self.model = model
        self.end_id = end_id
        self.send_probs = send_probs  # False: act like a drafter that returns no q (the verifier treats q as one-hot)
        self.calls = 0

    def propose(self, tokens: list[int], k: int, sampling: SamplingParams) -> Draft:
        t0 = time.perf_counter()
        self.calls += 1
        rng = np.random.default_rng(sampling.seed)
        seq, out, probs = list(tokens), [], []
        for _ in range(k):
            q = process_logits(self.model.logits(seq), sampling)  # [vocab]
            token = int(np.argmax(q)) if sampling.greedy else sample(q, rng)
            out.append(token)
            probs.append(q)
            seq.append(token)
            if token == self.end_id:
                break
        send = self.send_probs and not sampling.greedy and out
        return Draft(out, np.stack(probs) if send else None, time.perf_counter() - t0)


class ToyVerifier:
    """Scores context + draft with an NGramModel and applies the acceptance rule."""

    def __init__(self, model: NGramModel, max_draft_len: int = 8):
        self.model = model
        self.max_draft_len = max_draft_len
        self.calls = 0

    def verify(self, tokens: list[int], draft: Draft, sampling: SamplingParams) -> Verification:
        t0 = time.perf_counter()
        self.calls += 1
        logits = self.model.positions(tokens, draft.tokens)  # [k + 1, vocab]
        if sampling.greedy:
            accepted, out = accept_greedy(draft.tokens, logits)
        else:
            p = process_logits(logits, sampling)  # [k + 1, vocab]
            accepted, out = accept_sampling(draft.tokens, draft.probs, p, np.random.default_rng(sampling.seed))
        return Verification(accepted, out, time.perf_counter() - t0)
