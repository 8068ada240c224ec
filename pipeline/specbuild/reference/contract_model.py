"""ContractModel: the reference engine behind NVIDIA's `tensorrt_llm` model tensors.

One dict of numpy arrays per request in, one per request out, with TensorRT-LLM's names and dtypes
(`specbuild.contract.tensors`), so the Triton Python-backend model can put this runtime behind the same
I/O as the C++ backend; the request rules are the executor's (`specbuild.contract.executor`):

    input_ids INT32 [len], input_lengths INT32 [1], request_output_len INT32 [1]     (required)
    draft_input_ids INT32 [k], draft_logits [k, vocab] (logits dtype)               (verification)
    end_id, pad_id INT32 [1]; temperature FP32 [1], runtime_top_k INT32 [1],
    runtime_top_p FP32 [1], seed UINT64 [1]; stop_words_list, bad_words_list INT32 [2, n] (bad words: one-token
    words on a request without draft tokens); return_generation_logits,
    return_perf_metrics BOOL [1]                                                    (optional)
  ->
    output_ids INT32 [1, len] (prompt included: exclude_input_in_output = false),
    sequence_length INT32 [1], generation_logits [1, n, vocab] in the engine's logits dtype (when asked),
    acceptance_rate FP32 [1], total_accepted_draft_tokens INT32 [1], total_draft_tokens INT32 [1]
    (with return_perf_metrics, as the C++ backend fills them only then: NVIDIA/TensorRT-LLM
    `triton_backend/inflight_batcher_llm/src/model_instance_state.cc`, commit 0c8de69,
    `fillTritonResponse`: `if (requestData.returnPerfMetrics)`).

Without draft_input_ids the model decodes request_output_len tokens (the draft model's role, or
plain target decoding). With them it verifies, TensorRT-LLM `draft_tokens_external` style: one
forward pass over prefix + draft gives k + 1 rows of logits, the acceptance rule
(specbuild.speculative.acceptance) keeps a prefix of the draft, and the output is prefix +
accepted tokens + one recovered or bonus token. Generation stops at end_id, which is not part of
output_ids or sequence_length (as in TensorRT-LLM), and after a stop word (`stop_words_list`, TensorRT-LLM's
[2, n] word list, matched on the tokens this request generates), which is. Requests of one call run as one batched forward.
Sampling tensors mean what they mean to TensorRT-LLM (`specbuild.contract.sampling`): a request
with no sampling tensor is greedy, and temperature 0 with top_k 0 samples. Invalid inputs raise
RequestError with the executor's message (the Triton model answers INVALID_ARG).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from specbuild.contract.executor import Limits, ParsedRequest, parse_request
from specbuild.contract.logits import engine_logits
from specbuild.contract.sampling import TrtllmSampling
from specbuild.errors import RequestError
from specbuild.reference.engine import ReferenceEngine
from specbuild.reference.timing import CallClock
from specbuild.speculative.acceptance import accept_greedy, accept_sampling
from specbuild.speculative.sampling import sample

__all__ = ["ContractModel", "Limits"]


def _picker(sampling: TrtllmSampling, logits_dtype: str, banned: list[int]):
    """logits [vocab] -> the token: greedy or sampled as TensorRT-LLM does, never one of `banned` (one-token bad
    words, whose logits the ban-words layer sets to -inf before the choice)."""

    def allowed(logits: np.ndarray) -> np.ndarray:
        if not banned:
            return logits
        logits = np.array(logits, dtype=np.float32)
        logits[banned] = -np.inf
        return logits

    if sampling.greedy:
        return lambda logits: int(np.argmax(allowed(logits)))
    rng = np.random.default_rng(sampling.seed)
    return lambda logits: sample(sampling.probs(allowed(logits), logits_dtype), rng)


def _banned_tokens(request: ParsedRequest) -> list[int]:
    """The request's bad words as banned ids: the reference model honours one-token words on a plain request, which
    is how the BLS uses them (speculative.guide); anything else is refused by name rather than ignored."""
    if not request.bad_words:
        return []
    if request.draft is not None:
        raise RequestError(
            "input 'bad_words_list' with 'draft_input_ids' is not supported by the reference model: send bad words "
            "on a request without draft tokens."
        )
    if any(len(word) != 1 for word in request.bad_words):
        raise RequestError(
            "input 'bad_words_list' with a word of several tokens is not supported by the reference model: send "
            "one-token words."
        )
    return sorted({word[0] for word in request.bad_words})


class ContractModel:
    """The reference engine behind the tensorrt_llm tensor contract."""

    def __init__(self, engine: ReferenceEngine, limits: Limits | None = None, clock: CallClock | None = None):
        self.engine = engine
        self.limits = limits or Limits()
        self.clock = clock  # a timed stand-in's (reference.timing): each call lasts its timed steps
        self.timed_steps: list[tuple[list[int], int]] = []  # the last call's batches: (contexts, steps) each

    def __call__(self, request: dict[str, Any]) -> dict[str, np.ndarray]:
        response = self.execute([request])[0]
        if isinstance(response, Exception):
            raise response
        return response

    def execute(self, requests: list[dict[str, Any]], errors: str = "raise", wait: bool = True) -> list[Any]:
        """One response dict per request. errors="return" puts a RequestError in a bad request's slot
        instead of raising, so one bad request does not fail the others (what the Triton model wants).
        A timed stand-in's call then waits for the rest of its steps' time (`reference.timing`); wait=False leaves
        that to the caller, who times a call that also holds its own work (`timed_steps`: the call's batches)."""
        started = self.clock.now() if self.clock is not None else 0.0
        self.timed_steps = []
        parsed: list[ParsedRequest | RequestError] = []
        for i, request in enumerate(requests):
            try:
                one = parse_request(request, self.engine.vocab_size, self.limits)
                _banned_tokens(one)  # what the reference model cannot honour, refused before any work
                parsed.append(one)
            except RequestError as err:
                if errors == "raise":
                    raise RequestError(f"request {i}: {err}" if len(requests) > 1 else str(err)) from None
                parsed.append(err)
        out: list[Any] = [p if isinstance(p, RequestError) else None for p in parsed]
        good = [i for i, p in enumerate(parsed) if not isinstance(p, RequestError)]
        verify = [i for i in good if parsed[i].draft is not None]  # type: ignore[union-attr]
        decode = [i for i in good if parsed[i].draft is None]  # type: ignore[union-attr]
        step = max(1, self.limits.max_batch_size)
        batches: list[list[ParsedRequest]] = []
        for group in (verify[j : j + step] for j in range(0, len(verify), step)):
            batches.append([parsed[i] for i in group])  # type: ignore[misc]
            for i, response in zip(group, self._verify(batches[-1])):
                out[i] = response
        for group in (decode[j : j + step] for j in range(0, len(decode), step)):
            batches.append([parsed[i] for i in group])  # type: ignore[misc]
            for i, response in zip(group, self._decode(batches[-1])):
                out[i] = response
        if self.clock is not None and batches:
            self.timed_steps = [_timed_steps(batch) for batch in batches]
            if wait:
                self.clock.finish(started, self.timed_steps)
        return out

    def _verify(self, reqs: list[ParsedRequest]) -> list[dict[str, np.ndarray]]:
        sequences = [r.input_ids + r.draft for r in reqs]  # type: ignore[operator]
        all_logits = self.engine.logits(sequences, [len(r.draft) + 1 for r in reqs])  # type: ignore[arg-type]
        responses = []
        for r, logits in zip(reqs, all_logits):  # logits: [k + 1, vocab]
            draft = r.draft or []
            if r.sampling.greedy:
                accepted, tokens = accept_greedy(draft, logits)
            else:
                dtype = self.limits.logits_dtype
                p = r.sampling.probs(logits, dtype)
                q = None if r.draft_logits is None else r.sampling.probs(r.draft_logits, dtype)
                accepted, tokens = accept_sampling(draft, q, p, np.random.default_rng(r.sampling.seed))
            new = _until_stop(_until_end(tokens[: r.output_len], r.end_id), r.stop_words)
            response = self._response(r.input_ids, new, logits[: len(new)] if r.return_logits else None)
            if r.return_perf_metrics:
                response["acceptance_rate"] = np.array([accepted / len(draft) if draft else 0.0], np.float32)
                response["total_accepted_draft_tokens"] = np.array([accepted], np.int32)
                response["total_draft_tokens"] = np.array([len(draft)], np.int32)
            responses.append(response)
        return responses

    def _decode(self, reqs: list[ParsedRequest]) -> list[dict[str, np.ndarray]]:
        decoded = self.engine.decode(
            [r.input_ids for r in reqs],
            [r.output_len for r in reqs],
            [_picker(r.sampling, self.limits.logits_dtype, _banned_tokens(r)) for r in reqs],
            [r.end_id for r in reqs],
            [r.stop_words for r in reqs],
        )
        responses = []
        for r, d in zip(reqs, decoded):
            new = _until_end(d.tokens, r.end_id)
            responses.append(self._response(r.input_ids, new, d.logits[: len(new)] if r.return_logits else None))
        return responses

    def _response(self, prompt: list[int], new: list[int], logits: np.ndarray | None) -> dict[str, np.ndarray]:
        ids = np.array([prompt + new], dtype=np.int32)  # [1 beam, len]
        response = {"output_ids": ids, "sequence_length": np.array([ids.shape[1]], np.int32)}
        if logits is not None:  # [1 beam, n, vocab] in the engine's logits dtype
            response["generation_logits"] = engine_logits(logits, self.limits.logits_dtype)[None]
        return response


def _timed_steps(batch: list[ParsedRequest]) -> tuple[list[int], int]:
    """A batch's rows' context lengths and its steps, for a timed stand-in: a verify is one step (its drafts checked at
    once), a decode of n tokens is n steps."""
    contexts = [len(r.input_ids) + len(r.draft or ()) for r in batch]
    return contexts, max(1 if r.draft is not None else r.output_len for r in batch)


def _until_stop(tokens: list[int], stops: list[list[int]]) -> list[int]:
    """Tokens up to and including the first stop sequence they complete (TensorRT-LLM keeps the stop word)."""
    for n in range(1, len(tokens) + 1):
        if any(n >= len(w) and tokens[n - len(w) : n] == w for w in stops):
            return tokens[:n]
    return list(tokens)


def _until_end(tokens: list[int], end_id: int | None) -> list[int]:
    """Tokens before the first end_id (TensorRT-LLM leaves end_id out of output_ids / sequence_length)."""
    if end_id is not None and end_id in tokens:
        return tokens[: tokens.index(end_id)]
    return list(tokens)
