"""Read one `tensorrt_llm_bls` request (the input names of NVIDIA's BLS), free of Triton.

Every problem raises `RequestError` with a message fit for the client (the BLS answers INVALID_ARG; no
traceback ever reaches a client). `get(name)` returns the input tensor as a numpy array, or None when
the client did not send it. This module reads and maps the inputs; the rules on their values are the
loop's (`GenerationRequest.validate`, `validate_sampling`) and the one K rule (`resolve_k`), applied when
the request runs, so no check is written twice.

NVIDIA's clients (NVIDIA/TensorRT-LLM `triton_backend/inflight_batcher_llm/client/
end_to_end_grpc_client.py`, `triton_backend/tools/inflight_batcher_llm/end_to_end_test.py`) send neutral
values of inputs they do not use: beam_width 1, empty bad_words / stop_words ([[""]]), empty
embedding_bias_words / embedding_bias_weights, stream false, an explicit temperature. Those are
accepted; an input that asks for something this BLS cannot do is refused by name.

Sampling inputs mean what they mean to NVIDIA's BLS, which forwards them to the engines as they came
(`lib/triton_decoder.py` `_get_llm_tensors_from_request`), i.e. TensorRT-LLM's rules
(`specbuild.contract.sampling`): absent top_k and top_p (or top_p <= 0) mean greedy, whatever the
temperature; top_k 1 is greedy; otherwise the request samples. One specbuild rule on top: temperature 0
is greedy (TensorRT-LLM would scale the logits by 1e6 and sample among the saturated ones). An end_id of
-1, which TensorRT-LLM accepts (its range is [-1, vocab)) and never matches a token, means no end id.

Stricter than NVIDIA's BLS, because one request must not hold up the others (`RequestLimits`): the prompt and the
stop words are refused by their size in bytes before anything is decoded or tokenized (the bound comes from
the tokenizer, `token_bytes`, so a prompt that would fit is never refused); end_id and pad_id are checked
against the tokenizer's vocabulary here rather than by the models after a first draft step (TensorRT-LLM
checks end_id against the engine's, possibly padded, vocabulary; it does not check pad_id); stop words must
be UTF-8, like the prompt.

The integer inputs stay INT32, as NVIDIA's BLS declares them: Triton refuses a tensor whose datatype differs
from the declared one ("inference input 'max_tokens' data-type is 'INT32', but model ... expects 'INT64'",
triton-inference-server/core src/infer_request.cc, `InferenceRequest::Normalize`), and NVIDIA's clients send
INT32. Over HTTP `generate` (JSON) Triton converts a JSON integer to INT32 by a plain C cast, so 2^32 + 5
arrives as 5 (triton-inference-server/server src/http_server.cc, `ReadDataFromJsonHelper`); no model can
tell, so clients must send values in range (docs/triton.md, "Integer types").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from specbuild.decode.grammar import GuideRequest
from specbuild.errors import RequestError
from specbuild.speculative.interfaces import SamplingParams

Getter = Callable[[str], "np.ndarray | None"]

# Inputs of NVIDIA's BLS that specbuild does not implement: refused loudly rather than ignored.
UNSUPPORTED_INPUTS = (
    "prompt_embedding_table",
    "lora_task_id",
    "lora_weights",
    "lora_config",
    "image_input",
    "image_bytes_input",
    "image_url_input",
    "video_bytes_input",
    "decoder_text_input",
)
MAX_GUIDE_BYTES = 256 * 1024  # a guide's text (schema, regex, grammar): refused above this, before it is compiled


# Inputs accepted only at their neutral value (NVIDIA clients often send them with defaults).
NEUTRAL_INPUTS = {
    "beam_width": 1,
    "return_context_logits": False,
    "return_generation_logits": False,
    "length_penalty": 1.0,
    "repetition_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "min_tokens": 0,
    "num_return_sequences": 1,
    "return_log_probs": False,
}


@dataclass(frozen=True)
class RequestLimits:
    """What this deployment accepts in one request, known when the model loads."""

    max_tokens: int  # what the engines allow for one request's output (max_seq_len - max_input_len)
    vocab_size: int | None = None  # the tokenizer's; end_id in [-1, vocab_size), pad_id in [0, vocab_size)
    max_input_len: int | None = None  # tokens
    longest_token_bytes: int | None = None  # most bytes one token covers (token_bytes); None = no byte bound

    @property
    def prompt_bytes(self) -> int | None:
        """The longest prompt, in UTF-8 bytes, that can fit max_input_len tokens; None = no bound."""
        if self.max_input_len is None or self.longest_token_bytes is None:
            return None
        return self.max_input_len * self.longest_token_bytes


@dataclass(frozen=True)
class BlsRequest:
    text: str
    max_tokens: int
    num_draft_tokens: int | None  # None = the deployment's default K (resolved by draft_len.resolve_k)
    use_draft_logits: bool | None  # None = the deployment's default
    stream: bool
    sampling: SamplingParams
    end_id: int | None  # None = the tokenizer's eos; -1 = no end id
    pad_id: int | None
    stop_words: list[str] = field(default_factory=list)
    exclude_input_in_output: bool | None = None  # None = the target model's setting (false in generated repositories)
    # every response carries num_input_tokens / the tokens its text covers (num_output_tokens), as NVIDIA's backend
    # does when asked; Triton's OpenAI frontend always asks and sums a stream's counts (its usage)
    return_num_input_tokens: bool = False
    return_num_output_tokens: bool = False
    guide: GuideRequest | None = None  # structured output (guided_decoding_guide_type / _guide); None: unguided


def _scalar(get: Getter, name: str, kind: str) -> object | None:
    value = get(name)
    if value is None:
        return None
    array = np.asarray(value)
    if array.size != 1:
        raise RequestError(f"input '{name}' must hold exactly one value per request, got shape {list(array.shape)}.")
    item = array.reshape(-1)[0]
    if kind == "int":
        if array.dtype.kind not in "iu":
            raise RequestError(f"input '{name}' must be an integer tensor (INT32/UINT64), got {array.dtype}.")
        return int(item)
    if kind == "float":
        if array.dtype.kind != "f":
            raise RequestError(f"input '{name}' must be FP32, got {array.dtype}.")
        return float(item)
    if kind == "bool":
        if array.dtype != np.bool_:
            raise RequestError(f"input '{name}' must be BOOL, got {array.dtype}.")
        return bool(item)
    if kind == "str":
        if isinstance(item, bytes):
            try:
                return item.decode("utf-8")
            except UnicodeDecodeError:
                raise RequestError(f"input '{name}' is not valid UTF-8.") from None
        if isinstance(item, str):
            return item
        raise RequestError(f"input '{name}' must be a STRING (BYTES) tensor, got {array.dtype}.")
    raise AssertionError(kind)


def _check_bytes(name: str, size: int, limits: RequestLimits, what: str = "") -> None:
    """Refuse a text by its size in bytes: the prompt when it cannot fit max_input_len tokens; the stop words
    (all together) when they are longer than the longest prompt could be, specbuild's own rule."""
    if limits.prompt_bytes is None or size <= limits.prompt_bytes:
        return
    why = (
        f"max_input_len = {limits.max_input_len} tokens x at most {limits.longest_token_bytes} bytes per token of "
        "this tokenizer"
    )
    if name == "text_input":
        raise RequestError(
            f"input 'text_input' is {size} bytes, above the {limits.prompt_bytes} bytes that can fit "
            f"this deployment ({why}); shorten it."
        )
    raise RequestError(
        f"input '{name}' is {size} bytes{what}, above this deployment's limit of {limits.prompt_bytes} "
        f"bytes (as long as the longest prompt: {why}); shorten it."
    )


def _strings(get: Getter, name: str, limits: RequestLimits) -> list[str]:
    """The non-empty words of a STRING input (all together within the byte limit, checked before decoding)."""
    value = get(name)
    if value is None:
        return []
    items = np.asarray(value).reshape(-1)
    raw = [item if isinstance(item, bytes) else str(item).encode("utf-8") for item in items]
    _check_bytes(name, sum(len(item) for item in raw), limits, " in all" if len(raw) > 1 else "")
    out = []
    for item in raw:
        try:
            text = item.decode("utf-8")
        except UnicodeDecodeError:
            raise RequestError(f"input '{name}' is not valid UTF-8.") from None
        if text:
            out.append(text)
    return out


def _token_id(get: Getter, name: str, lowest: int, limits: RequestLimits, meaning: str) -> int | None:
    value = _scalar(get, name, "int")
    if value is None or limits.vocab_size is None or lowest <= value < limits.vocab_size:
        return value
    raise RequestError(
        f"{name} = {value} is invalid: use {meaning}a token id in [0, {limits.vocab_size}), "
        "this deployment's vocabulary, or leave it unset."
    )


# Word inputs accepted when they hold no word (NVIDIA's clients send [[""]] or an empty tensor).
EMPTY_INPUTS = ("bad_words", "embedding_bias_words", "embedding_bias_weights")


def _holds_nothing(value: np.ndarray) -> bool:
    array = np.asarray(value)
    if array.dtype.kind in "OSU":
        return all(
            not (item.decode("utf-8", "replace") if isinstance(item, bytes) else str(item))
            for item in array.reshape(-1)
        )
    return array.size == 0 or not np.any(array)  # weights: none, or all zero


def _sampling(get: Getter) -> SamplingParams:
    """The loop's SamplingParams from the request's sampling inputs, by TensorRT-LLM's rules. Values are kept as
    sent (the loop's validate_sampling judges them), so a bad one is refused even where greedy would ignore it."""
    temperature = _scalar(get, "temperature", "float")
    top_k = _scalar(get, "top_k", "int")
    top_p = _scalar(get, "top_p", "float")
    if top_p is not None and top_p <= 0.0:
        top_p = None  # TensorRT-LLM: runtime_top_p <= 0 is treated as not given
    if not top_k and top_p is None:
        top_k = 1  # TensorRT-LLM: neither top_k nor top_p set is greedy (top-1)
    return SamplingParams(
        temperature=1.0 if temperature is None else temperature,
        top_k=top_k or 0,
        top_p=1.0 if top_p is None else top_p,
        seed=_scalar(get, "seed", "int"),
    )


def parse_request(get: Getter, limits: RequestLimits) -> BlsRequest:
    """Read and check every input against this deployment's `limits`."""
    size = _text_bytes(get("text_input"))  # the size first: nothing is decoded before it
    if size is not None:
        _check_bytes("text_input", size, limits)
    for name in UNSUPPORTED_INPUTS:
        if get(name) is not None:
            raise RequestError(f"input '{name}' is not supported by specbuild's speculative BLS; remove it.")
    for name in EMPTY_INPUTS:
        value = get(name)
        if value is not None and not _holds_nothing(value):
            raise RequestError(
                f"input '{name}' is not supported by specbuild's speculative BLS (only empty); remove it."
            )
    for name, neutral in NEUTRAL_INPUTS.items():
        value = get(name)
        if value is not None and np.asarray(value).size and np.any(np.asarray(value) != neutral):
            raise RequestError(
                f"input '{name}' = {np.asarray(value).reshape(-1).tolist()} is not supported by specbuild's speculative "
                f"BLS (only {neutral!r}); remove it."
            )
    text = _scalar(get, "text_input", "str")
    if text is None or not str(text).strip():
        raise RequestError("input 'text_input' is required and must be non-empty text.")
    max_tokens = _scalar(get, "max_tokens", "int")
    if max_tokens is None:
        raise RequestError("input 'max_tokens' is required (INT32, > 0).")
    if max_tokens <= 0 or max_tokens > limits.max_tokens:
        raise RequestError(f"input 'max_tokens' = {max_tokens}: must be in 1..{limits.max_tokens} for this deployment.")
    exclude = _scalar(get, "exclude_input_in_output", "bool")
    return BlsRequest(
        text=str(text),
        max_tokens=int(max_tokens),
        num_draft_tokens=_scalar(get, "num_draft_tokens", "int"),
        use_draft_logits=_scalar(get, "use_draft_logits", "bool"),
        stream=bool(_scalar(get, "stream", "bool") or False),
        sampling=_sampling(get),
        end_id=_token_id(get, "end_id", -1, limits, "-1 (no end id) or "),
        pad_id=_token_id(get, "pad_id", 0, limits, ""),
        stop_words=_strings(get, "stop_words", limits),
        exclude_input_in_output=exclude,
        return_num_input_tokens=bool(_scalar(get, "return_num_input_tokens", "bool") or False),
        return_num_output_tokens=bool(_scalar(get, "return_num_output_tokens", "bool") or False),
        guide=_guide(get),
    )


def _text_bytes(value: np.ndarray | None) -> int | None:
    """The UTF-8 size of a one-string input, read before anything decodes it; None when it is not one string (the
    input's own reader says what is wrong with it)."""
    if value is None or np.asarray(value).size != 1:
        return None
    item = np.asarray(value).reshape(-1)[0]
    if not isinstance(item, (bytes, str)):
        return None
    return len(item) if isinstance(item, bytes) else len(item.encode("utf-8"))


def _guide(get: Getter) -> GuideRequest | None:
    """NVIDIA's two guided inputs read as one guide, its text bounded in bytes before anything compiles it."""
    size = _text_bytes(get("guided_decoding_guide"))
    if size is not None and size > MAX_GUIDE_BYTES:
        raise RequestError(
            f"input 'guided_decoding_guide' is {size} bytes, above the {MAX_GUIDE_BYTES} bytes a guide may have."
        )
    guide_type = _scalar(get, "guided_decoding_guide_type", "str")
    return GuideRequest.from_inputs(
        None if guide_type is None else str(guide_type), _scalar(get, "guided_decoding_guide", "str")
    )
