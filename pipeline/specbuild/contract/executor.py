"""The `tensorrt_llm` model's request rules: TensorRT-LLM's executor, as it treats one request.

What a request may ask of an engine with these `Limits` (the engine's build limits), with the
executor's own refusals and messages, so that the reference model refuses what TensorRT-LLM refuses
(sources cited at `Limits.max_input_len` and `parse_request`). numpy only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from specbuild.contract.logits import LOGITS_DTYPES
from specbuild.contract.sampling import TrtllmSampling
from specbuild.contract.words import word_sequences
from specbuild.errors import RequestError

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
    def from_engine(cls, engine: dict[str, Any], default_max_seq_len: int) -> Limits:
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
    return_perf_metrics: bool  # the acceptance outputs are returned only when asked, as by the C++ backend
    stop_words: list[list[int]] = field(default_factory=list)  # stop_words_list's sequences (generated tokens)
    bad_words: list[list[int]] = field(default_factory=list)  # bad_words_list's sequences: never generated


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
        return_perf_metrics=_scalar(request, "return_perf_metrics", bool, False),
        stop_words=word_sequences(request.get("stop_words_list")),
        bad_words=word_sequences(request.get("bad_words_list")),
    )
