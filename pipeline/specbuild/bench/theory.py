"""The closed-form bound on speculative speedup, from a measured alpha and cost ratio c.

Leviathan, Kalman, Matias, "Fast Inference from Transformers via Speculative Decoding" (2023):
E[tokens per target step] = (1 - alpha^(K+1)) / (1 - alpha), speedup = E / (K * c + 1),
with c = draft step time / target step time. The overlapped (draft-ahead) schedule's bound,
E / (max(1, (K+1) c) + (1 - h) K c) with the early-draft hit rate h (alpha^(K+1) when not measured),
is derived in docs/speculative.md. The formulas live in `specbuild.speculative.adaptive`; this module
only feeds them measured numbers and estimates c for a GPU from the models' sizes.

GPU estimate: `specbuild.gpus`' cost model of a memory-bound step (weight bytes over the GPU's bandwidth plus a
launch floor per layer).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from specbuild import gpus
from specbuild.config import ModelSpec, Spec
from specbuild.quantization import FORMATS

BYTES_PER_WEIGHT = {name: fmt.weight_bytes for name, fmt in FORMATS.items()}  # specbuild.quantization; None: dtype
BYTES_PER_DTYPE = {"float16": 2.0, "bfloat16": 2.0, "float32": 4.0}


def expected_tokens(alpha: float, k: int) -> float:
    from specbuild.speculative.adaptive import expected_tokens_per_step

    return float(expected_tokens_per_step(alpha, k))


def bound(alpha: float, k: int, c: float) -> float:
    """The closed-form speedup for K draft tokens (K = 0 gives 1)."""
    if k == 0:
        return 1.0
    from specbuild.speculative.adaptive import predicted_speedup

    return float(predicted_speedup(alpha, k, c))


def hit_rate(alpha: float, k: int) -> float:
    """The expected early-draft hit rate for K = k (alpha^(k+1))."""
    from specbuild.speculative.adaptive import expected_hit_rate

    return float(expected_hit_rate(alpha, k))


def overlap_bound(alpha: float, k: int, c: float, hit: float | None = None) -> float:
    """The closed-form speedup of the overlapped schedule (K = 0 gives 1); hit None = alpha^(K+1)."""
    from specbuild.speculative.adaptive import predicted_overlap_speedup

    return float(predicted_overlap_speedup(alpha, k, c, hit))


def cost_ratio(draft_seconds_per_token: float | None, target_seconds_per_step: float | None) -> float | None:
    """c = one draft decoding step / one plain target decoding step."""
    if not draft_seconds_per_token or not target_seconds_per_step:
        return None
    return draft_seconds_per_token / target_seconds_per_step


def predictions(alpha: float, c: float, ks: Iterable[int]) -> list[dict[str, float]]:
    return [
        {
            "num_draft_tokens": k,
            "expected_tokens_per_step": round(expected_tokens(alpha, k) if k else 1.0, 4),
            "predicted_speedup": round(bound(alpha, k, c), 4),
        }
        for k in ks
    ]


@dataclass(frozen=True)
class ModelSize:
    parameters: int
    layers: int

    @classmethod
    def of_checkpoint(cls, folder: Path, role: str = "model") -> ModelSize:
        """Weights counted from the safetensors headers (nothing loaded), layers from config.json."""
        from specbuild.hfmodel import read_model_info

        info = read_model_info(folder, role=role)
        return cls(parameters=info.num_params, layers=info.num_layers)


def weight_bytes(size: ModelSize, model: ModelSpec) -> float:
    per = BYTES_PER_WEIGHT.get(model.quantization) or BYTES_PER_DTYPE.get(model.dtype, 2.0)
    return size.parameters * per


def gpu_step_seconds(size: ModelSize, model: ModelSpec, gpu_name: str | None) -> float | None:
    gpu = gpus.GPUS.get(gpu_name or "")
    return None if gpu is None else gpus.step_seconds(gpu, weight_bytes(size, model), size.layers)


def gpu_estimate(spec: Spec, target: ModelSize, draft: ModelSize) -> dict[str, object]:
    """c for the spec's GPU from weight bytes per token, with the assumptions spelled out."""
    t = gpu_step_seconds(target, spec.target, spec.gpu.name)
    d = gpu_step_seconds(draft, spec.draft, spec.gpu.name)
    result: dict[str, object] = {
        "gpu": spec.gpu.name,
        "target_parameters": target.parameters,
        "draft_parameters": draft.parameters,
        "target_weight_bytes": int(weight_bytes(target, spec.target)),
        "draft_weight_bytes": int(weight_bytes(draft, spec.draft)),
        "assumptions": gpus.ASSUMPTIONS + "; KV-cache reads ignored",
    }
    if t is None or d is None:
        result.update(
            cost_ratio=round(weight_bytes(draft, spec.draft) / weight_bytes(target, spec.target), 6),
            note=f"no bandwidth figure for GPU {spec.gpu.name!r}: c is the ratio of weight bytes only",
        )
        return result
    result.update(
        bandwidth_gbs=gpus.GPUS[spec.gpu.name or ""].bandwidth_gbs,
        target_step_seconds=round(t, 9),
        draft_step_seconds=round(d, 9),
        cost_ratio=round(d / t, 6),
    )
    return result
