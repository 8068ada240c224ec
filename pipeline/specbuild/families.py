"""The model families specbuild takes, one record each: which paths carry them, and what differs from Llama.

Every stage reads this table: `check` (its verdict per backend, `support`), `convert` (the same refusals,
before any work), the TensorRT-LLM checkpoint loader (the family's names and stored forms) and the reference
runtime (what it computes differently). Adding a family is its record here and, where the reference runtime
must compute something new, that computation in `reference/model.py`.

Paths:
- the engine path (backends trtllm and reference) converts with modelopt's `export_tensorrt_llm_checkpoint`,
  which writes TensorRT-LLM checkpoints for its decoder types gpt, gemma, llama and qwen only
  (nvidia-modelopt 0.47 `torch/export/tensorrt_llm_utils.py` `convert_to_tensorrt_llm_config`; any other raises
  "Cannot export tensorrt_llm checkpoint ... deploy the checkpoint with TensorRT-LLM pytorch backend"), and
  trtllm-build builds the architectures of TensorRT-LLM's `MODEL_MAP` (NVIDIA/TensorRT-LLM
  `tensorrt_llm/models/__init__.py` @02267d3: Llama, Mistral, Qwen2, Qwen3, Gemma 1-3, Phi-3 among them);
- the LLM API path (backend llmapi) exports Hugging Face checkpoints (modelopt `export_hf_checkpoint`) that
  TensorRT-LLM's PyTorch backend loads: only the architectures that release registers (`LLM_API_RELEASES`), and
  with the sliding window only where that release's attention applies it;
- every path verifies a conversion on CPU, and the CPU paths serve, with the reference runtime, so a family is in
  this table only once the reference runtime computes it exactly.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ACTIVATIONS",
    "FAMILIES",
    "LLM_API_RELEASES",
    "PATHS",
    "ROPE_TYPES",
    "Family",
    "LlmApiRelease",
    "Support",
    "activation",
    "family_of",
    "layer_windows",
    "llm_api_release",
    "rope_type",
    "sliding_window",
    "support",
]


@dataclass(frozen=True)
class Family:
    architecture: str  # the Hugging Face class name in config.json's "architectures"
    hf_model_type: str  # config.json's model_type (transformers' config class)
    model_type: str  # modelopt's decoder type (`get_model_type`), the TensorRT-LLM checkpoint's
    engine_export: bool  # modelopt writes a TensorRT-LLM checkpoint for it (the engine path)
    # What the reference runtime and the loader do differently from Llama:
    qk_norm: bool = False  # RMSNorm over each head's q and k before rope (Qwen3: q_norm, k_norm)
    norm_offset: bool = False  # RMSNorm scales by (1 + weight) (Gemma; TensorRT-LLM checkpoints store 1 + weight)
    embed_scale: bool = False  # embeddings times sqrt(hidden_size), in the model's dtype (Gemma)
    activation_keys: tuple[str, ...] = ("hidden_act",)  # the config keys naming the MLP activation, first set wins
    windowed: bool = False  # config.json's sliding_window (when set) bounds attention (Mistral, Phi-3, Gemma 2)
    window_layers_key: str | None = None  # the config key saying which layers slide (Gemma 2's layer_types); None: all
    sandwich_norms: bool = False  # norms after attention and after the MLP too (Gemma 2's post/pre/post feedforward)
    softcapping: bool = False  # attention scores and final logits soft-capped, cap * tanh(x / cap) (Gemma 2)
    query_scale_key: str | None = None  # the config key whose value ** -0.5 scales q.k (Gemma 2); None: head_dim


FAMILIES: dict[str, Family] = {
    f.architecture: f
    for f in (
        Family("LlamaForCausalLM", "llama", "llama", engine_export=True),
        Family("MistralForCausalLM", "mistral", "llama", engine_export=True, windowed=True),
        Family("Qwen2ForCausalLM", "qwen2", "qwen", engine_export=True),
        Family("Qwen3ForCausalLM", "qwen3", "qwen", engine_export=True, qk_norm=True),
        Family(
            "GemmaForCausalLM",
            "gemma",
            "gemma",
            engine_export=True,
            norm_offset=True,
            embed_scale=True,
            activation_keys=("hidden_activation", "hidden_act"),
        ),
        Family(
            "Gemma2ForCausalLM",
            "gemma2",
            "gemma2",
            engine_export=False,
            norm_offset=True,
            embed_scale=True,
            activation_keys=("hidden_activation", "hidden_act"),
            windowed=True,
            window_layers_key="layer_types",
            sandwich_norms=True,
            softcapping=True,
            query_scale_key="query_pre_attn_scalar",
        ),
        Family("Phi3ForCausalLM", "phi3", "phi3", engine_export=False, windowed=True),
    )
}


@dataclass(frozen=True)
class LlmApiRelease:
    """What one TensorRT-LLM release's PyTorch backend (the LLM API path) does with the families above."""

    version: str
    loads: frozenset[str]  # the architectures it registers; any other: "Unknown architecture for AutoModelForCausalLM"
    applies_window: frozenset[str]  # the windowed architectures whose sliding_window its attention applies
    source: str


# NVIDIA/TensorRT-LLM tensorrt_llm/_torch/models/modeling_auto.py: `AutoModelForCausalLM.from_config` looks
# `architectures[0]` up among the classes decorated `@register_auto_model(...)` and raises
# ValueError("Unknown architecture for AutoModelForCausalLM: <name>") for any other.
LLM_API_RELEASES: dict[str, LlmApiRelease] = {
    r.version: r
    for r in (
        LlmApiRelease(
            "1.2.1",
            loads=frozenset(
                {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "Phi3ForCausalLM"}
            ),
            applies_window=frozenset(),
            source="1.2-era _torch/models: modeling_llama.py registers LlamaForCausalLM and MistralForCausalLM, "
            "modeling_qwen.py Qwen2ForCausalLM, modeling_qwen3.py Qwen3ForCausalLM, modeling_phi3.py "
            "Phi3ForCausalLM; no 1.2-era source registers GemmaForCausalLM (modeling_gemma3.py registers "
            "Gemma3ForCausalLM only; the supported-model lists name Gemma 3) and Gemma2ForCausalLM is registered "
            "only on main in 2026 (in no supported-model list up to 1.3.0rc20); the 1.2-era Mistral and Phi-3 "
            "attention ignores sliding_window (applied on main by NVIDIA/TensorRT-LLM PR #12597, 2026)",
        ),
    )
}
PINNED_LLM_API_RELEASE = "1.2.1"  # = contract.llmapi.RELEASE (tests/test_families.py holds the two equal)


def llm_api_release(version: str | None) -> LlmApiRelease:
    """The record of `version` (a release this table knows, matched on its full version or its x.y.z prefix),
    else the pinned release's: a release the table does not know is held to the pinned release's rules."""
    for known in (version or "", ".".join((version or "").split(".")[:3])):
        if known in LLM_API_RELEASES:
            return LLM_API_RELEASES[known]
    return LLM_API_RELEASES[PINNED_LLM_API_RELEASE]


ACTIVATIONS = {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_new": "gelu_tanh"}  # the runtime's names
ROPE_TYPES = ("default", "linear", "llama3")  # the rope scalings the reference runtime computes


def rope_type(config: Mapping[str, Any]) -> str:
    rope = config.get("rope_scaling") or config.get("rope_parameters") or {}
    return str(rope.get("rope_type", rope.get("type", "default"))) if isinstance(rope, Mapping) else "default"


def family_of(architecture: str | None) -> Family | None:
    return FAMILIES.get(architecture or "")


@dataclass(frozen=True)
class Support:
    ok: bool
    reason: str = ""  # why not
    fix: str = ""  # what to change


PATHS = ("engine", "llmapi", "runtime")  # the engine path, the LLM API path, the reference runtime alone


def support(
    architecture: str | None, config: Mapping[str, Any], path: str, max_seq_len: int | None, release: str | None = None
) -> Support:
    """Whether `path` takes this model, and if not, why and what to change. `path`: "engine" (convert and build
    on the engine path), "llmapi" (the LLM API path on TensorRT-LLM `release`, default the pinned one) or
    "runtime" (what the reference runtime computes, which both paths need on CPU). `max_seq_len`: the spec's
    build.max_seq_len (None: unknown)."""
    if path not in PATHS:
        raise ValueError(f"path {path!r}: one of {', '.join(PATHS)}")
    family = family_of(architecture)
    on_release = llm_api_release(release)
    takes = {
        "engine": lambda f: f.engine_export,
        "llmapi": lambda f: f.architecture in on_release.loads,
        "runtime": lambda f: True,
    }[path]
    known = ", ".join(f.architecture for f in FAMILIES.values() if takes(f))
    if family is None:
        return Support(
            False,
            f"architecture {architecture!r} is not one of the model families specbuild supports",
            f"use one of: {known}",
        )
    if path == "engine" and not family.engine_export:
        return Support(
            False,
            f"{architecture} has no TensorRT-LLM checkpoint export (modelopt's "
            "export_tensorrt_llm_checkpoint covers gpt, gemma, llama and qwen): the engine path cannot "
            "convert it",
            _elsewhere(family, "engine", on_release),
        )
    if path == "llmapi" and not takes(family):
        return Support(
            False,
            f"TensorRT-LLM {on_release.version}'s PyTorch backend (the LLM API path) does not "
            f'register {architecture}: it would stop at "Unknown architecture for AutoModelForCausalLM"',
            _elsewhere(family, "llmapi", on_release),
        )
    if activation(family, config) not in ACTIVATIONS:
        return Support(
            False,
            f"{architecture}: MLP activation {activation(family, config)!r} is not computed by the reference runtime",
            f"use a checkpoint whose {family.activation_keys[0]} is one of {', '.join(ACTIVATIONS)}",
        )
    partial = (config.get("rope_parameters") or {}).get("partial_rotary_factor", config.get("partial_rotary_factor"))
    if partial not in (None, 1, 1.0):
        return Support(
            False,
            f"{architecture}: partial_rotary_factor = {partial} (rope on part of each head) is not "
            "computed by the reference runtime",
            "use a checkpoint with rope on whole heads",
        )
    if rope_type(config) not in ROPE_TYPES:
        return Support(
            False,
            f"{architecture}: rope type {rope_type(config)!r} is not supported (the reference "
            "runtime does not compute it)",
            f"use a checkpoint whose rope scaling is one of {', '.join(ROPE_TYPES)}",
        )
    window = sliding_window(family, config)
    ignores_window = path == "engine" or (path == "llmapi" and architecture not in on_release.applies_window)
    if window is not None and ignores_window and max_seq_len is not None and max_seq_len > window:
        where = (
            "the engines specbuild generates attend"
            if path == "engine"
            else f"TensorRT-LLM {on_release.version}'s PyTorch backend ignores sliding_window and attends"
        )
        return Support(
            False,
            f"{architecture} attends over a sliding window of {window} tokens and build.max_seq_len "
            f"= {max_seq_len} is longer: {where} over the whole sequence, so its output would differ "
            "from the model's",
            f"set build.max_seq_len <= {window}",
        )
    if config.get("use_sliding_window"):  # Qwen2/Qwen3's switch: a window on the layers past max_window_layers
        return Support(
            False,
            f"{architecture} with use_sliding_window = true (a window on some layers only) is not "
            "computed by the reference runtime",
            "use a checkpoint with use_sliding_window = false, as the published Qwen models are",
        )
    return Support(True)


def _elsewhere(family: Family, path: str, on_release: LlmApiRelease) -> str:
    """The fix for a family `path` does not take: the other path where it takes the family, else what would."""
    if path == "engine" and family.architecture in on_release.loads:
        return 'use the LLM API path: build.backend = "llmapi" (or --backend llmapi)'
    if path == "llmapi" and family.engine_export:
        return 'use the engine path: build.backend = "trtllm" (or "reference" on CPU)'
    return (
        f"no path of TensorRT-LLM {on_release.version} takes {family.architecture}: the engine path needs a "
        "TensorRT-LLM checkpoint modelopt cannot export, and the LLM API path a TensorRT-LLM release whose "
        "PyTorch backend registers it (specbuild.families.LLM_API_RELEASES lists what each known release loads)"
    )


def activation(family: Family, config: Mapping[str, Any]) -> str:
    """The MLP activation's transformers name (`ACT2FN`), as the family's modeling code reads it."""
    return next((str(config[key]) for key in family.activation_keys if config.get(key)), "silu")


def sliding_window(family: Family, config: Mapping[str, Any]) -> int | None:
    """The attention window of the layers that slide, in tokens (None: none)."""
    if not family.windowed:
        return None
    value = config.get("sliding_window")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def layer_windows(family: Family, config: Mapping[str, Any], num_layers: int) -> tuple[int | None, ...]:
    """Each layer's attention window (None: the whole sequence). Gemma 2 slides on the layers its layer_types
    names "sliding_attention", by default every other one from the first (transformers' Gemma2Config)."""
    window = sliding_window(family, config)
    if window is None or family.window_layers_key is None:
        return (window,) * num_layers
    kinds = config.get(family.window_layers_key) or [
        "sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(num_layers)
    ]
    return tuple(window if kind == "sliding_attention" else None for kind in kinds)


# modelopt below 0.44 writes a qwen TensorRT-LLM checkpoint only through tensorrt_llm's own config classes; without
# tensorrt_llm its manual path covers gpt, gemma and llama and raises NotImplementedError (nvidia-modelopt
# modelopt/torch/export/tensorrt_llm_utils.py, convert_to_tensorrt_llm_config, 0.37 against 0.44).
STANDALONE_EXPORT_SINCE = {"qwen": (0, 44)}  # decoder type -> the modelopt release that exports it alone


def export_refusal(role: str, architecture: str | None, path: str = "engine") -> tuple[str, str] | None:
    """(why, fix) when this machine's modelopt cannot write the engine path's checkpoint of this family (the rule
    `check` reports too); None when it can, when modelopt is not installed (convert says so itself), or on another
    path (the LLM API's Hugging Face export is another exporter)."""
    import importlib.metadata
    import importlib.util

    family = family_of(architecture)
    since = STANDALONE_EXPORT_SINCE.get(family.model_type) if family and path == "engine" else None
    if since is None or importlib.util.find_spec("tensorrt_llm") is not None:
        return None
    try:
        version = importlib.metadata.version("nvidia-modelopt")
    except importlib.metadata.PackageNotFoundError:
        return None
    if tuple(int(part) for part in version.split(".")[:2] if part.isdigit()) >= since:
        return None
    wanted = ".".join(map(str, since))
    return (
        f"{role}.checkpoint: nvidia-modelopt {version} exports a {family.model_type} TensorRT-LLM checkpoint only "
        f"with tensorrt_llm installed (below {wanted} its own path covers gpt, gemma and llama), and tensorrt_llm "
        "is not installed here.",
        f"convert in the GPU image (it has tensorrt_llm), or install nvidia-modelopt>={wanted} here.",
    )
