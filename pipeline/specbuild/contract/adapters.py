"""Drafter and Verifier over the `tensorrt_llm` tensor contract (NVIDIA's `tensorrt_llm` model tensors).

Both build one request dict of numpy arrays per call and hand it to `call(request) -> response`.
In-process, `call` is the reference runtime's `ContractModel`; inside the Triton BLS model it is a
BLS InferenceRequest to `tensorrt_llm_draft` / `tensorrt_llm`. So the local and the served paths
drive the draft/verify loop through the same code. numpy only: no torch, no Triton imports.

Conventions of the contract that these adapters rely on (TensorRT-LLM's):
- output_ids [1, len] includes the prompt (exclude_input_in_output = false); sequence_length [1].
- Generation stops at end_id, and end_id is not in output_ids / sequence_length. A verification
  that returns only accepted draft tokens (no extra token) therefore stopped at end_id, and the
  Verifier reports end_id as its one extra token, which is what the loop expects.
- How many draft tokens the target accepted is read from the tokens that came back (the accepted draft
  prefix, then one token that differs from the draft's, or the prefix alone when the target stopped at
  end_id), as NVIDIA's own BLS does (`triton_backend/all_models/inflight_batcher_llm/tensorrt_llm_bls/1/lib/
  decode.py`, which compares the target's output with the draft). The target's own figure,
  `total_accepted_draft_tokens` (the C++ backend returns it only when the request sets `return_perf_metrics`:
  `triton_backend/inflight_batcher_llm/src/model_instance_state.cc`, commit 0c8de69, `fillTritonResponse`), is
  asked for and cross-checked: a missing or different figure is reported (`on_disagreement`), never a failed
  request, since its presence on a fresh request's first step is an `LlmRequest` detail not seen run here. An
  answer that is not a draft prefix plus at most one token is a GenerationError.
- Draft logits travel raw, in the dtype the draft model returned them (the engine's logits dtype,
  which the target's `draft_logits` input declares); the target applies temperature / top-k / top-p.
- Sampling tensors mean what TensorRT-LLM makes of them (`specbuild.contract.sampling`): a
  greedy step sends runtime_top_k = 1 and nothing else, never temperature 0 (which TensorRT-LLM
  turns into a 1e6 logit scale and samples from); a sampling step sends all three tensors, so
  top_k 0 with top_p 1.0 samples from the whole distribution.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from specbuild.errors import GenerationError
from specbuild.speculative.interfaces import Draft, SamplingParams, Verification
from specbuild.speculative.sampling import process_logits

__all__ = ["ContractDraft", "ContractDrafter", "ContractVerifier", "sampling_inputs"]

Call = Callable[[dict[str, np.ndarray]], dict[str, Any]]


@dataclass
class ContractDraft(Draft):
    logits: np.ndarray | None = None  # [k, vocab] the drafter's raw logits, sent on as draft_logits


def sampling_inputs(sampling: SamplingParams) -> dict[str, np.ndarray]:
    """The contract's sampling tensors for one request (SamplingParams: temperature 0 or top_k 1 = greedy,
    top_k 0 and top_p 1 = off)."""
    if sampling.greedy:
        return {"runtime_top_k": np.array([1], np.int32)}  # TensorRT-LLM's greedy: top-1 sampling
    inputs = {
        "temperature": np.array([sampling.temperature], np.float32),
        "runtime_top_k": np.array([sampling.top_k], np.int32),
        "runtime_top_p": np.array([sampling.top_p], np.float32),
    }
    if sampling.seed is not None:
        inputs["seed"] = np.array([sampling.seed], np.uint64)
    return inputs


def _base_request(
    tokens: list[int], output_len: int, end_id: int | None, pad_id: int | None, sampling: SamplingParams
) -> dict[str, np.ndarray]:
    request = {
        "input_ids": np.asarray(tokens, dtype=np.int32),
        "input_lengths": np.array([len(tokens)], np.int32),
        "request_output_len": np.array([output_len], np.int32),
        **sampling_inputs(sampling),
    }
    if end_id is not None:
        request["end_id"] = np.array([end_id], np.int32)
    if pad_id is not None:
        request["pad_id"] = np.array([pad_id], np.int32)
    return request


def _new_tokens(response: dict[str, Any], prompt_len: int, who: str) -> list[int]:
    try:
        ids = np.asarray(response["output_ids"]).reshape(-1)
        length = int(np.asarray(response["sequence_length"]).reshape(-1)[0])
    except (KeyError, IndexError, TypeError, ValueError) as err:
        raise GenerationError(
            f"the {who} model's response lacks usable output_ids / sequence_length ({err})."
        ) from None
    if length < prompt_len or length > ids.size:
        raise GenerationError(
            f"the {who} model returned sequence_length = {length} for a {prompt_len}-token input and {ids.size} "
            "output ids: it must return the input followed by the new tokens (exclude_input_in_output = false)."
        )
    return [int(t) for t in ids[prompt_len:length]]


class ContractDrafter:
    """Drafter: asks the draft model to decode k tokens; with use_logits it also returns q."""

    def __init__(self, call: Call, end_id: int | None = None, pad_id: int | None = None, use_logits: bool = True):
        self.call, self.end_id, self.pad_id, self.use_logits = call, end_id, pad_id, use_logits

    def propose(self, tokens: list[int], k: int, sampling: SamplingParams) -> Draft:
        t0 = time.perf_counter()
        want_logits = self.use_logits and not sampling.greedy
        request = _base_request(tokens, k, self.end_id, self.pad_id, sampling)
        request["return_generation_logits"] = np.array([want_logits])
        response = self.call(request)
        new = _new_tokens(response, len(tokens), "draft")[:k]
        logits = probs = None
        if want_logits and new:
            returned = np.asarray(response["generation_logits"])  # [1 beam, n, vocab], the engine's logits dtype
            logits = returned.reshape(-1, returned.shape[-1])[-len(new) :]  # [k, vocab]
            probs = process_logits(logits.astype(np.float64), sampling)
        return ContractDraft(tokens=new, probs=probs, seconds=time.perf_counter() - t0, logits=logits)


class ContractVerifier:
    """Verifier: asks the target model to check a draft (draft_input_ids [+ draft_logits])."""

    def __init__(
        self,
        call: Call,
        max_draft_len: int,
        end_id: int | None = None,
        pad_id: int | None = None,
        logits_dtype: str | None = None,
        on_disagreement: Callable[[str], None] | None = None,
    ):
        self.call, self.max_draft_len, self.end_id, self.pad_id = call, max_draft_len, end_id, pad_id
        self.logits_dtype = logits_dtype  # the target's declared draft_logits dtype; None = send as received
        self.on_disagreement = on_disagreement  # told when the target's own acceptance count differs from its tokens
        self.disagreements = 0

    def verify(self, tokens: list[int], draft: Draft, sampling: SamplingParams) -> Verification:
        t0 = time.perf_counter()
        k = len(draft.tokens)
        request = _base_request(tokens, k + 1, self.end_id, self.pad_id, sampling)
        if k:
            request["draft_input_ids"] = np.asarray(draft.tokens, dtype=np.int32)
            request["return_perf_metrics"] = np.array([True])  # total_accepted_draft_tokens, to cross-check
            logits = getattr(draft, "logits", None)
            if logits is not None and not sampling.greedy:
                request["draft_logits"] = np.asarray(logits, dtype=self.logits_dtype)[:k]
        response = self.call(request)
        new = _new_tokens(response, len(tokens), "target")
        kept_end = self.end_id is not None and self.end_id in new
        if kept_end:
            new = new[: new.index(self.end_id)]  # a model that keeps end_id in its output
        draft_ids = [int(t) for t in draft.tokens]
        common = 0  # the accepted count, read from the tokens: how far they follow the draft
        while common < min(len(new), k) and new[common] == draft_ids[common]:
            common += 1
        # The contract (TensorRT-LLM draft_tokens_external): the accepted draft prefix, then one recovered or bonus
        # token, which differs from the draft token it replaces; or the prefix alone when the target stopped at
        # end_id (left out of the output). Anything else is a broken answer, whatever any figure says.
        stopped = kept_end or len(new) == common
        if len(new) > common + 1 or (kept_end and len(new) != common):
            raise GenerationError(
                f"the target returned new tokens {new} for draft {draft_ids}: expected the accepted draft prefix plus "
                "one token (TensorRT-LLM draft_tokens_external semantics)."
            )
        if stopped and self.end_id is None:
            raise GenerationError(
                f"the target returned {len(new)} token(s) for a {k}-token draft and no extra token, but no "
                "end_id is known: pass end_id to ContractVerifier."
            )
        accepted, out = (len(new), new + [self.end_id]) if stopped else (common, new)
        if k:
            self._cross_check(response, k, accepted, stopped, draft_ids, new)
        return Verification(accepted=accepted, tokens=out, seconds=time.perf_counter() - t0)

    def step_banning(self, tokens: list[int], banned: np.ndarray, sampling: SamplingParams) -> int:
        """One plain step continuing `tokens` with each id in `banned` a one-token bad word (`bad_words_list`,
        TensorRT-LLM's [2, n] word list): the target's choice among the rest, its end_id when it ends there. A guided
        request's constrained token (speculative.guide); never sent with draft tokens."""
        request = _base_request(tokens, 1, self.end_id, self.pad_id, sampling)
        ids = np.asarray(banned, dtype=np.int32).reshape(-1)  # [n]: each id one word, ending at offset i + 1
        request["bad_words_list"] = np.stack([ids, np.arange(1, ids.size + 1, dtype=np.int32)])  # [2, n]
        new = _new_tokens(self.call(request), len(tokens), "target")
        if new:
            return new[0]
        if self.end_id is None:
            raise GenerationError(
                "the target returned no token and no end_id is known: pass end_id to ContractVerifier."
            )
        return self.end_id

    def _cross_check(
        self, response: dict[str, Any], k: int, accepted: int, stopped: bool, draft_ids: list[int], new: list[int]
    ) -> None:
        """The target's own `total_accepted_draft_tokens` against the count its tokens give. The tokens decide; a
        figure that is missing or differs is told to on_disagreement (the BLS logs it and counts it in its metrics),
        never a failed request. After an end_id accepted from the draft the target may count on past it: agreed."""
        try:
            reported = int(np.asarray(response["total_accepted_draft_tokens"]).reshape(-1)[0])
        except (KeyError, IndexError, TypeError, ValueError):
            reported = None
        past_end = (
            stopped
            and reported is not None
            and reported > accepted
            and accepted < k
            and draft_ids[accepted] == self.end_id
        )
        if reported == accepted or past_end:
            return
        self.disagreements += 1
        if self.on_disagreement is not None:
            said = "no total_accepted_draft_tokens" if reported is None else f"total_accepted_draft_tokens = {reported}"
            self.on_disagreement(
                f"the target sent {said} for draft {draft_ids}, but its tokens {new} accept "
                f"{accepted}: the tokens decide"
            )
