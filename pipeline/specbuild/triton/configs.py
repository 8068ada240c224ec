"""Triton `config.pbtxt` for every model of the repository, built as typed `ModelConfig` messages.

Each builder takes a fully resolved `RepoSettings` and returns a `model_config_pb2.ModelConfig`;
`contract.pbtxt.to_pbtxt` writes it in protobuf text format. Nothing is templated: every value is known at
generation time, and a missing one raises `SpecError` here, so no `${...}` placeholder can reach
the server (NVIDIA's `tools/fill_template.py` leaves unfilled placeholders in place).

Two flavours of the two LLM models (`tensorrt_llm` target, `tensorrt_llm_draft` draft):
- "trtllm": the C++ `tensorrtllm` backend with the parameters of NVIDIA's `tensorrt_llm/config.pbtxt`
  template (TensorRT-LLM 1.2 names);
- "reference": the Python backend serving specbuild's PyTorch reference runtime behind the same
  tensor contract (`specbuild.contract.tensors.LLM_INPUTS/OUTPUTS`) and the same required parameters.

Empty values: the C++ backend reads `tokenizer_dir`, `guided_decoding_backend` and
`xgrammar_tokenizer_info_path` with no fallback, so the LLM configs must carry them, and an empty
value means "not set" there (NVIDIA/TensorRT-LLM `triton_backend/inflight_batcher_llm/src/
model_instance_state.cc` `getGuidedDecodingConfigFromParams`, commit c8c6df0). These three keys, in
the LLM configs only, are the only values allowed to be empty.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from specbuild import backends
from specbuild.contract import models
from specbuild.contract import serving_gate as gate
from specbuild.contract import tensors as T
from specbuild.contract.bls_params import BlsParameters
from specbuild.contract.pbtxt import config_proto as _pb
from specbuild.drafters import LookupSettings
from specbuild.errors import SpecError
from specbuild.speculative.overlap import parse_setting

if TYPE_CHECKING:  # tritonclient is imported lazily: `specbuild repo --help` must not need it
    from tritonclient.grpc import model_config_pb2

BACKENDS = backends.ENGINE_BACKENDS  # the two flavours of the BLS repository
MODEL_NAMES = (
    models.PREPROCESSING,
    models.POSTPROCESSING,
    models.TARGET,
    models.DRAFT,
    models.BLS,
    models.ENSEMBLE,
    gate.MODEL_NAME,
)
LLM_MODEL = {"target": models.TARGET, "draft": models.DRAFT}
EXECUTOR_WORKER = "/opt/tritonserver/backends/tensorrtllm/trtllmExecutorWorker"  # the template's fixed value
# Read with no fallback by the C++ backend; empty = not set (guided decoding off). Allowed empty, nowhere else.
UNSET_LLM_PARAMS = {"tokenizer_dir": "", "guided_decoding_backend": "", "xgrammar_tokenizer_info_path": ""}


@dataclass(frozen=True)
class LlmSettings:
    role: str  # "target" | "draft"
    engine_dir: str  # trtllm: absolute path inside the GPU image; reference: relative to the repository
    kv_cache_free_gpu_mem_fraction: float  # fraction of free GPU memory for this model's KV cache (trtllm)
    max_tokens_in_paged_kv_cache: int | None  # the memory plan's cap for this model; None = fraction only
    gpu_device_ids: str  # "0" or "0,1" (tensor parallel); ';' would separate instances


@dataclass(frozen=True)
class RepoSettings:
    backend: str  # one of BACKENDS
    pair: str  # the spec's name
    max_batch_size: int
    max_draft_len: int
    max_input_len: int  # longest prompt the engines take
    max_output_len: int  # most tokens one request may ask for (max_seq_len - max_input_len)
    num_draft_tokens: int  # default K of the BLS
    use_draft_logits: bool
    adaptive: bool
    overlap: str  # "true" | "false" | "auto": the BLS's schedule (the spec's speculative.overlap)
    drafter: str  # what proposes by default (the spec's speculative.drafter)
    lookup: LookupSettings  # prompt lookup's settings (the spec's [lookup])
    logits_datatype: str  # "TYPE_FP32" | "TYPE_FP16": the engines' logits dtype (specbuild.contract.logits)
    bls_decoupled: bool  # the BLS streams accepted tokens (decoupled transaction policy)
    max_queue_delay_microseconds: int
    max_queue_size: int  # requests waiting for a BLS slot, all instances together (bls_queue_size); 0 = unbounded
    target_retry_s: int  # seconds a request waits for a failed target to serve again (the spec's serve.target_retry_s)
    preprocessing_instance_count: int
    postprocessing_instance_count: int
    bls_instance_count: int
    tokenizer_dir: str  # absolute, or relative to the repository directory
    target: LlmSettings
    draft: LlmSettings | None  # None: a target-only deployment (no tensorrt_llm_draft model)

    @property
    def roles(self) -> tuple[str, ...]:
        return ("target", "draft") if self.draft is not None else ("target",)

    @property
    def model_names(self) -> tuple[str, ...]:
        """The repository's models: MODEL_NAMES, less tensorrt_llm_draft where there is no draft model."""
        return tuple(name for name in MODEL_NAMES if name != models.DRAFT or self.draft is not None)

    def llm(self, role: str) -> LlmSettings:
        settings = self.target if role == "target" else self.draft
        if settings is None:
            raise SpecError(f"the repository has no {role} model (a target-only deployment).")
        return settings


def _require(name: str, value: object) -> None:
    if value is None or (isinstance(value, str) and (not value.strip() or "${" in value)):
        raise SpecError(
            f"Triton config value {name} = {value!r} is missing or a placeholder: every value must be "
            "filled at generation time. Check the spec and the stage manifests."
        )


def add_tensors(pb, repeated, table: tuple[T.Tensor, ...], logits_datatype: str) -> None:
    """Declare a tensor table (contract.tensors) in a config's input or output list, as Triton reads it."""
    for t in table:
        dtype = logits_datatype if t.dtype == T.LOGITS else t.dtype
        entry = repeated.add(name=t.name, data_type=pb.DataType.Value(dtype), dims=list(t.dims))
        if t.optional and hasattr(entry, "optional"):
            entry.optional = True
        if t.ragged and hasattr(entry, "allow_ragged_batch"):
            entry.allow_ragged_batch = True
        if t.scalar and hasattr(entry, "reshape"):
            entry.reshape.SetInParent()  # shape [] : the batch dimension only


# Every model's dynamic batcher keeps the queue policy's defaults: no max_queue_size, no timeout, no priority
# levels. The source of the bundled tritonserver 2.51 (triton-inference-server/core, branch r24.10) shows why:
# - The policy alone picks how the batcher hands a batch to an instance (src/scheduler_utils.cc,
#   PriorityQueue::PriorityQueue sets support_prefetching_ only for the defaults). With them it prefetches: it queues
#   a batch at the rate limiter while the instances are busy, up to two per instance (src/rate_limiter.cc,
#   RateLimiter::PayloadSlotAvailable), and a freed instance takes it under the rate limiter's own lock and
#   condition variable (RateLimiter::DequeuePayload). Enqueue queues the request under the batcher's lock and wakes
#   it whenever fewer batches wait, so no request waits for a wake-up beside an idle instance. (The batcher waits
#   only once two batches per instance already wait; each one taken or run then wakes it.)
# - With a bound (or a timeout, or priorities) it does not prefetch: it builds a batch only when an instance is
#   already waiting for one (PayloadSlotAvailable: WaitingConsumerCount > 0), otherwise it sleeps on its own
#   condition variable for up to 500 ms (src/dynamic_batch_scheduler.cc, BatcherThread ->
#   WaitForPayloadSlotAvailable(default_wait_microseconds = 500 * 1000)); Enqueue wakes it only if an instance
#   waits right then. A freed instance wakes it too early: the instance's thread signals the batcher when the batch
#   has run (src/payload.cc, Payload::Execute -> Callback), and only afterwards waits for work again
#   (src/backend_model_instance.cc, TritonBackendThread::BackendThread -> RateLimiter::DequeuePayload ->
#   src/instance_queue.cc InstanceQueue::IncrementConsumerCount, which signals nothing the batcher waits on). A
#   batcher that looks in between finds no waiting instance and sleeps the 500 ms: a request that arrived while the
#   model's instance was busy (two requests meeting at one model) waits 0.5 s beside an idle instance.
# No max_queue_delay closes that window (the batcher waits for the instance before it looks at the delay) and more
# instances only make it rarer (a floor of 100 us on the delay, used before, lowered the rate, measured, and did not
# remove it). So no model gets a policy (the C++ tensorrtllm models included: the batcher is the same; NVIDIA's
# template writes a max_queue_size), and the bound on waiting requests is the BLS's own (its `max_queue_size`
# parameter, specbuild.triton.models.bls). Measured with scripts/batcher_stall_probe.py.


def prefetches(batching) -> bool:
    """Whether a `dynamic_batching` message keeps Triton's batcher on the prefetching path (the queue policy's
    defaults, core r24.10 src/scheduler_utils.cc PriorityQueue::PriorityQueue), where it never waits for a free
    instance to wake it (see the comment above)."""
    policy = batching.default_queue_policy
    return (
        batching.priority_levels == 0
        and policy.max_queue_size == 0
        and policy.default_timeout_microseconds == 0
        and not policy.allow_timeout_override
    )


def add_dynamic_batching(config, max_queue_delay_us: int, preferred_batch_size: int | None) -> None:
    """The dynamic batcher every model of the repository gets (and scripts/batcher_stall_probe.py measures): the
    spec's delay, the preferred batch size if any, and no queue policy (see the comment above)."""
    batching = config.dynamic_batching
    batching.SetInParent()
    if preferred_batch_size is not None:
        batching.preferred_batch_size.append(preferred_batch_size)
    batching.max_queue_delay_microseconds = max_queue_delay_us


def bls_queue_size(s: RepoSettings) -> int:
    """Requests each BLS instance keeps waiting for a slot before it refuses more (the spec's bound split over the
    instances, rounded up); 0 = no bound."""
    return -(-s.max_queue_size // s.bls_instance_count)


def _params(config, values: dict[str, str], may_be_empty: tuple[str, ...] = ()) -> None:
    for key, value in values.items():
        if not (key in may_be_empty and value == ""):
            _require(f"{config.name}.parameters[{key}]", value)
        config.parameters[key].string_value = value


def _cpu_instances(pb, config, count: int) -> None:
    config.instance_group.add(count=count, kind=pb.ModelInstanceGroup.KIND_CPU)


def _bool(value: bool) -> str:
    return "true" if value else "false"


def preprocessing(s: RepoSettings) -> model_config_pb2.ModelConfig:
    pb = _pb()
    c = pb.ModelConfig(name="preprocessing", backend="python", max_batch_size=s.max_batch_size)
    add_dynamic_batching(c, s.max_queue_delay_microseconds, s.max_batch_size)
    add_tensors(pb, c.input, T.PRE_INPUTS, s.logits_datatype)
    add_tensors(pb, c.output, T.PRE_OUTPUTS, s.logits_datatype)
    _params(c, {"tokenizer_dir": s.tokenizer_dir, "add_special_tokens": "true", gate.GATE_PARAMETER: gate.MODEL_NAME})
    _cpu_instances(pb, c, s.preprocessing_instance_count)
    return c


def postprocessing(s: RepoSettings) -> model_config_pb2.ModelConfig:
    pb = _pb()
    c = pb.ModelConfig(name="postprocessing", backend="python", max_batch_size=s.max_batch_size)
    add_dynamic_batching(c, s.max_queue_delay_microseconds, s.max_batch_size)
    add_tensors(pb, c.input, T.POST_INPUTS, s.logits_datatype)
    add_tensors(pb, c.output, T.POST_OUTPUTS, s.logits_datatype)
    _params(c, {"tokenizer_dir": s.tokenizer_dir, "skip_special_tokens": "true"})
    _cpu_instances(pb, c, s.postprocessing_instance_count)
    return c


def trtllm_parameters(s: RepoSettings, role: str) -> dict[str, str]:
    """The `tensorrtllm` backend parameters: the keys of NVIDIA's template, the values of its draft/target recipe
    (NVIDIA/TensorRT-LLM `examples/draft_target_model/README.md`)."""
    llm = s.llm(role)
    if not 0.0 < llm.kv_cache_free_gpu_mem_fraction < 1.0:
        raise SpecError(
            f"kv_cache_free_gpu_mem_fraction for the {role} = {llm.kv_cache_free_gpu_mem_fraction}: "
            "must be between 0 and 1. Re-run `specbuild check` for the memory plan."
        )
    params = {
        "max_beam_width": "1",  # draft/target speculative decoding has no beam search
        "FORCE_CPU_ONLY_INPUT_TENSORS": "no",
        "gpt_model_type": "inflight_fused_batching",
        "gpt_model_path": llm.engine_dir,
        "batch_scheduler_policy": "guaranteed_no_evict",
        "kv_cache_free_gpu_mem_fraction": f"{llm.kv_cache_free_gpu_mem_fraction:.4g}",
        "enable_kv_cache_reuse": "true",  # required: the BLS re-sends the growing sequence every step
        "exclude_input_in_output": "false",  # the BLS slices drafts out of prompt + output
        "gpu_device_ids": llm.gpu_device_ids,
        "executor_worker_path": EXECUTOR_WORKER,
        "normalize_log_probs": "true",
        "enable_chunked_context": "false",
        "cancellation_check_period_ms": "100",
        # fast logits need the orchestrator with spawned processes disabled (model_instance_state.cc turns it off)
        "speculative_decoding_fast_logits": "false",
        **UNSET_LLM_PARAMS,
    }
    if llm.max_tokens_in_paged_kv_cache is not None:  # the plan's fractions hold in either load order only with it
        params["max_tokens_in_paged_kv_cache"] = str(llm.max_tokens_in_paged_kv_cache)
    return params


def llm(s: RepoSettings, role: str) -> model_config_pb2.ModelConfig:
    """`tensorrt_llm` (target) or `tensorrt_llm_draft`: identical tensors, per-role parameters."""
    pb = _pb()
    if role not in LLM_MODEL:
        raise SpecError(f"unknown role {role!r}: use 'target' or 'draft'.")
    llm_settings = s.llm(role)
    _require(f"{role} engine_dir", llm_settings.engine_dir)
    backend = backends.get(s.backend).triton_backend
    c = pb.ModelConfig(name=LLM_MODEL[role], backend=backend, max_batch_size=s.max_batch_size)
    # Not decoupled: the BLS calls each model once per draft or verify step and waits for the result.
    c.model_transaction_policy.SetInParent()
    c.model_transaction_policy.decoupled = False
    add_dynamic_batching(c, s.max_queue_delay_microseconds, s.max_batch_size)
    add_tensors(pb, c.input, T.LLM_INPUTS, s.logits_datatype)
    add_tensors(pb, c.output, T.LLM_OUTPUTS, s.logits_datatype)
    _cpu_instances(pb, c, 1)
    if backend == "tensorrtllm":
        _params(c, trtllm_parameters(s, role), may_be_empty=tuple(UNSET_LLM_PARAMS))
    else:  # the keys the reference model reads, by the C++ backend's rules (specbuild.contract.backend_params)
        _params(
            c,
            {
                "gpt_model_type": "inflight_fused_batching",
                "gpt_model_path": llm_settings.engine_dir,
                "max_beam_width": "1",
                "exclude_input_in_output": "false",
                **UNSET_LLM_PARAMS,
            },
            may_be_empty=tuple(UNSET_LLM_PARAMS),
        )
    return c


def bls(s: RepoSettings) -> model_config_pb2.ModelConfig:
    pb = _pb()
    if s.num_draft_tokens > s.max_draft_len:
        raise SpecError(
            f"num_draft_tokens = {s.num_draft_tokens} exceeds max_draft_len = {s.max_draft_len}: "
            "lower speculative.num_draft_tokens in the spec."
        )
    c = pb.ModelConfig(name=models.BLS, backend="python", max_batch_size=s.max_batch_size)
    c.model_transaction_policy.SetInParent()
    c.model_transaction_policy.decoupled = s.bls_decoupled
    # Its queue is its own: execute never waits, the BLS runs max_concurrent_requests at once, keeps up to
    # max_queue_size more waiting and refuses the rest (specbuild.triton.models.bls); Triton's batcher in front has
    # no bound (see dynamic_batching above).
    add_dynamic_batching(c, s.max_queue_delay_microseconds, None)
    add_tensors(pb, c.input, T.BLS_INPUTS, s.logits_datatype)
    add_tensors(pb, c.output, T.BLS_OUTPUTS, s.logits_datatype)
    _params(
        c,
        BlsParameters(
            tensorrt_llm_model_name=LLM_MODEL["target"],
            # "" where there is no draft model: NVIDIA's BLS reads an empty name the same way
            tensorrt_llm_draft_model_name=LLM_MODEL["draft"] if s.draft is not None else "",
            max_draft_len=s.max_draft_len,
            num_draft_tokens=s.num_draft_tokens,
            max_input_len=s.max_input_len,
            max_output_len=s.max_output_len,
            use_draft_logits=s.use_draft_logits,
            adaptive_draft_len=s.adaptive,
            # "auto": where the two model processes get a core each (the BLS decides when it loads, and per request; a
            # request may send its own `overlap`)
            overlap=parse_setting(s.overlap, "speculative.overlap"),
            tokenizer_dir=s.tokenizer_dir,  # the BLS tokenizes and detokenizes in-process, by pre/postprocessing's rules
            add_special_tokens=True,  # as preprocessing's
            # requests served at once (a thread each); the engines batch up to this many. Up to max_queue_size more wait
            # in the BLS for a slot; past that it answers UNAVAILABLE "Exceeds maximum queue size" (0 = no bound).
            max_concurrent_requests=s.max_batch_size,
            max_queue_size=bls_queue_size(s),
            target_retry_s=s.target_retry_s,
            serving_gate=gate.MODEL_NAME,  # closed by the drain: new requests are then refused UNAVAILABLE
            drafter=s.drafter,
            **BlsParameters.lookup_parameters(s.lookup),
        ).to_parameters(),
        may_be_empty=("tensorrt_llm_draft_model_name",),
    )
    _cpu_instances(pb, c, s.bls_instance_count)
    return c


# ensemble wiring (NVIDIA's ensemble, text only): ensemble input -> preprocessing / tensorrt_llm input
_PRE_MAP = {
    "QUERY": "text_input",
    "REQUEST_OUTPUT_LEN": "max_tokens",
    "BAD_WORDS_DICT": "bad_words",
    "STOP_WORDS_DICT": "stop_words",
    "EMBEDDING_BIAS_WORDS": "embedding_bias_words",
    "EMBEDDING_BIAS_WEIGHTS": "embedding_bias_weights",
    "END_ID": "end_id",
    "PAD_ID": "pad_id",
}
_PRE_OUT = {
    "INPUT_ID": "_INPUT_ID",
    "REQUEST_INPUT_LEN": "_REQUEST_INPUT_LEN",
    "REQUEST_OUTPUT_LEN": "_REQUEST_OUTPUT_LEN",
    "STOP_WORDS_IDS": "_STOP_WORDS_IDS",
    "BAD_WORDS_IDS": "_BAD_WORDS_IDS",
    "EMBEDDING_BIAS": "_EMBEDDING_BIAS",
    "OUT_END_ID": "_PREPROCESSOR_END_ID",
    "OUT_PAD_ID": "_PREPROCESSOR_PAD_ID",
    "DECODER_INPUT_ID": "_DECODER_INPUT_ID",
    "REQUEST_DECODER_INPUT_LEN": "_REQUEST_DECODER_INPUT_LEN",
}
_LLM_MAP = {
    "input_ids": "_INPUT_ID",
    "input_lengths": "_REQUEST_INPUT_LEN",
    "request_output_len": "_REQUEST_OUTPUT_LEN",
    "decoder_input_ids": "_DECODER_INPUT_ID",
    "decoder_input_lengths": "_REQUEST_DECODER_INPUT_LEN",
    "end_id": "_PREPROCESSOR_END_ID",
    "pad_id": "_PREPROCESSOR_PAD_ID",
    "embedding_bias": "_EMBEDDING_BIAS",
    "stop_words_list": "_STOP_WORDS_IDS",
    "bad_words_list": "_BAD_WORDS_IDS",
    "exclude_input_in_output": "exclude_input_in_output",
    "runtime_top_k": "top_k",
    "runtime_top_p": "top_p",
    "temperature": "temperature",
    "len_penalty": "length_penalty",
    "repetition_penalty": "repetition_penalty",
    "min_tokens": "min_tokens",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "seed": "seed",
    "return_log_probs": "return_log_probs",
    "return_context_logits": "return_context_logits",
    "return_generation_logits": "return_generation_logits",
    "return_perf_metrics": "return_perf_metrics",
    "return_num_input_tokens": "return_num_input_tokens",
    "return_num_output_tokens": "return_num_output_tokens",
    "beam_width": "beam_width",
    "streaming": "stream",
}
_LLM_OUT = {
    "output_ids": "_TOKENS_BATCH",
    "sequence_length": "sequence_length",
    "context_logits": "context_logits",
    "generation_logits": "generation_logits",
}
_POST_MAP = {"TOKENS_BATCH": "_TOKENS_BATCH", "SEQUENCE_LENGTH": "sequence_length"}
_POST_OUT = {"OUTPUT": "text_output"}


def ensemble(s: RepoSettings) -> model_config_pb2.ModelConfig:
    """Target-only baseline: preprocessing -> tensorrt_llm -> postprocessing (no speculation)."""
    pb = _pb()
    c = pb.ModelConfig(name="ensemble", platform="ensemble", max_batch_size=s.max_batch_size)
    add_tensors(pb, c.input, T.ENSEMBLE_INPUTS, s.logits_datatype)
    add_tensors(pb, c.output, T.ENSEMBLE_OUTPUTS, s.logits_datatype)
    for model, inputs, outputs in (
        ("preprocessing", _PRE_MAP, _PRE_OUT),
        (LLM_MODEL["target"], _LLM_MAP, _LLM_OUT),
        ("postprocessing", _POST_MAP, _POST_OUT),
    ):
        step = c.ensemble_scheduling.step.add(model_name=model, model_version=-1)
        for key, value in inputs.items():
            step.input_map[key] = value
        for key, value in outputs.items():
            step.output_map[key] = value
    return c


def build_all(s: RepoSettings) -> dict[str, model_config_pb2.ModelConfig]:
    if s.backend not in BACKENDS:
        raise SpecError(f"backend = {s.backend!r} is not supported. Choose one of: {', '.join(BACKENDS)}.")
    _require("tokenizer_dir", s.tokenizer_dir)
    built = {
        "preprocessing": preprocessing(s),
        "postprocessing": postprocessing(s),
        **{LLM_MODEL[role]: llm(s, role) for role in s.roles},
        models.BLS: bls(s),
        "ensemble": ensemble(s),
        gate.MODEL_NAME: gate.model_config(),  # READY while the deployment takes new requests
    }
    return {name: built[name] for name in s.model_names}
