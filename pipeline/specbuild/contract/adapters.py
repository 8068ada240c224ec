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
- How many draft tokens the target accepted is its own figure, `total_accepted_draft_tokens`, which
  the C++ backend returns only when the request sets `return_perf_metrics` (NVIDIA/TensorRT-LLM
  `triton_backend/inflight_batcher_llm/src/model_instance_state.cc`, commit 0c8de69,
  `fillTritonResponse`). The Verifier asks for it and checks it against the tokens that came back
  (the accepted draft prefix, then one token, or end_id); a disagreement is a GenerationError.
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


def _base_request(tokens: list[int], output_len: int, end_id: int | None, pad_id: int | None,
                  sampling: SamplingParams) -> dict[str, np.ndarray]:
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
        raise GenerationError(f"the {who} model's response lacks usable output_ids / sequence_length ({err}).") from None
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

    def __init__(self, call: Call, max_draft_len: int, end_id: int | None = None, pad_id: int | None = None,
                 logits_dtype: str | None = None):
        self.call, self.max_draft_len, self.end_id, self.pad_id = call, max_draft_len, end_id, pad_id
        self.logits_dtype = logits_dtype  # the target's declared draft_logits dtype; None = send as received

    def verify(self, tokens: list[int], draft: Draft, sampling: SamplingParams) -> Verification:
        t0 = time.perf_counter()
        k = len(draft.tokens)
        request = _base_request(tokens, k + 1, self.end_id, self.pad_id, sampling)
        if k:
            request["draft_input_ids"] = np.asarray(draft.tokens, dtype=np.int32)
            request["return_perf_metrics"] = np.array([True])  # for total_accepted_draft_tokens
            logits = getattr(draft, "logits", None)
            if logits is not None and not sampling.greedy:
                request["draft_logits"] = np.asarray(logits, dtype=self.logits_dtype)[:k]
        response = self.call(request)
        new = _new_tokens(response, len(tokens), "target")
        accepted = _accepted_draft_tokens(response, k) if k else 0
        if self.end_id is not None and self.end_id in new:
            new = new[: new.index(self.end_id)]  # a model that keeps end_id in its output
            stopped = True
        else:
            stopped = len(new) <= accepted  # no recovered or bonus token: the target stopped at end_id
        draft_ids = [int(t) for t in draft.tokens]
        if stopped:
            if self.end_id is None:
                raise GenerationError(
                    f"the target returned {len(new)} token(s) for a {k}-token draft and no extra token, but no "
                    "end_id is known: pass end_id to ContractVerifier."
                )
            # end_id was the recovered/bonus token (accepted == len(new)) or an accepted draft token, after
            # which the target may count more accepted ones: it stops at end_id, the acceptance count does not.
            agree = new == draft_ids[: len(new)] and (
                accepted == len(new) or (accepted > len(new) and draft_ids[len(new)] == self.end_id))
            out, accepted = new + [self.end_id], len(new)
        else:
            agree = len(new) == accepted + 1 and new[:accepted] == draft_ids[:accepted]
            out = new
        if not agree:
            raise GenerationError(
                f"the target returned new tokens {new} and total_accepted_draft_tokens = "
                f"{_accepted_draft_tokens(response, k) if k else 0} for draft {draft_ids}: expected the accepted "
                "draft prefix plus one token (TensorRT-LLM draft_tokens_external semantics)."
            )
        return Verification(accepted=accepted, tokens=out, seconds=time.perf_counter() - t0)


def _accepted_draft_tokens(response: dict[str, Any], k: int) -> int:
    """The target's own count of accepted draft tokens (requested with return_perf_metrics)."""
    try:
        accepted = int(np.asarray(response["total_accepted_draft_tokens"]).reshape(-1)[0])
    except (KeyError, IndexError, TypeError, ValueError):
        raise GenerationError(
            "the target model's verification response lacks total_accepted_draft_tokens: it must return the "
            "acceptance outputs when return_perf_metrics is set (TensorRT-LLM's tensorrt_llm model does)."
        ) from None
    if not 0 <= accepted <= k:
        raise GenerationError(f"the target model returned total_accepted_draft_tokens = {accepted} for a "
                              f"{k}-token draft: it must lie in 0..{k}.")
    return accepted
