"""The Triton tensor tables, one per model, with NVIDIA's `inflight_batcher_llm` names.

Sources: the `config.pbtxt` templates of NVIDIA/TensorRT-LLM `triton_backend/all_models/inflight_batcher_llm/`
(`tensorrt_llm`, `tensorrt_llm_bls`, `preprocessing`, `postprocessing`, `ensemble`), as of TensorRT-LLM 1.2
(`min_tokens` and `seed`; tensorrtllm_backend v0.19.0 called them `min_length` and `random_seed`).
`tensorrt_llm` and `tensorrt_llm_draft` share one table; the reference (Python) models serve the same
table as the C++ `tensorrtllm` backend, so a client or the BLS cannot tell them apart.

Dims exclude the batch dimension (every model has max_batch_size > 0). `LOGITS` stands for the
deployment's logits datatype, filled at generation time.
"""

from __future__ import annotations

from dataclasses import dataclass

LOGITS = "LOGITS"  # replaced by the logits datatype (TYPE_FP32 unless the spec says otherwise)


@dataclass(frozen=True)
class Tensor:
    name: str
    dtype: str  # a Triton DataType name ("TYPE_INT32") or LOGITS
    dims: tuple[int, ...]  # without the batch dimension; -1 = variable
    optional: bool = False
    scalar: bool = False  # dims [1] with `reshape: { shape: [] }`, as NVIDIA declares per-request scalars
    ragged: bool = False  # allow_ragged_batch


def _req(name: str, dtype: str) -> Tensor:
    return Tensor(name, dtype, (1,), scalar=True)


def _opt(name: str, dtype: str) -> Tensor:
    return Tensor(name, dtype, (1,), optional=True, scalar=True)


def _ragged(name: str, dtype: str, dims: tuple[int, ...] = (-1,)) -> Tensor:
    return Tensor(name, dtype, dims, optional=True, ragged=True)


# tensorrt_llm / tensorrt_llm_draft
LLM_INPUTS: tuple[Tensor, ...] = (
    _ragged("input_ids", "TYPE_INT32"),
    _ragged("encoder_input_features", "TYPE_FP16", (-1, -1)),
    _opt("encoder_output_lengths", "TYPE_INT32"),
    _req("input_lengths", "TYPE_INT32"),
    _req("request_output_len", "TYPE_INT32"),
    _opt("num_return_sequences", "TYPE_INT32"),
    _ragged("draft_input_ids", "TYPE_INT32"),
    _ragged("decoder_input_ids", "TYPE_INT32"),
    _opt("decoder_input_lengths", "TYPE_INT32"),
    _ragged("draft_logits", LOGITS, (-1, -1)),  # [num_draft_tokens, vocab_padded]
    _opt("draft_acceptance_threshold", "TYPE_FP32"),
    _opt("end_id", "TYPE_INT32"),
    _opt("pad_id", "TYPE_INT32"),
    _ragged("stop_words_list", "TYPE_INT32", (2, -1)),  # row 0 flat ids, row 1 cumulative offsets (-1 padded)
    _ragged("bad_words_list", "TYPE_INT32", (2, -1)),
    _ragged("embedding_bias", "TYPE_FP32"),
    _opt("beam_width", "TYPE_INT32"),
    _opt("temperature", "TYPE_FP32"),
    _opt("runtime_top_k", "TYPE_INT32"),
    _opt("runtime_top_p", "TYPE_FP32"),
    _opt("runtime_top_p_min", "TYPE_FP32"),
    _opt("runtime_top_p_decay", "TYPE_FP32"),
    _opt("runtime_top_p_reset_ids", "TYPE_INT32"),
    _opt("len_penalty", "TYPE_FP32"),
    _opt("early_stopping", "TYPE_BOOL"),
    _opt("repetition_penalty", "TYPE_FP32"),
    _opt("min_tokens", "TYPE_INT32"),
    _opt("beam_search_diversity_rate", "TYPE_FP32"),
    _opt("presence_penalty", "TYPE_FP32"),
    _opt("frequency_penalty", "TYPE_FP32"),
    _opt("seed", "TYPE_UINT64"),
    _opt("return_log_probs", "TYPE_BOOL"),
    _opt("return_context_logits", "TYPE_BOOL"),
    _opt("return_generation_logits", "TYPE_BOOL"),
    _opt("return_perf_metrics", "TYPE_BOOL"),
    _opt("return_num_input_tokens", "TYPE_BOOL"),
    _opt("return_num_output_tokens", "TYPE_BOOL"),
    _opt("exclude_input_in_output", "TYPE_BOOL"),
    _opt("stop", "TYPE_BOOL"),
    _opt("streaming", "TYPE_BOOL"),
    _ragged("prompt_embedding_table", "TYPE_FP16", (-1, -1)),
    _ragged("prompt_table_extra_ids", "TYPE_UINT64"),
    _opt("prompt_vocab_size", "TYPE_INT32"),
    _opt("lora_task_id", "TYPE_UINT64"),
    _ragged("lora_weights", "TYPE_FP16", (-1, -1)),
    _ragged("lora_config", "TYPE_INT32", (-1, 3)),
    _ragged("context_phase_params", "TYPE_UINT8"),
)

LLM_OUTPUTS: tuple[Tensor, ...] = (
    Tensor("output_ids", "TYPE_INT32", (-1, -1)),  # [beam, len]
    Tensor("sequence_length", "TYPE_INT32", (-1,)),  # [beam]
    Tensor("cum_log_probs", "TYPE_FP32", (-1,)),
    Tensor("output_log_probs", "TYPE_FP32", (-1, -1)),
    Tensor("context_logits", LOGITS, (-1, -1)),
    Tensor("generation_logits", LOGITS, (-1, -1, -1)),  # [beam, len, vocab]
    Tensor("batch_index", "TYPE_INT32", (1,)),
    Tensor("sequence_index", "TYPE_INT32", (1,)),
    Tensor("context_phase_params", "TYPE_UINT8", (-1,)),
    Tensor("kv_cache_alloc_new_blocks", "TYPE_INT32", (1,)),
    Tensor("kv_cache_reused_blocks", "TYPE_INT32", (1,)),
    Tensor("kv_cache_alloc_total_blocks", "TYPE_INT32", (1,)),
    Tensor("arrival_time_ns", "TYPE_INT64", (1,)),
    Tensor("first_scheduled_time_ns", "TYPE_INT64", (1,)),
    Tensor("first_token_time_ns", "TYPE_INT64", (1,)),
    Tensor("last_token_time_ns", "TYPE_INT64", (1,)),
    Tensor("acceptance_rate", "TYPE_FP32", (1,)),
    Tensor("total_accepted_draft_tokens", "TYPE_INT32", (1,)),
    Tensor("total_draft_tokens", "TYPE_INT32", (1,)),
    Tensor("num_input_tokens", "TYPE_INT32", (1,)),
    Tensor("num_output_tokens", "TYPE_INT32", (1,)),
)

# preprocessing (text only: the multimodal tensors are not served)
PRE_INPUTS: tuple[Tensor, ...] = (
    Tensor("QUERY", "TYPE_STRING", (1,)),
    Tensor("REQUEST_OUTPUT_LEN", "TYPE_INT32", (1,)),
    Tensor("BAD_WORDS_DICT", "TYPE_STRING", (-1,), optional=True),
    Tensor("STOP_WORDS_DICT", "TYPE_STRING", (-1,), optional=True),
    Tensor("EMBEDDING_BIAS_WORDS", "TYPE_STRING", (-1,), optional=True),
    Tensor("EMBEDDING_BIAS_WEIGHTS", "TYPE_FP32", (-1,), optional=True),
    Tensor("END_ID", "TYPE_INT32", (1,), optional=True),
    Tensor("PAD_ID", "TYPE_INT32", (1,), optional=True),
)
PRE_OUTPUTS: tuple[Tensor, ...] = (
    Tensor("INPUT_ID", "TYPE_INT32", (-1,)),
    Tensor("REQUEST_INPUT_LEN", "TYPE_INT32", (1,)),
    # NVIDIA's preprocessing always emits these (the pad id, length 1, without DECODER_QUERY) and its clients
    # pass DECODER_INPUT_ID on as decoder_input_ids, which a decoder-only engine does not read.
    Tensor("DECODER_INPUT_ID", "TYPE_INT32", (-1,)),
    Tensor("REQUEST_DECODER_INPUT_LEN", "TYPE_INT32", (1,)),
    Tensor("BAD_WORDS_IDS", "TYPE_INT32", (2, -1)),
    Tensor("STOP_WORDS_IDS", "TYPE_INT32", (2, -1)),
    Tensor("EMBEDDING_BIAS", "TYPE_FP32", (-1,)),
    Tensor("REQUEST_OUTPUT_LEN", "TYPE_INT32", (-1,)),
    Tensor("OUT_END_ID", "TYPE_INT32", (1,)),
    Tensor("OUT_PAD_ID", "TYPE_INT32", (1,)),
)

# postprocessing: OUTPUT holds one string per sequence, batch x beam flattened, as NVIDIA's model returns it
POST_INPUTS: tuple[Tensor, ...] = (
    Tensor("TOKENS_BATCH", "TYPE_INT32", (-1, -1)),  # [beam, len]
    Tensor("SEQUENCE_LENGTH", "TYPE_INT32", (-1,)),  # [beam]
)
POST_OUTPUTS: tuple[Tensor, ...] = (Tensor("OUTPUT", "TYPE_STRING", (-1,)),)

# The request-level text inputs shared by the ensemble and the BLS, text only.
_TEXT_INPUTS: tuple[Tensor, ...] = (
    Tensor("text_input", "TYPE_STRING", (1,)),
    Tensor("max_tokens", "TYPE_INT32", (1,)),
    Tensor("bad_words", "TYPE_STRING", (-1,), optional=True),
    Tensor("stop_words", "TYPE_STRING", (-1,), optional=True),
    Tensor("exclude_input_in_output", "TYPE_BOOL", (1,), optional=True),
    Tensor("end_id", "TYPE_INT32", (1,), optional=True),
    Tensor("pad_id", "TYPE_INT32", (1,), optional=True),
    Tensor("top_k", "TYPE_INT32", (1,), optional=True),
    Tensor("top_p", "TYPE_FP32", (1,), optional=True),
    Tensor("temperature", "TYPE_FP32", (1,), optional=True),
    Tensor("length_penalty", "TYPE_FP32", (1,), optional=True),
    Tensor("repetition_penalty", "TYPE_FP32", (1,), optional=True),
    Tensor("min_tokens", "TYPE_INT32", (1,), optional=True),
    Tensor("presence_penalty", "TYPE_FP32", (1,), optional=True),
    Tensor("frequency_penalty", "TYPE_FP32", (1,), optional=True),
    Tensor("seed", "TYPE_UINT64", (1,), optional=True),
    Tensor("return_log_probs", "TYPE_BOOL", (1,), optional=True),
    Tensor("return_context_logits", "TYPE_BOOL", (1,), optional=True),
    Tensor("return_generation_logits", "TYPE_BOOL", (1,), optional=True),
    Tensor("return_perf_metrics", "TYPE_BOOL", (1,), optional=True),
    Tensor("return_num_input_tokens", "TYPE_BOOL", (1,), optional=True),
    Tensor("return_num_output_tokens", "TYPE_BOOL", (1,), optional=True),
    Tensor("beam_width", "TYPE_INT32", (1,), optional=True),
    Tensor("stream", "TYPE_BOOL", (1,), optional=True),
    Tensor("embedding_bias_words", "TYPE_STRING", (-1,), optional=True),
    Tensor("embedding_bias_weights", "TYPE_FP32", (-1,), optional=True),
)

ENSEMBLE_INPUTS = _TEXT_INPUTS
ENSEMBLE_OUTPUTS: tuple[Tensor, ...] = (
    Tensor("text_output", "TYPE_STRING", (-1,)),
    Tensor("sequence_length", "TYPE_INT32", (-1,)),
    # NVIDIA's ensemble passes the target's logits on, declared with the deployment's logits type
    Tensor("context_logits", LOGITS, (-1, -1)),
    Tensor("generation_logits", LOGITS, (-1, -1, -1)),
)

BLS_INPUTS: tuple[Tensor, ...] = _TEXT_INPUTS + (
    Tensor("num_return_sequences", "TYPE_INT32", (1,), optional=True),
    Tensor("num_draft_tokens", "TYPE_INT32", (1,), optional=True),  # K; 0 = target only
    Tensor("use_draft_logits", "TYPE_BOOL", (1,), optional=True),
    # structured output, NVIDIA's names (its BLS and tensorrt_llm model declare them): json, json_schema, regex,
    # ebnf_grammar, and the guide's text; specbuild's BLS applies the guide itself (speculative.guide)
    Tensor("guided_decoding_guide_type", "TYPE_STRING", (1,), optional=True),
    Tensor("guided_decoding_guide", "TYPE_STRING", (1,), optional=True),
)
BLS_OUTPUTS: tuple[Tensor, ...] = (
    Tensor("text_output", "TYPE_STRING", (-1,)),
    Tensor("cum_log_probs", "TYPE_FP32", (-1,)),
    Tensor("output_log_probs", "TYPE_FP32", (-1, -1)),
    Tensor("context_logits", LOGITS, (-1, -1)),
    Tensor("generation_logits", LOGITS, (-1, -1, -1)),
    Tensor("batch_index", "TYPE_INT32", (1,)),
    Tensor("sequence_index", "TYPE_INT32", (1,)),
    Tensor("acceptance_rate", "TYPE_FP32", (1,)),
    Tensor("total_accepted_draft_tokens", "TYPE_INT32", (1,)),
    Tensor("total_draft_tokens", "TYPE_INT32", (1,)),
    Tensor("num_input_tokens", "TYPE_INT32", (1,)),
    Tensor("num_output_tokens", "TYPE_INT32", (1,)),
    # specbuild's extras (not in NVIDIA's BLS). finish_reason / stop_reason: NVIDIA's LLM API names and values
    # ("stop" | "length" | "cancelled"; the matched stop word), on the final response (specbuild.decode.generation)
    Tensor("finish_reason", "TYPE_STRING", (1,)),
    Tensor("stop_reason", "TYPE_STRING", (1,)),
    Tensor("output_ids", "TYPE_INT32", (-1,)),  # the generated token ids so far
    Tensor("mean_accepted_len", "TYPE_FP32", (1,)),  # tokens per target step, bonus/recovered included
    Tensor("speculation_stats", "TYPE_STRING", (1,)),  # JSON: drafted, accepted, per-position acceptance, ...
)

NUMPY_DTYPES = {
    "TYPE_BOOL": "bool",
    "TYPE_UINT8": "uint8",
    "TYPE_INT32": "int32",
    "TYPE_INT64": "int64",
    "TYPE_UINT64": "uint64",
    "TYPE_FP16": "float16",
    "TYPE_FP32": "float32",
    "TYPE_STRING": "object",
}

# The BLS's final response: every output it sends there besides text_output (stop_reason only when a stop word
# ended the request), in BLS_OUTPUTS' types. The BLS builds its tensors from this table (`final_values`) and the
# client reads the same names (specbuild.triton.client), so an output added here is sent and read.
BLS_FINAL_OUTPUTS = (
    "finish_reason",
    "stop_reason",
    "acceptance_rate",
    "total_accepted_draft_tokens",
    "total_draft_tokens",
    "mean_accepted_len",
    "num_input_tokens",
    "num_output_tokens",
    "output_ids",
    "speculation_stats",
)
JSON_OUTPUTS = ("speculation_stats",)  # a TYPE_STRING output holding one JSON document


BLS_OUTPUT = {t.name: t for t in BLS_OUTPUTS}


def final_values(values: dict[str, object]) -> dict[str, object]:
    """The BLS's final-response outputs as numpy arrays with the batch dimension of 1, typed by BLS_OUTPUTS: a
    value per name of BLS_FINAL_OUTPUTS (None: not sent); strings encoded, JSON documents dumped."""
    import json

    import numpy as np

    unknown = sorted(set(values) - set(BLS_FINAL_OUTPUTS))
    missing = sorted(set(BLS_FINAL_OUTPUTS) - set(values))
    if unknown or missing:
        raise ValueError(
            f"the BLS's final response must give exactly BLS_FINAL_OUTPUTS: unknown {unknown}, missing {missing}"
        )
    arrays = {}
    for name in BLS_FINAL_OUTPUTS:
        value = values[name]
        if value is None:
            continue
        tensor = BLS_OUTPUT[name]
        if name in JSON_OUTPUTS:
            value = json.dumps(value)
        if tensor.dtype == "TYPE_STRING":
            value = value.encode("utf-8") if isinstance(value, str) else value
        arrays[name] = np.array(value, dtype=NUMPY_DTYPES[tensor.dtype]).reshape(1, -1)  # a list or one value
    return arrays
