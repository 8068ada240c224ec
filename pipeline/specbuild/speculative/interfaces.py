"""The two small interfaces the draft/verify loop runs against, and the data they exchange.

Vocabulary (used the same way in names, tensors, --json keys, metrics and reports):
- K / num_draft_tokens: how many tokens the drafter is asked to propose in one step.
- drafted: tokens proposed; accepted: drafted tokens the verifier kept.
- recovered token: the verifier's own token at the first rejected position
  (greedy: the target's argmax; sampling: drawn from norm(max(0, p - q))).
- bonus token: the verifier's extra token when every drafted token was accepted.
- acceptance_rate = accepted / drafted; mean_accepted_len = (accepted + verify steps) / verify steps,
  i.e. tokens produced per target step, bonus/recovered token included.
- early draft (the overlapped schedule, loop.py): the next step's draft, proposed while the target
  verifies this one, continuing from context + draft + g where g (the guess) is the drafter's top
  token after the draft. It is used (a hit) when the target accepts the whole draft and its bonus
  token is g; otherwise it is discarded (a miss).

Implementations: the reference runtime (PyTorch, in-process) and the Triton BLS model (which
calls the `tensorrt_llm_draft` and `tensorrt_llm` models, TensorRT-LLM engines or reference models).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0 or self.top_k == 1


@dataclass
class Draft:
    tokens: list[int]  # [k] proposed token ids (k may be < the K asked: EOS or budget)
    probs: np.ndarray | None = None  # [k, vocab] q: the drafter's (processed) distributions; None when greedy
    seconds: float = 0.0  # wall time spent drafting
    source: str = "model"  # which drafter proposed it: "model" (a draft model) or "lookup" (speculative.lookup)
    failure: str | None = None  # why the drafter could not propose (speculative.fallback): a target-only step


@dataclass
class Verification:
    accepted: int  # how many leading draft tokens were accepted (0..k)
    tokens: list[int]  # [accepted + 1] accepted draft tokens, then the recovered or bonus token
    seconds: float = 0.0  # wall time of the target forward pass


class Drafter(Protocol):
    def propose(self, tokens: list[int], k: int, sampling: SamplingParams) -> Draft:
        """Propose up to k tokens continuing `tokens` (prompt + accepted output so far)."""
        ...


@dataclass
class Ahead:
    guess: int | None  # g: the drafter's top token after the tokens it was given; None = it proposed none (EOS)
    draft: Draft  # [k] the proposal continuing tokens + [guess] (empty when guess is None)
    guess_seconds: float = 0.0  # wall time spent finding the guess (draft.seconds holds the proposal's)


class Pending(Protocol):
    """A proposal under way (concurrent.futures.Future fits)."""

    def result(self) -> Ahead: ...

    def cancel(self) -> bool:
        """Drop the proposal if it has not started; True when it was dropped."""
        ...


@runtime_checkable
class AheadDrafter(Protocol):
    """A Drafter that can also propose asynchronously (optional: the loop runs `propose` on a thread otherwise)."""

    def propose(self, tokens: list[int], k: int, sampling: SamplingParams) -> Draft: ...

    def propose_ahead(self, tokens: list[int], k: int, sampling: SamplingParams) -> Pending:
        """Start proposing k tokens continuing tokens + [g], g = this drafter's top token after `tokens`, and
        return at once. The draft must equal propose(tokens + [g], k, sampling), so that the loop can use it
        in place of that call (`speculative.overlap.propose_ahead` is the reference)."""
        ...


class Verifier(Protocol):
    max_draft_len: int  # the engine's limit on k

    def verify(self, tokens: list[int], draft: Draft, sampling: SamplingParams) -> Verification:
        """Score tokens + draft.tokens in one forward pass and return the accepted prefix plus one token.

        With draft.tokens empty this is one plain target decoding step (accepted = 0, one token).
        """
        ...
