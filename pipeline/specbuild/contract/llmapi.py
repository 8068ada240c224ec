"""The contract of the LLM API path, pinned in one place: every NVIDIA name and value that specbuild
writes (model.yaml, trtllm-serve options, config.pbtxt) or serves (the CPU stand-in), with its source.

Pinned release: TensorRT-LLM 1.2.1, the release carried by NVIDIA's Triton TensorRT-LLM images
26.04-26.07 (triton-inference-server/server docs/introduction/compatibility.md @e1db8a6, rows
26.04-26.07 "1.2.1"). The v1.2.1 tag itself could not be read when this was written (the
repository is too large to fetch here and the tag's commits are not indexed), so each entry names
the nearest version read and its era. Where an entry could not be confirmed at 1.2.1 it says so,
and the GPU image checks it at build time (docker/Dockerfile.llmapi).

Sources, as cited below:
- CONFIG:  NVIDIA/TensorRT-LLM triton_backend/all_models/llmapi/tensorrt_llm/config.pbtxt @c8c6df08
           (the 2025 "1.2-era" file; newer mains only add optional LoRA / image_url inputs).
- YAML:    NVIDIA/TensorRT-LLM triton_backend/all_models/llmapi/tensorrt_llm/1/model.yaml @c8c6df08.
- MODEL:   NVIDIA/TensorRT-LLM triton_backend/all_models/llmapi/tensorrt_llm/1/model.py, 2025 version
           (`_execute_single_request`, `_convert_request`, `_create_response`; identical in @044a90d2).
- HELPERS: NVIDIA/TensorRT-LLM triton_backend/all_models/llmapi/tensorrt_llm/1/helpers.py @fab2f90b.
- ARGS:    NVIDIA/TensorRT-LLM tensorrt_llm/llmapi/llm_args.py as on main in Oct-Nov 2025, the code the
           release/1.2 branch was cut from (BaseLlmArgs, TorchLlmArgs, KvCacheConfig,
           DecodingBaseConfig.from_dict, DraftTargetDecodingConfig).
- SERVE:   NVIDIA/TensorRT-LLM tensorrt_llm/commands/serve.py and the trtllm-serve docs
           (nvidia.github.io/TensorRT-LLM/1.0.0rc6/commands/trtllm-serve/trtllm-serve.html).
- LAUNCH:  NVIDIA/TensorRT-LLM tensorrt_llm/llmapi/trtllm-llmapi-launch @020c89e6 and
           docs/source/commands/trtllm-serve/trtllm-serve.rst @0434755f ("Multi-node Serving with Slurm").
- RESULT:  NVIDIA/TensorRT-LLM tensorrt_llm/executor/result.py @005bc848 (CompletionOutput).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specbuild.contract import models
from specbuild.quantization import FORMATS

RELEASE = "1.2.1"
NVIDIA_MODEL_DIR = "/app/all_models/llmapi/tensorrt_llm/1"  # the Triton image's copy of model.py + helpers.py
# (tensorrtllm_backend dockerfile/Dockerfile.triton.trt_llm_backend @r26.05 copies all_models to /app;
#  triton-inference-server/tutorials Feature_Guide/Speculative_Decoding/TRT-LLM/README.md @e848952 uses it)
MODEL_NAME = models.TARGET  # CONFIG: name: "tensorrt_llm", the engine path's target model's name


@dataclass(frozen=True)
class Tensor:
    name: str
    data_type: str  # as config.pbtxt declares it
    dims: tuple[int, ...]
    optional: bool = False
    source: str = "CONFIG"


def _in(name: str, data_type: str, dims: tuple[int, ...] = (1,), optional: bool = True) -> Tensor:
    return Tensor(name, data_type, dims, optional)


# CONFIG `input [...]`, in the file's order. Only text_input is required.
INPUTS: tuple[Tensor, ...] = (
    _in("text_input", "TYPE_STRING", (-1,), optional=False),
    _in("streaming", "TYPE_BOOL"),
    _in("sampling_param_best_of", "TYPE_INT32"),
    _in("sampling_param_temperature", "TYPE_FP32"),
    _in("sampling_param_top_k", "TYPE_INT32"),
    _in("sampling_param_top_p", "TYPE_FP32"),
    _in("sampling_param_frequency_penalty", "TYPE_FP32"),
    _in("sampling_param_presence_penalty", "TYPE_FP32"),
    _in("sampling_param_max_tokens", "TYPE_INT32"),
    _in("sampling_param_stop", "TYPE_STRING", (-1,)),
    _in("sampling_param_seed", "TYPE_UINT64"),
    _in("sampling_param_exclude_input_from_output", "TYPE_BOOL"),
    _in("sampling_param_return_perf_metrics", "TYPE_BOOL"),
    _in("return_finish_reason", "TYPE_BOOL"),
    _in("return_stop_reason", "TYPE_BOOL"),
    _in("return_cumulative_logprob", "TYPE_BOOL"),
    _in("stop", "TYPE_BOOL"),
)

# CONFIG `output [...]`, in the file's order ("arguments from LLM.RequestOutput"). What model.py actually
# sends is in WIRE_TYPES: every output is built with text_output's dtype (np.object_) or from str(...).
OUTPUTS: tuple[Tensor, ...] = (
    Tensor("text_output", "TYPE_STRING", (-1,)),
    Tensor("finish_reason", "TYPE_STRING", (-1,)),
    Tensor("stop_reason", "TYPE_STRING", (-1,)),
    Tensor("cumulative_logprob", "TYPE_FP32", (-1,)),
    Tensor("kv_cache_reused_block", "TYPE_INT32", (-1,)),
    Tensor("kv_cache_missed_block", "TYPE_INT32", (-1,)),
    Tensor("kv_cache_alloc_new_blocks", "TYPE_INT32", (-1,)),
    Tensor("kv_cache_alloc_total_blocks", "TYPE_INT32", (-1,)),
    Tensor("kv_cache_hit_rate", "TYPE_FP32", (-1,)),
    Tensor("arrival_time_ns", "TYPE_INT64", (1,)),
    Tensor("first_scheduled_time_ns", "TYPE_INT64", (1,)),
    Tensor("first_token_time_ns", "TYPE_INT64", (1,)),
    Tensor("last_token_time_ns", "TYPE_INT64", (1,)),
    Tensor("acceptance_rate", "TYPE_FP32", (1,)),
    Tensor("total_accepted_draft_tokens", "TYPE_INT32", (1,)),
    Tensor("total_draft_tokens", "TYPE_INT32", (1,)),
)
# None of them carries token ids or a token count (the model's `_create_response` sends output.text, the reasons and
# the perf metrics only): a client has the text, and `session.served` reports output_ids None, not the text tokenized
# again, and a count that is exact only on finish "length" (max_tokens).


def is_llmapi_config(config: dict | None) -> bool:
    """A model configuration (Triton's JSON form) is this model's: its inputs include text_input and
    sampling_param_max_tokens (the engine path's tensorrt_llm has input_ids, the BLS max_tokens)."""
    names = {item.get("name") for item in (config or {}).get("input", [])}
    return "sampling_param_max_tokens" in names and "text_input" in names


# MODEL `_create_response`: finish/stop reason and cumulative_logprob are np.asarray([str(...)], np.object_);
# the perf metrics np.asarray([value], dtype=self.output_dtype), the dtype of text_output (TYPE_STRING).
# NVIDIA's sample response shows them as JSON strings ("acceptance_rate": "0.0"), tensorrtllm_backend
# docs/llmapi.md @r26.05. So on the wire every output is BYTES.
WIRE_TYPES = {t.name: "BYTES" for t in OUTPUTS}

# MODEL `_create_response`, appended in this order when request_perf_metrics is set
PERF_OUTPUTS = (
    "kv_cache_reused_block",
    "kv_cache_hit_rate",
    "kv_cache_alloc_new_blocks",
    "kv_cache_alloc_total_blocks",
    "kv_cache_missed_block",
    "arrival_time_ns",
    "first_scheduled_time_ns",
    "first_token_time_ns",
    "last_token_time_ns",
    "acceptance_rate",
    "total_accepted_draft_tokens",
    "total_draft_tokens",
)
# MODEL `output_fields`: request input -> output, sent as [str(value)] when the input is true
REASON_OUTPUTS = {
    "return_finish_reason": "finish_reason",
    "return_stop_reason": "stop_reason",
    "return_cumulative_logprob": "cumulative_logprob",
}

# HELPERS get_sampling_params_from_request: sampling_param_<name> -> SamplingParams(<name>=...)
SAMPLING_PARAMS = (
    "best_of",
    "temperature",
    "top_k",
    "top_p",
    "frequency_penalty",
    "presence_penalty",
    "max_tokens",
    "seed",
    "exclude_input_from_output",
    "return_perf_metrics",
)
# HELPERS default_values: applied when the input is absent (others fall back to SamplingParams' own defaults).
# Note: exclude_input_from_output defaults to False here, so text_output starts with the prompt (NVIDIA's
# sample "text_output":"What is ML?\nML is ...", tutorials @e848952 TRT-LLM/README.md L134).
SAMPLING_DEFAULTS = {"best_of": 1, "exclude_input_from_output": False, "return_perf_metrics": False}
# SamplingParams.add_special_tokens ("Whether to add special tokens to the prompt. Defaults to True"); model.py does
# not set it, so the LLM API tokenizes every prompt with the tokenizer's special tokens (a BOS where it adds one).
# NVIDIA/TensorRT-LLM tensorrt_llm/sampling_params.py @000a01d.
ADD_SPECIAL_TOKENS = True
# SamplingParams.max_tokens when the request sends none: 32 in the sampling_params.py versions read (1.x);
# not confirmed at the 1.2.1 tag.
DEFAULT_MAX_TOKENS = 32
# Guided decoding (structured output): SamplingParams.guided_decoding = GuidedDecodingParams(json=<schema: str or
# dict>, regex=, grammar=<EBNF>, json_object=True, structural_tag=), one field at a time ("Only one guide can be used
# for a request"), NVIDIA/TensorRT-LLM tensorrt_llm/sampling_params.py @000a01d; the LLM compiles it with the
# `guided_decoding_backend` LLM argument ("xgrammar": _torch/pyexecutor/grammar_matcher.py XGrammarMatcherFactory,
# json -> compile_json_schema, json_object -> compile_builtin_json_grammar, regex -> compile_regex, grammar ->
# compile_grammar). Each field as the Triton guide type (decode.grammar) that compiles it the same way:
GUIDED_DECODING_BACKEND = "xgrammar"
GUIDED_FIELDS = {"json": "json_schema", "json_object": "json", "regex": "regex", "grammar": "ebnf_grammar"}
GUIDED_UNSUPPORTED = ("structural_tag",)  # xgrammar structural tags: not served by specbuild's stand-ins
# RESULT: CompletionOutput.finish_reason: Optional[Literal['stop', 'length', 'timeout', 'cancelled']];
# END_ID and STOP_WORDS -> 'stop' (stop_reason = the matched stop string), LENGTH -> 'length'.
FINISH_REASONS = ("stop", "length", "timeout", "cancelled")
NOT_FINISHED = "None"  # str(None): what a streamed, unfinished response carries

# MODEL: messages a client can see
MSG_GENERATE = "Error generating request: {error}"
MSG_STREAMING_NOT_DECOUPLED = "Streaming is only supported in decoupled mode."
MSG_STOP_WITHOUT_ID = "A request id must be provided for request cancellation"
MSG_CANCELLED = "Request cancelled by client"
MSG_TEXT_INPUT_MISSING = "text_input is missing from the request"
MSG_TEXT_INPUT_1D = "The current implementation only supports text_input being a 1D tensor."
MSG_SCALAR = "Expected a scalar tensor for tensor {name}"
ERROR_TEXT_OUTPUT = "N/A"  # text_output sent with the error response
CANCELLATION_CHECK_PERIOD_MS = 100  # MODEL initialize: triton_config.cancellation_check_period_ms, default 100

# YAML / MODEL: model.yaml holds LLM arguments plus one `triton_config` table, read by model.py itself.
TRITON_CONFIG_REQUIRED = ("max_batch_size", "decoupled")  # MODEL auto_complete_config indexes both
TRITON_CONFIG_OPTIONAL = ("cancellation_check_period_ms",)

# ARGS: BaseLlmArgs fields (model_config extra = "forbid": any other key fails LLM(...)).
BASE_LLM_ARGS = frozenset(
    {
        "model",
        "tokenizer",
        "tokenizer_mode",
        "skip_tokenizer_init",
        "trust_remote_code",
        "tensor_parallel_size",
        "dtype",
        "revision",
        "tokenizer_revision",
        "pipeline_parallel_size",
        "context_parallel_size",
        "gpus_per_node",
        "moe_cluster_parallel_size",
        "moe_tensor_parallel_size",
        "moe_expert_parallel_size",
        "enable_attention_dp",
        "enable_lm_head_tp_in_adp",
        "cp_config",
        "load_format",
        "fail_fast_on_attention_window_too_large",
        "enable_lora",
        "lora_config",
        "kv_cache_config",
        "enable_chunked_prefill",
        "guided_decoding_backend",
        "batched_logits_processor",
        "iter_stats_max_iterations",
        "request_stats_max_iterations",
        "peft_cache_config",
        "scheduler_config",
        "cache_transceiver_config",
        "sparse_attention_config",
        "speculative_config",
        "max_batch_size",
        "max_input_len",
        "max_seq_len",
        "max_beam_width",
        "max_num_tokens",
        "gather_generation_logits",
        "num_postprocess_workers",
        "postprocess_tokenizer_dir",
        "reasoning_parser",
        "decoding_config",
        "backend",
        "return_perf_metrics",
        "orchestrator_type",
    }
)
# ARGS: TorchLlmArgs(BaseLlmArgs) adds these (the PyTorch backend, `backend: pytorch`).
TORCH_LLM_ARGS = frozenset(
    {
        "build_config",
        "garbage_collection_gen0_threshold",
        "cuda_graph_config",
        "attention_dp_config",
        "disable_overlap_scheduler",
        "moe_config",
        "attn_backend",
        "sampler_type",
        "enable_iter_perf_stats",
        "enable_iter_req_stats",
        "print_iter_log",
        "perf_metrics_max_requests",
        "batch_wait_timeout_ms",
        "batch_wait_timeout_iters",
        "batch_wait_max_tokens_ratio",
        "torch_compile_config",
        "enable_autotuner",
        "enable_layerwise_nvtx_marker",
        "enable_min_latency",
        "stream_interval",
        "force_dynamic_quantization",
        "allreduce_strategy",
        "checkpoint_loader",
        "checkpoint_format",
        "kv_connector_config",
        "mm_encoder_only",
        "ray_worker_extension_cls",
    }
)
LLM_ARGS = BASE_LLM_ARGS | TORCH_LLM_ARGS
# ARGS: KvCacheConfig(StrictBaseModel) fields; free_gpu_memory_fraction default 0.9, "must be a float between 0 and 1"
KV_CACHE_CONFIG = frozenset(
    {
        "enable_block_reuse",
        "max_tokens",
        "max_attention_window",
        "sink_token_length",
        "free_gpu_memory_fraction",
        "host_cache_size",
        "onboard_blocks",
        "cross_kv_cache_fraction",
        "secondary_offload_min_priority",
        "event_buffer_max_size",
        "attention_dp_events_gather_period_ms",
        "enable_partial_reuse",
        "copy_on_partial_reuse",
        "use_uvm",
        "max_gpu_total_bytes",
        "dtype",
        "mamba_ssm_cache_dtype",
        "tokens_per_block",
    }
)
KV_CACHE_DEFAULT_FRACTION = 0.9  # ARGS KvCacheConfig.free_gpu_memory_fraction
KV_TOKENS_PER_BLOCK = 32  # ARGS KvCacheConfig.tokens_per_block
# ARGS: DecodingBaseConfig fields (DraftTargetDecodingConfig adds none). `decoding_type` is not a field in
# this era: DecodingBaseConfig.from_dict pops it and picks the class from it.
DECODING_CONFIG = frozenset(
    {
        "max_draft_len",
        "max_total_draft_tokens",
        "speculative_model_dir",
        "max_concurrency",
        "load_format",
        "acceptance_window",
        "acceptance_length_threshold",
    }
)
DECODING_TYPE_KEY = "decoding_type"
# ARGS DecodingBaseConfig.from_dict's keys: {"MTP", "Medusa", "Eagle", "Lookahead", "NGram", "DraftTarget",
# "SaveState", "UserProvided", "AUTO"}; anything else -> ValueError(f"Invalid decoding type: {decoding_type}").
DECODING_TYPES = ("MTP", "Medusa", "Eagle", "Lookahead", "NGram", "DraftTarget", "SaveState", "UserProvided", "AUTO")
DECODING_TYPE = "DraftTarget"
DRAFT_MODEL_KEY = "speculative_model_dir"
# The spelling of later releases (pydantic discriminator Literal["Draft_Target"], field speculative_model with
# the alias speculative_model_dir; llm_args.py on main from early 2026), used by Triton's tutorial
# (tutorials @e848952 TRT-LLM/README.md L243-246). Not accepted by the from_dict above; whether 1.2.1
# back-ported it is unknown, so the GPU image probes both (docker/Dockerfile.llmapi).
LATER_DECODING_TYPE = "Draft_Target"
LATER_DRAFT_MODEL_KEY = "speculative_model"
# The two spellings, by name; the GPU image's build-time probe (`python -m specbuild.llmapi.probe --write`) records
# which one the installed release takes, and the LLM arguments are written in it (specbuild.llmapi.args.spelling).
SPELLINGS = {"pinned": (DECODING_TYPE, DRAFT_MODEL_KEY), "later": (LATER_DECODING_TYPE, LATER_DRAFT_MODEL_KEY)}
SPELLING_RECORD = "/opt/specbuild/llmapi-spelling.json"  # where the image's probe records it
SPELLING_RECORD_ENV = "SPECBUILD_LLMAPI_SPELLING"  # another place for the record (the tests)

# Prompt lookup on the LLM API (PyTorch backend): NGramDecodingConfig, decoding_type "NGram" in both spellings
# (DecodingBaseConfig.from_dict's key; the later releases' Literal["NGram"]), its fields besides max_draft_len
# (llm_args.py, 1.2-era pydantic version: max_matching_ngram_size PositiveInt default 2, the three flags default
# True). No draft model; the pool has no cap on this path.
NGRAM_DECODING_TYPE = "NGram"
NGRAM_DEFAULTS = {"max_matching_ngram_size": 2, "is_keep_all": True, "is_use_oldest": True, "is_public_pool": True}
NGRAM_FIELDS = tuple(NGRAM_DEFAULTS)
# ARGS BaseLlmArgs.validate_speculative_config for DraftTargetDecodingConfig (asserts, i.e. AssertionError):
MSG_DRAFT_BACKEND = "backend must be 'pytorch' for DraftTarget"  # `assert self.backend in ['pytorch']`
MSG_DRAFT_LEN = "max_draft_len must be > 0"  # `assert self.speculative_config.max_draft_len > 0`
MSG_DRAFT_PATH = "Path to draft model must be specified."
# ARGS CudaGraphConfig fields
CUDA_GRAPH_CONFIG = frozenset({"batch_sizes", "max_batch_size", "enable_padding"})
NESTED = {
    "kv_cache_config": KV_CACHE_CONFIG,
    "speculative_config": DECODING_CONFIG | {DECODING_TYPE_KEY} | set(NGRAM_FIELDS),
    "cuda_graph_config": CUDA_GRAPH_CONFIG,
}
# LLM-API pytorch backend request check (tensorrt_llm/llmapi/llm.py `_check_arguments`, 1.x):
MSG_PROMPT_TOO_LONG = (
    "The sum of prompt length ({prompt_len}), query length (0) should not exceed max_num_tokens ({max_num_tokens})"
)

# SERVE: trtllm-serve [serve] MODEL options specbuild passes. The YAML of --extra_llm_api_options is applied
# over the CLI values (update_llm_args_with_extra_dict); `model` and `backend` stay on the command line.
# --extra_llm_api_options is in every 1.x serve.py read; its newer alias --config is not used.
SERVE_OPTIONS = (
    "--host",
    "--port",
    "--backend",
    "--tp_size",
    "--pp_size",
    "--max_batch_size",
    "--max_num_tokens",
    "--max_seq_len",
    "--kv_cache_free_gpu_memory_fraction",
    "--extra_llm_api_options",
    "--log_level",
)
SERVE_HEALTH = "/health"  # SERVE openai_server.py: GET /health -> 200 when the LLM is up, else 503
SERVE_DEFAULT_PORT = 8000
LAUNCHER = "trtllm-llmapi-launch"  # LAUNCH: rank from SLURM_PROCID / OMPI_COMM_WORLD_RANK / PMI_RANK

# modelopt export for the PyTorch backend (NVIDIA/Model-Optimizer modelopt/torch/export/unified_export_hf.py
# @0.37.0 L498-548, the version TensorRT-LLM 1.2 pins): writes hf_quant_config.json always, with
# "quant_algo": null for an unquantized model, and TensorRT-LLM's loader (llm_utils.py
# ModelLoader._update_from_hf_quant_config) then raises "Pre-quantized checkpoint must have quant_algo."
HF_QUANT_CONFIG = "hf_quant_config.json"
# Quantizations the PyTorch backend documents for pre-quantized modelopt checkpoints that specbuild exports
# and verifies (nvidia.github.io/TensorRT-LLM/1.0.0/features/quantization.html: FP8 on Hopper and newer).
QUANTIZATIONS = tuple(name for name, fmt in FORMATS.items() if fmt.llmapi)  # specbuild.quantization
KV_CACHE_DTYPES = ("none", "fp8")


def unknown_llm_args(args: dict, spelling: str = "pinned") -> list[str]:
    """Keys of an LLM-arguments mapping (model.yaml minus triton_config) that the pinned release rejects,
    as dotted paths, nested tables included; with the later spelling (SPELLINGS), its draft model key is a field."""
    bad = [key for key in args if key not in LLM_ARGS]
    nested = {**NESTED, "speculative_config": NESTED["speculative_config"] | {SPELLINGS[spelling][1]}}
    for key, allowed in nested.items():
        value = args.get(key)
        if isinstance(value, dict):
            bad += [f"{key}.{sub}" for sub in value if sub not in allowed]
    return bad


def probe_record() -> tuple[Path, dict[str, Any] | None]:
    """Where the GPU image's probe records the installed release (`SPELLING_RECORD`, or the file
    $SPECBUILD_LLMAPI_SPELLING names) and what it recorded: {"spelling", "tensorrt_llm"}; None where there is none
    (not in the GPU image)."""
    path = Path(os.environ.get(SPELLING_RECORD_ENV) or SPELLING_RECORD)
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return path, None
    return path, record if isinstance(record, dict) else None


def installed_release() -> str:
    """The TensorRT-LLM release the LLM API path runs on: the one the GPU image's probe recorded, else the pinned one
    (the CPU stand-in stands for the pinned release)."""
    record = probe_record()[1] or {}
    return str(record.get("tensorrt_llm") or RELEASE)
