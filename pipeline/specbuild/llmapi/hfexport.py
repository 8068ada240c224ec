"""Read back a Hugging Face checkpoint written for the LLM API, and verify it against the original.

modelopt's `export_hf_checkpoint` (FP8) stores each quantized linear as `<name>.weight` in float8_e4m3fn
with a per-tensor `<name>.weight_scale` and a static `<name>.input_scale`; with an FP8 KV cache the
attention modules also carry `k_scale` / `v_scale`. `hf_quant_config.json` and config.json's
`quantization_config` name the format (NVIDIA/Model-Optimizer modelopt/torch/export/unified_export_hf.py
and quant_utils.py `get_quant_config`, 0.37-0.47). Reading back: w = fp8 x weight_scale; the input scale
becomes the same fake-quant hook the engine path's loader uses (specbuild.convert.loader); the KV
scales are checked for presence, not simulated. Unquantized checkpoints are plain HF weights.

The round trip (`verify_export`) has the engine path's criteria (specbuild.convert.verify): unquantized
must equal the original with its weights rounded to the export dtype (top-1 100%, float32 noise);
quantized must stay within the per-format bounds.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from specbuild.contract import llmapi as contract
from specbuild.errors import CheckpointError
from specbuild.progress import quiet_library_bars
from specbuild.quantization import FORMATS

SUPPORTED_ALGOS = tuple(fmt.quant_algo for fmt in FORMATS.values() if fmt.llmapi)  # specbuild.quantization


def quant_algo(folder: Path) -> tuple[str | None, str | None]:
    """(quant_algo, kv_cache_quant_algo) from hf_quant_config.json; (None, None) when the file is absent."""
    path = Path(folder) / contract.HF_QUANT_CONFIG
    if not path.is_file():
        return None, None
    try:
        quantization = json.loads(path.read_text())["quantization"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise CheckpointError(
            f"{path} is unreadable ({err}). Run `specbuild convert --backend llmapi --force`."
        ) from None
    algo, kv = quantization.get("quant_algo"), quantization.get("kv_cache_quant_algo")
    if algo is None:  # what TensorRT-LLM's ModelLoader refuses (llm_utils.py _update_from_hf_quant_config)
        raise CheckpointError(
            f"{path}: Pre-quantized checkpoint must have quant_algo. (TensorRT-LLM refuses this file; "
            "remove it for an unquantized model, or convert again.)"
        )
    return algo, kv


def _tensors(folder: Path) -> dict[str, Any]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{folder} has no *.safetensors. Run `specbuild convert --backend llmapi`.")
    tensors: dict[str, Any] = {}
    for path in files:
        try:
            tensors.update(load_file(str(path)))
        except (SafetensorError, OSError, RuntimeError, ValueError) as err:
            raise CheckpointError(
                f"{path} is corrupt ({err}). Run `specbuild convert --backend llmapi --force`."
            ) from None
    return tensors


def load_export(folder: Path, dtype: Any = None):
    """The checkpoint as a `specbuild.convert.loader.LoadedCheckpoint`: float weights, input-quant hooks."""
    import torch

    from specbuild.convert.loader import ActivationQuant, LoadedCheckpoint

    folder = Path(folder)
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError) as err:
        raise CheckpointError(f"{folder}/config.json is unreadable ({err}).") from None
    algo, kv_algo = quant_algo(folder)
    if algo not in SUPPORTED_ALGOS:
        raise CheckpointError(f"{folder}: quant_algo {algo!r} cannot be read back here (supported: FP8, none).")
    dtype = dtype or torch.float32
    raw = _tensors(folder)
    state, acts, notes, kv_scales = {}, {}, [], 0
    for name, value in raw.items():
        if name.endswith((".weight_scale", ".input_scale")):
            continue
        if name.endswith((".k_scale", ".v_scale")):
            kv_scales += 1
            continue
        if value.dtype == torch.float8_e4m3fn:
            scale = raw.get(name.removesuffix(".weight") + ".weight_scale")
            if scale is None:
                raise CheckpointError(f"{folder}: {name} is FP8 without a weight_scale.")
            value = value.to(torch.float32) * scale.to(torch.float32)
            module = name.removesuffix(".weight")
            if module + ".input_scale" in raw:
                acts[module] = ActivationQuant("fp8", float(raw[module + ".input_scale"].float()))
        state[name] = value.to(dtype)
    if kv_algo == "FP8":
        if not kv_scales:
            raise CheckpointError(f"{folder}: kv_cache_quant_algo FP8 but no k_scale / v_scale tensors.")
        notes.append(f"FP8 KV cache: {kv_scales} scale tensors present (not simulated)")
    hf_config = {k: v for k, v in config.items() if k not in ("quantization_config",)}
    return LoadedCheckpoint(
        hf_config=hf_config,
        state_dict=state,
        trtllm_config={
            "quantization": {"quant_algo": algo, "kv_cache_quant_algo": kv_algo},
            "dtype": str(config.get("dtype") or config.get("torch_dtype")),
        },
        activation_quant=acts,
        notes=notes,
    )


def verify_export(folder: Path, hf_dir: Path, quantization: str, export_dtype: str) -> Any:
    """The round trip: the written checkpoint, read back, against the original model (a VerifyReport)."""
    import torch
    import transformers

    from specbuild.convert.loader import to_hf_model
    from specbuild.convert.verify import EXACT_RTOL, QUANT_BOUNDS, VerifyReport, round_as_stored, sample_prompts

    loaded = load_export(folder)
    model = to_hf_model(loaded)
    arch = (loaded.hf_config.get("architectures") or ["LlamaForCausalLM"])[0]
    with quiet_library_bars():
        original = getattr(transformers, arch).from_pretrained(hf_dir, dtype=torch.float32, use_safetensors=True).eval()
    quantized = quantization != "none"
    if not quantized:
        round_as_stored(original, getattr(torch, export_dtype), norm_offset=False)  # a Hugging Face checkpoint: w
    vocab = min(original.config.vocab_size, int(loaded.hf_config["vocab_size"]))
    prompts = sample_prompts(Path(hf_dir), vocab)
    max_err = total = count = agree = positions = sq = max_logit = pad_max = 0.0
    with torch.no_grad():
        for ids in prompts:
            x = torch.tensor([ids])
            got = model(x).logits[0].float()
            want = original(x).logits[0].float()[:, :vocab]
            if got.shape[-1] > vocab:
                pad_max = max(pad_max, got[:, vocab:].abs().max().item())
            err = (got[:, :vocab] - want).abs()
            max_err, total, count = max(max_err, err.max().item()), total + err.sum().item(), count + err.numel()
            sq += want.var().item() * want.numel()
            max_logit = max(max_logit, want.abs().max().item())
            agree += (got[:, :vocab].argmax(-1) == want.argmax(-1)).sum().item()
            positions += got.shape[0]
    std, mean_err, top1 = (sq / count) ** 0.5, total / count, agree / positions
    if quantized:
        min_top1, max_rel = QUANT_BOUNDS[quantization]
        passed = top1 >= min_top1 and mean_err <= max_rel * max(std, 1e-6) and pad_max == 0.0
        criterion = f"bounds for {quantization}: top-1 >= {min_top1:.0%}, mean error <= {max_rel} x logit std"
        reference = "original model (float32)"
    else:
        tol = EXACT_RTOL * max(max_logit, 1.0)
        passed = max_err <= tol and top1 == 1.0 and pad_max == 0.0
        criterion = f"exact: max error <= {tol:.3g}, top-1 100%, padded rows 0"
        reference = f"original model with weights rounded to {export_dtype}"
    return VerifyReport(
        quantization=quantization,
        quant_algo=loaded.quant_algo,
        reference=reference,
        prompts=len(prompts),
        tokens=int(positions),
        max_abs_logit_error=max_err,
        mean_abs_logit_error=mean_err,
        logit_std=std,
        max_abs_logit=max_logit,
        top1_agreement=top1,
        padded_rows=int(loaded.hf_config["vocab_size"]) - vocab,
        padded_rows_max_abs=pad_max,
        passed=bool(passed),
        criterion=criterion,
        notes=loaded.notes,
        trimmed_rows=original.config.vocab_size - vocab,
    )
