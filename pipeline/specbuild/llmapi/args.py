"""The LLM arguments of a spec: one mapping, written as Triton's model.yaml and as trtllm-serve's
--extra_llm_api_options file, checked key by key against the pinned release (`contract`).

Values (TensorRT-LLM 1.2 LLM-argument names, `contract` ARGS):
- model / speculative_config.speculative_model_dir: the target's and the draft's Hugging Face checkpoint
  folders written by `specbuild convert --backend llmapi`, as the server will see them;
- backend "pytorch" (draft/target decoding runs only there: DraftTargetDecodingConfig.supports_backend);
- tensor/pipeline_parallel_size, max_batch_size, max_input_len, max_seq_len, max_num_tokens from [build];
- kv_cache_config: free_gpu_memory_fraction (the spec's, else TensorRT-LLM's default 0.9,
  which the memory plan also uses) and enable_block_reuse;
- speculative_config: decoding_type "DraftTarget" (speculative.drafter "model") or "NGram" with [lookup]'s
  max_matching_ngram_size, is_keep_all, is_use_oldest, is_public_pool (drafter "lookup"; no draft model), and
  max_draft_len = the spec's num_draft_tokens; the hybrid has no equivalent and is refused. The LLM
  API drafts exactly max_draft_len tokens at every step and has no per-request K, so the K a request would
  use by default is what this path writes; num_draft_tokens = 0 writes no speculative_config (target only);
- disable_overlap_scheduler: true, as NVIDIA's draft/target examples run it.

No torch and no YAML library: `render_yaml` writes them with `specbuild.yamltext` (strings quoted).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from specbuild import drafters, yamltext
from specbuild.config import Spec
from specbuild.contract import llmapi as contract
from specbuild.errors import SpecError


@dataclass(frozen=True)
class Locations:
    target: str  # the target's HF checkpoint folder, as the server sees it
    draft: str | None  # the draft's; None: a target-only deployment


def locations(spec: Spec, folder: Callable[[str], Any]) -> Locations:
    """Where the server sees each role's checkpoint: folder(role) for each model the spec has."""
    return Locations(str(folder("target")), str(folder("draft")) if spec.draft is not None else None)


def kv_fraction(spec: Spec) -> tuple[float, str]:
    """The KV-cache fraction to write and where it came from (no checkpoint needs to be readable)."""
    if spec.llmapi.free_gpu_memory_fraction is not None:
        return spec.llmapi.free_gpu_memory_fraction, "spec"
    return contract.KV_CACHE_DEFAULT_FRACTION, "TensorRT-LLM default"


def check_spec(spec: Spec) -> None:
    """What this path refuses before any work (SpecError naming the key and the fix)."""
    if refusal := drafters.path_refusal(spec.speculative.drafter, "llmapi"):
        raise SpecError(f"{refusal[0]}: {refusal[1]}.")
    for role in spec.roles:
        model = spec.role(role)
        if model.quantization not in contract.QUANTIZATIONS:
            raise SpecError(
                f"{role}.quantization = {model.quantization!r} is not supported on the LLM API path: it exports and "
                f"verifies pre-quantized Hugging Face checkpoints in {', '.join(contract.QUANTIZATIONS)} (FP8 is what "
                'TensorRT-LLM\'s PyTorch backend documents for modelopt checkpoints). Use quantization = "fp8" or '
                '"none", or the engine path (--backend trtllm).'
            )
        if model.kv_cache not in contract.KV_CACHE_DTYPES:
            raise SpecError(f"{role}.kv_cache = {model.kv_cache!r}: the LLM API path takes none or fp8.")
        if model.dtype not in ("float16", "bfloat16"):
            raise SpecError(
                f"{role}.dtype = {model.dtype!r}: the LLM API path exports float16 or bfloat16 checkpoints. "
                'Set dtype = "float16" or "bfloat16".'
            )


def llm_args(spec: Spec, where: Locations) -> dict[str, Any]:
    """The LLM(...) keyword arguments, in a stable order."""
    check_spec(spec)
    b, sp = spec.build, spec.speculative
    fraction, _ = kv_fraction(spec)
    args: dict[str, Any] = {
        "model": where.target,
        "backend": "pytorch",
        "tensor_parallel_size": b.tp_size,
        "pipeline_parallel_size": b.pp_size,
        "dtype": spec.target.dtype,
        "trust_remote_code": False,
        "max_batch_size": b.max_batch_size,
        "max_input_len": b.max_input_len,
        "max_seq_len": b.max_seq_len,
        "max_num_tokens": b.max_num_tokens,
        "kv_cache_config": {"free_gpu_memory_fraction": fraction, "enable_block_reuse": spec.llmapi.enable_block_reuse},
        "disable_overlap_scheduler": spec.llmapi.disable_overlap_scheduler,
        "guided_decoding_backend": contract.GUIDED_DECODING_BACKEND,  # structured output (response_format, guides)
    }
    if sp.num_draft_tokens > 0 and sp.drafter == "lookup":
        args["speculative_config"] = {
            contract.DECODING_TYPE_KEY: contract.NGRAM_DECODING_TYPE,
            "max_draft_len": sp.num_draft_tokens,
            **{name: getattr(spec.lookup, name) for name in contract.NGRAM_FIELDS},
        }
    elif sp.num_draft_tokens > 0:
        decoding_type, draft_key = contract.SPELLINGS[spelling()]
        args["speculative_config"] = {
            contract.DECODING_TYPE_KEY: decoding_type,
            "max_draft_len": sp.num_draft_tokens,
            draft_key: where.draft,
        }
    validate_llm_args(args)
    return args


def spelling() -> str:
    """The speculative config spelling to write: the one the GPU image's probe recorded for the installed TensorRT-LLM
    (`contract.SPELLING_RECORD`, or the file $SPECBUILD_LLMAPI_SPELLING names), else the pinned release's."""
    path, record = contract.probe_record()
    if record is None:
        return "pinned"
    recorded = record.get("spelling")
    if recorded not in contract.SPELLINGS:
        raise SpecError(
            f"{path} records the speculative config spelling {recorded!r}; expected one of "
            f"{', '.join(contract.SPELLINGS)}. Rebuild the image (its probe writes the record)."
        )
    return recorded


def validate_llm_args(args: dict[str, Any]) -> None:
    """The checks the pinned release makes on these arguments (SpecError instead of its pydantic/assert errors)."""
    spelled = spelling()  # the installed release's (the image's probe recorded it), else the pinned release's
    unknown = contract.unknown_llm_args(args, spelled)
    if unknown:
        raise SpecError(
            f"LLM arguments {unknown} are not fields of TensorRT-LLM {contract.RELEASE}'s LLM arguments "
            "(extra keys are forbidden). This is a bug in specbuild."
        )
    if not args.get("model"):
        raise SpecError("LLM argument 'model' (the target checkpoint) is empty.")
    fraction = (args.get("kv_cache_config") or {}).get("free_gpu_memory_fraction")
    if fraction is not None and not 0.0 < fraction <= 1.0:
        raise SpecError(f"kv_cache_config.free_gpu_memory_fraction = {fraction}: must be a float between 0 and 1.")
    spec_config = args.get("speculative_config")
    if spec_config is None:
        return
    decoding, draft_key = contract.SPELLINGS[spelled]
    decoding_type = spec_config.get(contract.DECODING_TYPE_KEY)
    if decoding_type not in (contract.DECODING_TYPES if spelled == "pinned" else (decoding,)):
        raise SpecError(f"Invalid decoding type: {decoding_type}")
    if args.get("backend") != "pytorch":
        raise SpecError(f"{contract.MSG_DRAFT_BACKEND} (backend = {args.get('backend')!r}).")
    if not isinstance(spec_config.get("max_draft_len"), int) or spec_config["max_draft_len"] <= 0:
        raise SpecError(f"{contract.MSG_DRAFT_LEN} (got {spec_config.get('max_draft_len')!r}).")
    if decoding_type == contract.NGRAM_DECODING_TYPE:
        return  # prompt lookup: no draft model
    if not spec_config.get(draft_key):
        raise SpecError(contract.MSG_DRAFT_PATH)


def model_yaml_data(spec: Spec, where: Locations) -> dict[str, Any]:
    """Triton's llmapi model.yaml: the LLM arguments plus `triton_config`, read by model.py itself.
    max_batch_size 0: NVIDIA's model takes one prompt per request (model.yaml @c8c6df08, JIRA-4496)."""
    return {**llm_args(spec, where), "triton_config": {"max_batch_size": 0, "decoupled": spec.serve.decoupled}}


def serve_options_data(spec: Spec, where: Locations) -> dict[str, Any]:
    """trtllm-serve's --extra_llm_api_options file: the LLM arguments but `model` and `backend`, which go on
    the command line (serve.py applies this file over its CLI values, so both carry the same numbers)."""
    return {key: value for key, value in llm_args(spec, where).items() if key not in ("model", "backend")}


def render_yaml(data: dict[str, Any], header: str = "") -> str:
    """Block-style YAML (`specbuild.yamltext`, strings quoted) for what model.yaml and the serve options hold."""
    return yamltext.dump(data, header=header)
