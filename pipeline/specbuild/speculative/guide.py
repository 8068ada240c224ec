"""Guided (structured) output with speculation, exact: the target's constrained greedy text whatever is drafted.

A guide (a grammar's state for one request: JSON, a JSON schema, a regex, an EBNF grammar) says which tokens may come
next. Constrained greedy decoding picks, at each position, the target's highest-scoring token among those the guide
allows. The loop keeps that exact with any draft, using the target's unconstrained verification:

1. The draft is cut at the first token the guide refuses (`cut_draft`): the target never verifies a token that could
   not be kept.
2. The target verifies the cut draft as usual. Each accepted draft token equals the target's greedy choice over all
   tokens and is allowed by the guide, so it is the greedy choice over the allowed tokens too.
3. The verifier's own token after them (recovered or bonus) is kept where the guide allows it, for the same reason.
   Where it does not, that one position needs the choice among allowed tokens: the verifier makes one plain step
   (no draft) with every refused token banned (`GuidedVerifier.step_banning`), which on the engine path is a
   `tensorrt_llm` request with a `bad_words_list` of one-token words: TensorRT-LLM's ban-words layer runs in the
   external-draft-tokens decoding mode too (NVIDIA/TensorRT-LLM `cpp/include/tensorrt_llm/executor/types.h`,
   `DecodingMode::ExternalDraftTokens()` sets `kUseBanTokens`); where the grammar allows one token only (a closed
   JSON value's end id, a schema's fixed key), that token is the choice and no call is made. No request to the
   models ever carries a guide: every
   BLS call is a new request, and NVIDIA's C++ guided decoder starts the grammar afresh at each request and advances
   it by one token per step, with no rollback for draft tokens (`cpp/tensorrt_llm/batch_manager/guidedDecoder.cpp`).
4. The guide advances by the tokens kept.

So greedy guided output equals K = 0 guided output token for token. Sampling under a guide is refused: the acceptance
rule would need the target's and the draft's distributions restricted to the allowed tokens, which the engines'
verification does not apply (`check_guided_sampling`).

numpy only; the grammar itself is anything with the `Guide` methods (`decode.grammar` wraps xgrammar).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np

from specbuild.errors import GenerationError, RequestError
from specbuild.speculative.interfaces import Draft, SamplingParams, Verification

__all__ = ["Guide", "GuidedVerifier", "check_guided_sampling", "cut_draft", "keep_allowed"]


class Guide(Protocol):
    def allowed_prefix(self, tokens: Sequence[int]) -> int:
        """How many leading tokens of `tokens` the grammar accepts from its state, which stays as it was."""
        ...

    def advance(self, tokens: Sequence[int]) -> None:
        """Accept `tokens` (each allowed in turn); the state moves past them."""
        ...

    def allowed(self) -> np.ndarray:
        """[vocab] bool: the tokens the grammar allows next (the rest is the ban list of a constrained step)."""
        ...


@runtime_checkable
class GuidedVerifier(Protocol):
    max_draft_len: int

    def step_banning(self, tokens: list[int], banned: np.ndarray, sampling: SamplingParams) -> int:
        """One plain target step continuing `tokens` with every id in `banned` excluded: the target's token (its
        end_id when it ends there)."""
        ...


def check_guided_sampling(sampling: SamplingParams) -> None:
    if not sampling.greedy:
        raise RequestError(
            "a guided request must be greedy (temperature 0): sampling under a guide is not exact with speculation "
            "here, as the target's verification does not restrict its distribution to the grammar's tokens."
        )


def cut_draft(draft: Draft, guide: Guide) -> Draft:
    """The draft up to its first token the guide refuses (its probs and any logits cut alike)."""
    keep = guide.allowed_prefix([int(t) for t in draft.tokens])
    if keep == len(draft.tokens):
        return draft
    cut = {"tokens": list(draft.tokens[:keep])}
    if draft.probs is not None:
        cut["probs"] = draft.probs[:keep]
    if getattr(draft, "logits", None) is not None:
        cut["logits"] = draft.logits[:keep]  # type: ignore[attr-defined]
    return dataclasses.replace(draft, **cut)


def keep_allowed(
    verification: Verification,
    guide: Guide,
    verifier: GuidedVerifier,
    context: list[int],
    sampling: SamplingParams,
) -> tuple[Verification, bool]:
    """The verification with its last token replaced by the constrained choice where the guide refuses it, and the
    guide advanced past every token kept; True when a constrained step was made."""
    accepted = [int(t) for t in verification.tokens[: verification.accepted]]
    guide.advance(accepted)  # draft tokens: allowed, as the draft was cut
    last = int(verification.tokens[-1])
    if guide.allowed_prefix([last]) == 1:
        guide.advance([last])
        return verification, False
    mask = guide.allowed()
    allowed = np.flatnonzero(mask)
    if allowed.size == 0:  # nothing more: a kept draft token was an end id, where the loop ends
        return verification, False
    if allowed.size == 1:  # one token allowed: the constrained choice, with no call to make
        chosen = int(allowed[0])
        guide.advance([chosen])
        return dataclasses.replace(verification, tokens=[*accepted, chosen]), False
    refused = np.flatnonzero(~mask).astype(np.int32)
    chosen = int(verifier.step_banning(context + accepted, refused, sampling))
    if guide.allowed_prefix([chosen]) != 1:
        raise GenerationError(
            f"the target chose token {chosen} with every refused token banned, and the guide refuses it: the "
            "target model does not honour bad_words_list."
        )
    guide.advance([chosen])
    return dataclasses.replace(verification, tokens=[*accepted, chosen]), True
