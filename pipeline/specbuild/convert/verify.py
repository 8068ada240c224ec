"""Round-trip check: the exported checkpoint, loaded back by our loader, against the original HF model.

Unquantized checkpoints must reproduce the original model run with its weights rounded to the
export dtype, to float32 rounding (every weight is the same number; only summation order may
differ), with 100% top-1 agreement. Quantized checkpoints are compared to the original float32
model; the figures are reported and checked against per-format sanity bounds (QUANT_BOUNDS).
Logits are compared on the original vocabulary; padded rows (draft vocabulary padding) must be 0, and
trimmed rows (a draft's rows beyond the tokenizer, cut to the target's size) are left out of the comparison.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from specbuild import families
from specbuild.progress import quiet_library_bars
from specbuild.quantization import FORMATS

# quantization -> (minimum top-1 agreement, maximum mean |logit error| relative to the logits' std).
# Loose on purpose: they catch a broken loader or export (wrong layout, scale or shard order gives
# near-random logits), not small accuracy differences.
# (specbuild.quantization's records, where the figures live)
QUANT_BOUNDS: dict[str, tuple[float, float]] = {
    name: fmt.verify_bounds for name, fmt in FORMATS.items() if fmt.verify_bounds is not None
}
EXACT_RTOL = 1e-4  # unquantized: max |error| <= EXACT_RTOL * max |logit| (float32 summation-order noise)


@dataclass
class VerifyReport:
    quantization: str
    quant_algo: str | None
    reference: str  # what the checkpoint was compared with
    prompts: int
    tokens: int
    max_abs_logit_error: float
    mean_abs_logit_error: float
    logit_std: float
    max_abs_logit: float
    top1_agreement: float  # fraction of positions whose argmax matches
    padded_rows: int
    padded_rows_max_abs: float
    passed: bool
    criterion: str
    notes: list[str]
    trimmed_rows: int = 0  # rows of the original cut at convert (beyond the tokenizer), not compared

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        return (
            f"top-1 agreement {self.top1_agreement:.1%}, max |logit error| {self.max_abs_logit_error:.3g}, "
            f"mean {self.mean_abs_logit_error:.3g} (logit std {self.logit_std:.3g}); {self.criterion}"
        )


def sample_prompts(hf_dir: Path, vocab: int, n: int = 4, length: int = 32, seed: int = 0) -> list[list[int]]:
    """Token ids of a few built-in texts (through the model's tokenizer), or seeded random ids without one."""
    import torch

    try:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(hf_dir, trust_remote_code=False)
    except (OSError, ValueError):
        tokenizer = None
    if tokenizer is not None:
        from specbuild.convert.calib import builtin_texts

        prompts = [tokenizer(t, truncation=True, max_length=length)["input_ids"] for t in builtin_texts(n, length * 6)]
        prompts = [[i for i in p if i < vocab] for p in prompts]
        prompts = [p for p in prompts if len(p) >= 2]
        if prompts:
            return prompts
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n, length), generator=gen).tolist()


def round_as_stored(model: Any, dtype: Any, norm_offset: bool) -> None:
    """The original model's weights rounded as the checkpoint stores them: in `dtype`, and with norm_offset (Gemma in
    a TensorRT-LLM checkpoint) its norms as 1 + weight, which rounds differently from the weight alone."""
    import torch

    with torch.no_grad():
        for name, p in model.named_parameters():
            if norm_offset and name.endswith("norm.weight"):
                p.copy_((1.0 + p).to(dtype).float() - 1.0)
            else:
                p.copy_(p.to(dtype).float())


def verify_checkpoint(
    ckpt_dir: Path, hf_dir: Path, quantization: str, prompts: list[list[int]] | None = None
) -> VerifyReport:
    import torch
    import transformers

    from specbuild.convert.loader import load_trtllm_checkpoint, to_hf_model

    loaded = load_trtllm_checkpoint(ckpt_dir)
    model = to_hf_model(loaded)
    arch = loaded.trtllm_config["architecture"]
    with quiet_library_bars():
        original = getattr(transformers, arch).from_pretrained(hf_dir, dtype=torch.float32, use_safetensors=True).eval()
    export_dtype = getattr(torch, loaded.trtllm_config["dtype"])
    quantized = quantization != "none"
    if not quantized:
        round_as_stored(original, export_dtype, families.FAMILIES[arch].norm_offset)
        reference = f"original model with weights rounded to {loaded.trtllm_config['dtype']}"
    else:
        reference = "original model (float32)"
    vocab = min(original.config.vocab_size, int(loaded.hf_config["vocab_size"]))  # compared rows
    prompts = prompts or sample_prompts(Path(hf_dir), vocab)
    max_err = total_err = count = agree = positions = 0.0
    sq = max_logit = pad_max = 0.0
    with torch.no_grad():
        for ids in prompts:
            x = torch.tensor([ids])
            got = model(x).logits[0].float()  # [seq, padded vocab]
            want = original(x).logits[0].float()[:, :vocab]  # [seq, vocab]
            if got.shape[-1] > vocab:
                pad_max = max(pad_max, got[:, vocab:].abs().max().item())
            got = got[:, :vocab]
            err = (got - want).abs()
            max_err = max(max_err, err.max().item())
            total_err += err.sum().item()
            count += err.numel()
            sq += want.var().item() * want.numel()
            max_logit = max(max_logit, want.abs().max().item())
            agree += (got.argmax(-1) == want.argmax(-1)).sum().item()
            positions += got.shape[0]
    std = (sq / count) ** 0.5 if count else 0.0
    mean_err, top1 = total_err / count, agree / positions
    padded = int(loaded.hf_config["vocab_size"]) - vocab
    if not quantized:
        tol = EXACT_RTOL * max(max_logit, 1.0)
        passed = max_err <= tol and top1 == 1.0 and pad_max == 0.0
        criterion = f"exact: max error <= {tol:.3g}, top-1 100%, padded rows 0"
    else:
        min_top1, max_rel = QUANT_BOUNDS[quantization]
        passed = top1 >= min_top1 and mean_err <= max_rel * max(std, 1e-6) and pad_max == 0.0
        criterion = f"bounds for {quantization}: top-1 >= {min_top1:.0%}, mean error <= {max_rel} x logit std"
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
        padded_rows=padded,
        padded_rows_max_abs=pad_max,
        passed=bool(passed),
        criterion=criterion,
        notes=loaded.notes,
        trimmed_rows=original.config.vocab_size - vocab,
    )
