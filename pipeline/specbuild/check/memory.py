"""The memory plan: do both engines fit the `[gpu]`, and how should the KV cache be split?

Pure arithmetic over `ModelInfo` facts and the spec; every figure is per GPU unless named total.

- Weights: transformer-block parameters at the quantization's bytes per weight; the input
  embedding and the lm_head stay at the activation dtype (modelopt leaves both unquantized by
  default). The lm_head is counted even when the HF model ties it to the embedding: the exported
  TensorRT-LLM checkpoint stores it as its own tensor. With tensor parallelism the blocks and the
  lm_head are split over `tp_size` GPUs; the embedding is counted whole on every GPU
  (trtllm-build's `--use_parallel_embedding` is off by default). Pipeline parallelism splits the
  blocks and the KV layers over `pp_size` stages (embedding and lm_head counted on one stage: worst case).
- KV cache bytes per token = 2 (K and V) x layers x kv_heads per GPU x head_dim x bytes
  (fp8 KV: 1 byte; otherwise the activation dtype). Sequences are counted in whole blocks of
  `TOKENS_PER_BLOCK` tokens (paged KV cache); the target's sequences are `max_draft_len` longer
  (trtllm-build adds it to the target's max_seq_len).
- Runtime headroom (estimates, see the constants): a CUDA context per model, each engine's
  activation buffers for `max_num_tokens`, its logits buffer, decoder and runtime buffers per batch
  slot, and a safety margin of 10% of what is left (at least 0.5 GiB).

Placement: the draft runs on GPUs of its own when `gpu.draft_device_ids` names GPUs other than the
target's, or, without it, when `gpu.count >= 2 x tp_size x pp_size` (`Spec.device_ids`, which the repo
stage writes as `gpu_device_ids`); else both models share the same GPUs.

KV split between two engines on one GPU. TensorRT-LLM gives each model
`min(max_tokens_in_paged_kv_cache, kv_cache_free_gpu_mem_fraction x free memory)` when that
model loads, and Triton may load the two models in either order. So the plan gives each model a
token cap (its share of the KV memory left after both models' weights and buffers, in proportion
to its bytes per sequence) and a fraction large enough to reach that cap even when it loads
second: fraction_X = budget_X / (free after both loaded - budget_Y). Whichever loads first takes
only its cap, and the second still finds its budget: the plan holds in both orders.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from specbuild.check.report import Finding
from specbuild.config import Spec
from specbuild.contract import build_rules as rules
from specbuild.contract.build_rules import BLACKWELL_REJECTED, FP8_MIN_SM, MIN_SM, TOKENS_PER_BLOCK  # noqa: F401 (re-exported)
from specbuild.hfmodel import ModelInfo
from specbuild.quantization import FORMATS

GIB = 1024**3

# A CUDA context with cuBLAS/cuBLASLt handles and workspaces takes ~0.3-0.6 GiB on Hopper (users report
# 500-590 MiB per TensorRT-LLM process in nvidia-smi, NVIDIA/TensorRT-LLM#3058); in orchestrator mode each
# tensorrt_llm model runs in its own executor process, so one per model.
CUDA_CONTEXT_BYTES = int(0.75 * GIB)
# Per engine, not proportional to max_num_tokens: TensorRT execution context, decoder and sampling
# state, host-visible staging buffers.
ENGINE_FIXED_BYTES = int(0.25 * GIB)
# Runtime buffers and decoder state per batch slot and vocabulary entry (logits copies, probabilities,
# sampling workspace). Fitted to a TensorRT-LLM log (NVIDIA/TensorRT-LLM#1188, Qwen2.5-0.5B, vocab 151936,
# default max_batch_size 2048): "Allocated 2.66 GB GPU memory for runtime buffers" and "5.76 GB ... for
# decoder", i.e. about 27 bytes per slot per vocabulary entry. That log also shows why max_batch_size
# matters: the same engine used ~1.2 GB in all at max_batch_size 1.
DECODER_BYTES_PER_SLOT_AND_TOKEN = 28
# Activations live per layer and are reused across layers; the widest point of a gated-MLP block
# holds about (2 x intermediate + intermediate + hidden) values per token, attention about 6 x hidden.
# We take hidden x 8 + intermediate x 3 values per token in max_num_tokens as the activation peak.
ACTIVATION_HIDDEN_FACTOR = 8
ACTIVATION_INTERMEDIATE_FACTOR = 3
# Kept free out of what remains after weights and buffers: allocator fragmentation, NCCL buffers with
# tp > 1, the error of these estimates. TensorRT-LLM's own default (kv_cache_free_gpu_mem_fraction 0.9)
# keeps the same 10% of free memory; we keep at least MIN_SAFETY_BYTES.
SAFETY_FRACTION = 0.10
MIN_SAFETY_BYTES = int(0.5 * GIB)
MAX_FRACTION = 0.95

DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}
# Bytes per transformer-block weight of each quantized format (specbuild.quantization; AWQ's scales included)
WEIGHT_BYTES = {name: fmt.weight_bytes for name, fmt in FORMATS.items() if fmt.weight_bytes is not None}
# GPU feature gates and the KV-cache block size come from specbuild.contract.build_rules (trtllm-build's own rules).


@dataclass(frozen=True)
class ModelMemory:
    role: str
    quantization: str
    kv_cache: str
    weight_bytes: int  # the whole model, all GPUs together
    weight_bytes_per_gpu: int
    runtime_bytes_per_gpu: int  # CUDA context, activations for max_num_tokens, logits, fixed buffers
    kv_bytes_per_token: int  # per GPU
    tokens_per_sequence: int  # KV tokens of one sequence at max_seq_len, rounded up to whole blocks
    kv_budget_bytes: int  # per GPU, this model's share of the KV memory
    max_tokens_in_paged_kv_cache: int
    kv_cache_free_gpu_mem_fraction: float

    @property
    def kv_bytes_per_sequence(self) -> int:
        return self.kv_bytes_per_token * self.tokens_per_sequence


@dataclass(frozen=True)
class MemoryPlan:
    gpu: str  # the GPU's name, or "custom"
    sm: int | None
    memory_per_gpu_bytes: int
    tp_size: int
    target: ModelMemory
    draft: ModelMemory | None  # None: a target-only deployment
    reserved_bytes: int  # per GPU: safety margin kept free
    kv_available_bytes: int  # per GPU, after weights, runtime and margin (negative: does not fit)
    max_batch: int  # sequences at max_seq_len that fit (target KV + draft KV each)
    max_batch_size: int  # what the spec asks for
    max_seq_len: int
    pp_size: int = 1
    placement: str = "shared"  # "shared": both models on the same GPUs; "separate": the draft on its own
    problems: tuple[Finding, ...] = ()  # GPU feature gates and "does not fit"
    warnings: tuple[Finding, ...] = ()
    suggestions: tuple[dict[str, Any], ...] = ()  # changes that would fit, best first

    @property
    def fits(self) -> bool:
        return self.max_batch >= 1

    @property
    def models(self) -> tuple[ModelMemory, ...]:
        return (self.target, self.draft) if self.draft is not None else (self.target,)

    @property
    def kv_cache_free_gpu_mem_fraction(self) -> dict[str, float]:
        """Per role; only safe together with `max_tokens_in_paged_kv_cache` (see the module docstring)."""
        return {m.role: m.kv_cache_free_gpu_mem_fraction for m in self.models}

    @property
    def max_tokens_in_paged_kv_cache(self) -> dict[str, int]:
        return {m.role: m.max_tokens_in_paged_kv_cache for m in self.models}

    def to_dict(self) -> dict[str, Any]:
        def model(m: ModelMemory) -> dict[str, Any]:
            return {**dataclasses.asdict(m), "kv_bytes_per_sequence": m.kv_bytes_per_sequence}

        return {
            "fits": self.fits,
            "gpu": self.gpu,
            "sm": self.sm,
            "memory_per_gpu_bytes": self.memory_per_gpu_bytes,
            "tp_size": self.tp_size,
            "pp_size": self.pp_size,
            "placement": self.placement,
            "target": model(self.target),
            "draft": model(self.draft) if self.draft is not None else None,
            "reserved_bytes": self.reserved_bytes,
            "kv_available_bytes": self.kv_available_bytes,
            "max_batch_at_max_seq_len": self.max_batch,
            "max_batch_size": self.max_batch_size,
            "max_seq_len": self.max_seq_len,
            "suggestions": list(self.suggestions),
        }


def padded_vocab(rows: int, tp_size: int) -> int:
    """Embedding rows after padding to a multiple of tp_size (the lm_head is split by rows)."""
    return math.ceil(rows / tp_size) * tp_size


def weight_bytes(
    info: ModelInfo, quantization: str, dtype: str, vocab_rows: int, tp_size: int, pp_size: int = 1
) -> tuple[int, int]:
    """(total, per GPU) engine weight bytes of one model; per GPU counts the embedding and the lm_head
    on the same GPU (true for pp_size 1, the worst stage otherwise)."""
    act = DTYPE_BYTES[dtype]
    per_weight = act if quantization == "none" else WEIGHT_BYTES[quantization]
    own_embeddings = info.vocab_size * info.hidden_size * (1 if info.tie_word_embeddings else 2)
    blocks = max(info.num_params - own_embeddings, 0)  # transformer blocks + norms
    table = vocab_rows * info.hidden_size  # the embedding; the lm_head has the same shape
    total = blocks * per_weight + 2 * table * act
    per_gpu = blocks * per_weight / (tp_size * pp_size) + table * act + table * act / tp_size
    return int(total), int(per_gpu)


def kv_bytes_per_token(info: ModelInfo, kv_cache: str, dtype: str, tp_size: int, pp_size: int = 1) -> int:
    kv_heads_per_gpu = math.ceil(info.num_kv_heads / tp_size)  # fewer kv heads than GPUs: replicated
    layers_per_gpu = math.ceil(info.num_layers / pp_size)
    element = 1 if kv_cache == "fp8" else DTYPE_BYTES[dtype]
    return 2 * layers_per_gpu * kv_heads_per_gpu * info.head_dim * element


def runtime_bytes(info: ModelInfo, dtype: str, spec: Spec, vocab_rows: int, is_target: bool) -> int:
    b, sp = spec.build, spec.speculative
    tokens = rules.planned_max_num_tokens(b.max_batch_size, b.max_seq_len, b.max_num_tokens)[0]
    if is_target:  # trtllm-build raises max_num_tokens to fit one verify step per sequence
        tokens = rules.built_target_limits(b.max_batch_size, b.max_seq_len, tokens, sp.max_draft_len)[1]
    act = DTYPE_BYTES[dtype]
    width = ACTIVATION_HIDDEN_FACTOR * info.hidden_size + ACTIVATION_INTERMEDIATE_FACTOR * math.ceil(
        info.intermediate_size / b.tp_size
    )
    logits = b.max_batch_size * (sp.max_draft_len + 1) * math.ceil(vocab_rows / b.tp_size) * 4  # fp32 logits
    decoder = b.max_batch_size * vocab_rows * DECODER_BYTES_PER_SLOT_AND_TOKEN  # full vocabulary on every rank
    return CUDA_CONTEXT_BYTES + ENGINE_FIXED_BYTES + tokens * width * act + logits + decoder


def _round_up(value: int, multiple: int) -> int:
    return math.ceil(value / multiple) * multiple


def _fraction(budget: float, free_when_second: float) -> float:
    if budget <= 0 or free_when_second <= 0:
        return 0.0
    return min(math.ceil(budget / free_when_second * 100) / 100, MAX_FRACTION)


def separate_gpus(spec: Spec) -> bool:
    """Whether the draft runs on GPUs of its own (`Spec.device_ids`, as the repo stage places it)."""
    if spec.draft is None:
        return False
    return set(spec.device_ids("draft")).isdisjoint(spec.device_ids("target"))


def compute_plan(spec: Spec, target: ModelInfo, draft: ModelInfo | None) -> MemoryPlan:
    """The arithmetic alone: weights, buffers, KV per token and sequence, the batch, the KV split (draft None: the
    target alone)."""
    b, g = spec.build, spec.gpu
    tp, pp = b.tp_size, b.pp_size
    memory = int(g.memory_per_gpu_gib * GIB)
    vocab_rows = padded_vocab(target.vocab_size, tp)  # convert pads or trims the draft to the target's rows
    roles = {"target": (target, spec.target, b.max_seq_len + spec.speculative.max_draft_len)}
    if draft is not None and spec.draft is not None:
        roles["draft"] = (draft, spec.draft, b.max_seq_len)
    raw: dict[str, dict[str, int]] = {}
    for role, (info, model, seq) in roles.items():
        total, per_gpu = weight_bytes(info, model.quantization, model.dtype, vocab_rows, tp, pp)
        raw[role] = {
            "total": total,
            "per_gpu": per_gpu,
            "runtime": runtime_bytes(info, model.dtype, spec, vocab_rows, role == "target"),
            "kv_token": kv_bytes_per_token(info, model.kv_cache, model.dtype, tp, pp),
            "tokens": _round_up(seq, TOKENS_PER_BLOCK),
        }
    per_seq = {role: r["kv_token"] * r["tokens"] for role, r in raw.items()}
    fractions: dict[str, float] = {}
    if separate_gpus(spec):
        # Each model alone on its GPUs: all of its free memory (less the margin) is its KV cache.
        budgets, batches, reserved = {}, [], 0
        for role, r in raw.items():
            free = memory - r["per_gpu"] - r["runtime"]
            margin = max(MIN_SAFETY_BYTES, int(SAFETY_FRACTION * free))
            reserved = max(reserved, margin)
            budgets[role] = max(free - margin, 0)
            batches.append(max(free - margin, 0) // per_seq[role])
            fractions[role] = _fraction(budgets[role], free)
        max_batch = min(batches)
        kv_available = sum(memory - r["per_gpu"] - r["runtime"] for r in raw.values()) - 2 * reserved
    else:
        free_after_load = memory - sum(r["per_gpu"] + r["runtime"] for r in raw.values())
        reserved = max(MIN_SAFETY_BYTES, int(SAFETY_FRACTION * free_after_load))
        kv_available = free_after_load - reserved
        both = sum(per_seq.values())
        max_batch = max(kv_available // both, 0)
        budgets = {role: max(kv_available, 0) * per_seq[role] / both for role in raw}
        for role in raw:
            others = sum(budget for other, budget in budgets.items() if other != role)
            fractions[role] = _fraction(budgets[role], free_after_load - others)
    models = {
        role: ModelMemory(
            role=role,
            quantization=roles[role][1].quantization,
            kv_cache=roles[role][1].kv_cache,
            weight_bytes=r["total"],
            weight_bytes_per_gpu=r["per_gpu"],
            runtime_bytes_per_gpu=r["runtime"],
            kv_bytes_per_token=r["kv_token"],
            tokens_per_sequence=r["tokens"],
            kv_budget_bytes=int(budgets[role]),
            # whole blocks, and no more than the backend's int32 parameter holds (a larger value is dropped)
            max_tokens_in_paged_kv_cache=rules.clamp_kv_tokens(
                int(budgets[role] // r["kv_token"]) // TOKENS_PER_BLOCK * TOKENS_PER_BLOCK
            ),
            kv_cache_free_gpu_mem_fraction=fractions[role],
        )
        for role, r in raw.items()
    }
    return MemoryPlan(
        gpu=g.name or "custom",
        sm=g.sm,
        memory_per_gpu_bytes=memory,
        tp_size=tp,
        target=models["target"],
        draft=models.get("draft"),
        reserved_bytes=reserved,
        kv_available_bytes=int(kv_available),
        max_batch=int(max_batch),
        max_batch_size=b.max_batch_size,
        max_seq_len=b.max_seq_len,
        pp_size=pp,
        placement="separate" if separate_gpus(spec) else "shared",
    )
