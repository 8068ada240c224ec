"""The `tensorrt_llm` model's tensor contract, served by the reference engine.

The tensor names and shapes are those of NVIDIA's `tensorrt_llm` model (NVIDIA/TensorRT-LLM
`triton_backend/all_models/inflight_batcher_llm/tensorrt_llm/config.pbtxt`); the request rules are the
executor's (see `Limits` and `parse_request`).

One dict of numpy arrays per request in, one per request out, with TensorRT-LLM's names and dtypes,
so the Triton Python-backend model can put this runtime behind the same I/O as the C++ backend:

    input_ids INT32 [len], input_lengths INT32 [1], request_output_len INT32 [1]     (required)
    draft_input_ids INT32 [k], draft_logits [k, vocab] (logits dtype)               (verification)
    end_id, pad_id INT32 [1]; temperature FP32 [1], runtime_top_k INT32 [1],
    runtime_top_p FP32 [1], seed UINT64 [1]; return_generation_logits BOOL [1]     (optional)
  ->
    output_ids INT32 [1, len] (prompt included: exclude_input_in_output = false),
    sequence_length INT32 [1], generation_logits [1, n, vocab] in the engine's logits dtype (when asked),
    acceptance_rate FP32 [1], total_accepted_draft_tokens INT32 [1], total_draft_tokens INT32 [1]
    (when draft tokens were given).

Without draft_input_ids the model decodes request_output_len tokens (the draft model's role, or
plain target decoding). With them it verifies, TensorRT-LLM `draft_tokens_external` style: one
forward pass over prefix + draft gives k + 1 rows of logits, the acceptance rule
(specbuild.speculative.acceptance) keeps a prefix of the draft, and the output is prefix +
accepted tokens + one recovered or bonus token. Generation stops at end_id, which is not part of
output_ids or sequence_length (as in TensorRT-LLM). Requests of one call run as one batched forward.
Sampling tensors mean what they mean to TensorRT-LLM (`specbuild.runtime.trtllm_sampling`): a request
with no sampling tensor is greedy, and temperature 0 with top_k 0 samples. Invalid inputs raise
RequestError with the executor's message (the Triton model answers INVALID_ARG).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from specbuild.errors import RequestError
from specbuild.runtime.engine import ReferenceEngine
from specbuild.runtime.trtllm_sampling import LOGITS_DTYPES, TrtllmSampling, engine_logits
from specbuild.speculative.acceptance import accept_greedy, accept_sampling
from specbuild.speculative.sampling import sample

REQUIRED = ("input_ids", "input_lengths", "request_output_len")


@dataclass
class Limits:
    max_batch_size: int = 8
    max_seq_len: int = 4096  # prompt + generated tokens (+ draft tokens on a target)
    max_draft_len: int = 8  # longest draft_input_ids accepted
    max_num_tokens: int | None = None  # the engine's max_num_tokens; None = not known (then max_seq_len - 1 rules)
    logits_dtype: str = "float32"  # the engine's logits dtype: generation_logits and sampling arithmetic use it

    def __post_init__(self) -> None:
        if self.logits_dtype not in LOGITS_DTYPES:
            raise ValueError(f"logits_dtype {self.logits_dtype!r} is not one of {sorted(LOGITS_DTYPES)}")

    @property
    def max_input_len(self) -> int:
        """The runtime's largest input. Engines built with packed input and context FMHA (trtllm-build's
        defaults, and specbuild's) without chunked context take min(max_seq_len - 1, max_num_tokens):
        TRTGptModel logs "maxInputLen: %d = min(maxSequenceLen - 1, maxNumTokens) since context FMHA and
        usePackedInput are enabled" (NVIDIA/TensorRT-LLM cpp/tensorrt_llm/batch_manager/trtGptModel.h, the
        TrtGptModel constructor; with chunked context it is max_seq_len - 1, else max_input_len)."""
        if self.max_num_tokens is None:
            return self.max_seq_len - 1
        return min(self.max_seq_len - 1, self.max_num_tokens)

    @classmethod
    def from_engine(cls, engine: dict[str, Any], default_max_seq_len: int) -> "Limits":
        """Limits from a reference engine's engine.json (missing fields: the defaults older engines had)."""
        max_num_tokens = engine.get("max_num_tokens")
        return cls(
            max_batch_size=int(engine.get("max_batch_size", 8)),
            max_seq_len=int(engine.get("max_seq_len", default_max_seq_len)),
            max_draft_len=int(engine.get("max_draft_len", 0)),
            max_num_tokens=None if max_num_tokens is None else int(max_num_tokens),
            logits_dtype=str(engine.get("logits_dtype") or "float32"),
        )


@dataclass
class ParsedRequest:
    input_ids: list[int]  # [len]
    output_len: int
    draft: list[int] | None  # [k] draft_input_ids, None when absent
    draft_logits: np.ndarray | None  # [k, vocab]
    end_id: int | None
    sampling: TrtllmSampling
    return_logits: bool


def _scalar(request: dict[str, Any], name: str, kind: type, default: Any = None) -> Any:
    if name not in request or request[name] is None:
        return default
    value = np.asarray(request[name]).reshape(-1)
    if value.size != 1:
        raise RequestError(f"input {name!r} must hold exactly one value, got shape {np.shape(request[name])}.")
    item = value[0].item()
    if kind is bool:
        return bool(item)
    if kind is int:
        if not float(item).is_integer():
            raise RequestError(f"input {name!r} = {item!r} must be an integer.")
        return int(item)
    return float(item)


def _token_array(request: dict[str, Any], name: str, vocab: int) -> list[int]:
    value = np.asarray(request[name])
    if value.ndim > 1 and value.shape[0] == 1:
        value = value[0]  # tolerate a leading batch dim of 1
    if value.ndim != 1 or value.dtype.kind not in "iu":
        raise RequestError(f"input {name!r} must be a 1-D integer array of token ids, got {value.dtype} {value.shape}.")
    if value.size and (value.min() < 0 or value.max() >= vocab):
        raise RequestError(f"input {name!r} holds token ids outside [0, {vocab}): {value.tolist()[:16]}.")
    return [int(t) for t in value]


def parse_request(request: dict[str, Any], vocab: int, limits: Limits) -> ParsedRequest:
    """Validate one request dict; raise RequestError naming the bad input, its value and the fix.

    The length rules are the executor's `LlmRequest::validate` (NVIDIA/TensorRT-LLM
    cpp/tensorrt_llm/batch_manager/llmRequest.cpp, commit 89fd9b7): an input longer than the runtime's maximum input
    length and a draft longer than max_draft_len are refused; a draft that would overrun the maximum
    input length is cut, and an output that would overrun max_seq_len is shortened, not refused.
    """
    missing = [name for name in REQUIRED if name not in request]
    if missing:
        raise RequestError(f"missing required input(s) {', '.join(missing)}: send {', '.join(REQUIRED)}.")
    ids = _token_array(request, "input_ids", vocab)
    length = _scalar(request, "input_lengths", int)
    if not 1 <= length <= len(ids):
        raise RequestError(f"input_lengths = {length} does not fit input_ids of length {len(ids)}: send 1..{len(ids)}.")
    ids = ids[:length]
    output_len = _scalar(request, "request_output_len", int)
    if output_len < 1:
        raise RequestError(f"request_output_len = {output_len}: ask for at least 1 token.")
    end_id = _scalar(request, "end_id", int)
    if end_id is not None and not -1 <= end_id < vocab:
        raise RequestError(f"EndId ({end_id}) is not within acceptable range [-1, {vocab}).")
    if len(ids) > limits.max_input_len:
        raise RequestError(
            f"Prompt length ({len(ids)}) exceeds maximum input length ({limits.max_input_len}). Set log level to info "
            "and check TRTGptModel logs for how maximum input length is set"
        )
    draft = _token_array(request, "draft_input_ids", vocab) if request.get("draft_input_ids") is not None else None
    draft_logits = None
    if draft is not None:
        if len(draft) > limits.max_draft_len:
            raise RequestError(
                f"Draft tokens length ({len(draft)}) exceeds maximum draft tokens length ({limits.max_draft_len})."
            )
        if request.get("draft_logits") is not None:
            draft_logits = np.asarray(request["draft_logits"], dtype=np.float32)
            if draft_logits.ndim == 3 and draft_logits.shape[0] == 1:
                draft_logits = draft_logits[0]
            if draft_logits.shape != (len(draft), vocab):
                raise RequestError(
                    f"draft_logits has shape {draft_logits.shape}, expected [num_draft_tokens, vocab] = "
                    f"[{len(draft)}, {vocab}]: send one row of logits per draft token."
                )
        keep = limits.max_input_len - len(ids)  # the executor cuts a draft that overruns the input limit
        draft = draft[:keep]
        draft_logits = None if draft_logits is None else draft_logits[:keep]
    output_len = min(output_len, limits.max_seq_len - len(ids) - len(draft or []))
    sampling = TrtllmSampling.from_tensors(
        temperature=_scalar(request, "temperature", float),
        top_k=_scalar(request, "runtime_top_k", int),
        top_p=_scalar(request, "runtime_top_p", float),
        seed=_scalar(request, "seed", int),
    )
    return ParsedRequest(
        input_ids=ids,
        output_len=output_len,
        draft=draft,
        draft_logits=draft_logits,
        end_id=end_id if end_id is not None and end_id >= 0 else None,
        sampling=sampling,
        return_logits=_scalar(request, "return_generation_logits", bool, False),
    )


def _picker(sampling: TrtllmSampling, logits_dtype: str):
    if sampling.greedy:
        return lambda logits: int(np.argmax(logits))
    rng = np.random.default_rng(sampling.seed)
    return lambda logits: sample(sampling.probs(logits, logits_dtype), rng)


class ContractModel:
    """The reference engine behind the tensorrt_llm tensor contract."""

    def __init__(self, engine: ReferenceEngine, limits: Limits | None = None):
        self.engine = engine
        self.limits = limits or Limits()

    def __call__(self, request: dict[str, Any]) -> dict[str, np.ndarray]:
        response = self.execute([request])[0]
        if isinstance(response, Exception):
            raise response
        return response

    def execute(self, requests: list[dict[str, Any]], errors: str = "raise") -> list[Any]:
        """One response dict per request. errors="return" puts a RequestError in a bad request's slot
        instead of raising, so one bad request does not fail the others (what the Triton model wants)."""
        parsed: list[ParsedRequest | RequestError] = []
        for i, request in enumerate(requests):
            try:
                parsed.append(parse_request(request, self.engine.vocab_size, self.limits))
            except RequestError as err:
                if errors == "raise":
                    raise RequestError(f"request {i}: {err}" if len(requests) > 1 else str(err)) from None
                parsed.append(err)
        out: list[Any] = [p if isinstance(p, RequestError) else None for p in parsed]
        good = [i for i, p in enumerate(parsed) if not isinstance(p, RequestError)]
        verify = [i for i in good if parsed[i].draft is not None]  # type: ignore[union-attr]
        decode = [i for i in good if parsed[i].draft is None]  # type: ignore[union-attr]
        step = max(1, self.limits.max_batch_size)
        for group in (verify[j : j + step] for j in range(0, len(verify), step)):
            for i, response in zip(group, self._verify([parsed[i] for i in group])):  # type: ignore[misc]
                out[i] = response
        for group in (decode[j : j + step] for j in range(0, len(decode), step)):
            for i, response in zip(group, self._decode([parsed[i] for i in group])):  # type: ignore[misc]
                out[i] = response
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
            new = _until_end(tokens[: r.output_len], r.end_id)
            response = self._response(r.input_ids, new, logits[: len(new)] if r.return_logits else None)
            response["acceptance_rate"] = np.array([accepted / len(draft) if draft else 0.0], np.float32)
            response["total_accepted_draft_tokens"] = np.array([accepted], np.int32)
            response["total_draft_tokens"] = np.array([len(draft)], np.int32)
            responses.append(response)
        return responses

    def _decode(self, reqs: list[ParsedRequest]) -> list[dict[str, np.ndarray]]:
        decoded = self.engine.decode(
            [r.input_ids for r in reqs],
            [r.output_len for r in reqs],
            [_picker(r.sampling, self.limits.logits_dtype) for r in reqs],
            [r.end_id for r in reqs],
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


def _until_end(tokens: list[int], end_id: int | None) -> list[int]:
    """Tokens before the first end_id (TensorRT-LLM leaves end_id out of output_ids / sequence_length)."""
    if end_id is not None and end_id in tokens:
        return tokens[: tokens.index(end_id)]
    return list(tokens)

