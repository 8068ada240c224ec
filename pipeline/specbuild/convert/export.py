"""Run one role's conversion: load the HF model, pad the vocabulary, quantize, export, fix up, verify.

Everything is written into `stage_output`'s temporary folder and renamed into place at the end,
so a failure or Ctrl-C leaves no half-written checkpoint (and the previous one, if any, intact).
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from specbuild.artifacts import combined_hash, hash_tree, stage_output, tool_versions
from specbuild.convert import calib as calib_mod
from specbuild.convert import formats
from specbuild.convert.fixups import apply_fixups
from specbuild.convert.plan import TOOLS, ConvertOptions, RolePlan
from specbuild.errors import CheckpointError
from specbuild.progress import quiet_library_bars, verbose

Log = Callable[[str], None]


def source_hashes(plan: RolePlan) -> dict[str, str]:
    return hash_tree(plan.hf_dir)


def input_hash(plan: RolePlan, hashes: dict[str, str], versions: dict[str, Any]) -> str:
    return combined_hash("convert", plan.settings(), hashes, versions)


def resolve_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise CheckpointError("--device cuda: no CUDA device is visible to torch. Use --device cpu (small models).")
    return device


def load_hf_model(plan: RolePlan, device: str) -> Any:
    import torch
    import transformers
    from safetensors import SafetensorError

    cls = getattr(transformers, plan.architecture)
    # Calibrate in float32 on CPU (CPU float16 kernels are slow or missing); on CUDA in the export dtype.
    dtype = torch.float32 if device == "cpu" else getattr(torch, plan.dtype)
    try:
        with quiet_library_bars():
            model, info = cls.from_pretrained(
                plan.hf_dir, dtype=dtype, use_safetensors=True, trust_remote_code=False, output_loading_info=True
            )
    except (SafetensorError, OSError, ValueError, RuntimeError, KeyError) as err:
        raise CheckpointError(
            f"{plan.role} checkpoint {str(plan.hf_dir)!r} cannot be loaded: {str(err).splitlines()[0][:300]}. "
            "Check that its *.safetensors files are complete (download them again)."
        ) from None
    # transformers fills missing weights with random values and only warns: refuse instead.
    missing = sorted(
        k for k in info.get("missing_keys", ()) if not (k == "lm_head.weight" and model.config.tie_word_embeddings)
    )
    if missing:
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise CheckpointError(
            f"{plan.role} checkpoint {str(plan.hf_dir)!r} lacks tensors {missing[:5]}{more}. "
            "The weight files are incomplete: download them again."
        )
    return model.to(device).eval()


def fit_vocab(model: Any, plan: RolePlan, log: Callable[[str], None]) -> None:
    """Give the model the target's vocabulary rows, as the plan says: pad with zero rows (a draft with fewer
    rows), or trim (a draft whose extra rows lie beyond the tokenizer: no token maps to them)."""
    if plan.pad_vocab_to:
        log(f"[{plan.role}] padding the vocabulary {plan.vocab_rows} -> {plan.pad_vocab_to} rows (zeros)")
        resize_vocab(model, plan.pad_vocab_to)
    if plan.trim_vocab_to:
        log(
            f"[{plan.role}] trimming the vocabulary {plan.vocab_rows} -> {plan.trim_vocab_to} rows (to the "
            "target's; the rows cut lie beyond the tokenizer: no token maps to them)"
        )
        resize_vocab(model, plan.trim_vocab_to)


def resize_vocab(model: Any, rows: int) -> None:
    """The embedding and lm_head with exactly `rows` rows: the first rows kept, zero rows appended if needed."""
    import torch

    emb = model.get_input_embeddings()
    if emb.weight.shape[0] == rows:
        return

    def resized(weight: torch.Tensor) -> torch.Tensor:  # [old_rows, hidden] -> [rows, hidden]
        kept = weight[:rows]
        return torch.cat([kept, kept.new_zeros(rows - kept.shape[0], weight.shape[1])])

    with torch.no_grad():
        new_emb = torch.nn.Embedding(rows, emb.weight.shape[1], device=emb.weight.device, dtype=emb.weight.dtype)
        new_emb.weight.copy_(resized(emb.weight))
        model.set_input_embeddings(new_emb)
        head = model.get_output_embeddings()
        if model.config.tie_word_embeddings:
            head.weight = new_emb.weight
        else:
            new_head = torch.nn.Linear(
                head.in_features, rows, bias=False, device=head.weight.device, dtype=head.weight.dtype
            )
            new_head.weight.copy_(resized(head.weight))
            model.set_output_embeddings(new_head)
    model.config.vocab_size = rows


def pad_intermediate(model: Any, size: int) -> None:
    """Zero rows in gate_proj/up_proj and zero columns in down_proj: silu(0) * 0 = 0 leaves the model unchanged."""
    import torch

    def grown(linear: Any, rows: int, cols: int) -> Any:
        new = torch.nn.Linear(
            cols, rows, bias=linear.bias is not None, device=linear.weight.device, dtype=linear.weight.dtype
        )
        new.weight.zero_()
        new.weight[: linear.out_features, : linear.in_features] = linear.weight
        if linear.bias is not None:
            new.bias.zero_()
            new.bias[: linear.out_features] = linear.bias
        return new

    with torch.no_grad():
        for layer in model.model.layers:
            mlp = layer.mlp
            mlp.gate_proj = grown(mlp.gate_proj, size, mlp.gate_proj.in_features)
            mlp.up_proj = grown(mlp.up_proj, size, mlp.up_proj.in_features)
            mlp.down_proj = grown(mlp.down_proj, mlp.down_proj.out_features, size)
    model.config.intermediate_size = size


def quant_config(plan: RolePlan) -> dict[str, Any] | None:
    """The modelopt config: the format's, with the AWQ block size and the FP8 KV-cache entries merged in.

    Two layouts exist: a list of {"quantizer_name", "cfg"/"enable"} entries (modelopt 0.4x) and a dict of
    pattern -> settings with a "default" entry (0.37, the version TensorRT-LLM 1.2 pins).
    """
    import modelopt.torch.quantization as mtq

    fmt = formats.get_format(plan.quantization)
    if fmt.mtq_config is None:  # none / weight-only: an FP8 KV cache is refused for them at plan time
        return None
    kv_entries = copy.deepcopy(mtq.FP8_KV_CFG["quant_cfg"])
    listed = isinstance(kv_entries, list)
    cfg = copy.deepcopy(getattr(mtq, fmt.mtq_config))
    entries = cfg["quant_cfg"]
    if isinstance(entries, list) != listed or not isinstance(entries, (list, dict)):
        raise CheckpointError(
            f"nvidia-modelopt {tool_versions('nvidia-modelopt')['nvidia-modelopt']}: unexpected "
            "quantization config layout. Install nvidia-modelopt 0.37 or 0.4x (<0.49)."
        )
    if fmt.awq:
        weight = (
            next(e.get("cfg") for e in entries if e.get("quantizer_name") == "*weight_quantizer")
            if listed
            else entries["*weight_quantizer"]
        )
        first = weight[0] if isinstance(weight, list) else weight
        first["block_sizes"][-1] = plan.awq_block_size
    if plan.kv_cache == "fp8":
        if listed:
            cfg["quant_cfg"] = list(entries) + list(kv_entries)
        else:
            entries.update({k: v for k, v in kv_entries.items() if k != "default"})
    return cfg


def calibrate(model: Any, plan: RolePlan, options: ConvertOptions, device: str, log: Log, progress: bool) -> dict:
    import modelopt.torch.quantization as mtq
    import torch
    from tqdm import tqdm
    from transformers import AutoTokenizer

    cfg = quant_config(plan)
    if cfg is None:
        return {"used": False}
    cal = plan.calibration
    try:
        tokenizer = AutoTokenizer.from_pretrained(plan.hf_dir, trust_remote_code=False)
    except (OSError, ValueError) as err:
        raise CheckpointError(
            f"{plan.role} checkpoint {str(plan.hf_dir)!r}: calibration needs its tokenizer, which "
            f"cannot be loaded ({str(err).splitlines()[0][:200]}). Add the tokenizer files."
        ) from None
    if cal.source == "builtin":
        texts = calib_mod.builtin_texts(cal.size, chars=cal.seq_len * 6)
    else:
        texts = calib_mod.read_calib_file(Path(cal.source))[: cal.size]
    batches = calib_mod.tokenize_samples(tokenizer, texts, cal.seq_len, device)
    if not batches:
        raise CheckpointError("calibration produced no tokens. Pass a --calib-file with some text.")
    log(f"[{plan.role}] calibrating {plan.quantization} (kv_cache {plan.kv_cache}) on {len(batches)} samples")

    def forward_loop(m: Any) -> None:
        with torch.no_grad():
            for ids in tqdm(batches, desc=f"calibrate {plan.role}", disable=not progress, leave=False):
                m(ids)

    torch.manual_seed(options.seed)
    with _quiet_stdout():
        mtq.quantize(model, cfg, forward_loop=forward_loop)
    return {
        "used": True,
        "source": cal.source,
        "file_sha256": cal.file_sha256,
        "samples": len(batches),
        "tokens": int(sum(b.shape[1] for b in batches)),
        "seq_len": cal.seq_len,
        "algorithm": str(cfg.get("algorithm")),
        "awq_block_size": plan.awq_block_size,
    }


@contextlib.contextmanager
def _quiet_stdout() -> Iterator[None]:
    """modelopt prints to stdout ("current rank: 0, tp rank: 0, pp rank: 0", its progress), which belongs to the
    command's result (--json): on stderr with --verbose; otherwise held, and written to stderr only if the call
    fails, so nothing a failure needs is lost."""
    held = io.StringIO()
    with contextlib.redirect_stdout(sys.stderr if verbose() else held), warnings.catch_warnings():
        # Without tensorrt_llm installed modelopt writes the config itself ("the manual approach"): expected here.
        warnings.filterwarnings("ignore", message="Cannot export tensorrt_llm checkpoint config")
        # Printed whenever lm_head is not force-disabled, although the configs used here exclude it (exclude_modules).
        warnings.filterwarnings("ignore", message="Enable lm_head quantization")
        try:
            yield
        except BaseException:
            sys.stderr.write(held.getvalue())
            raise


def export_checkpoint(model: Any, plan: RolePlan, folder: Path) -> None:
    import torch
    from modelopt.torch.export import export_tensorrt_llm_checkpoint

    with torch.inference_mode(), _quiet_stdout():
        export_tensorrt_llm_checkpoint(
            model,
            plan.model_type,
            getattr(torch, plan.dtype),
            export_dir=folder,
            inference_tensor_parallel=plan.tp_size,
            inference_pipeline_parallel=plan.pp_size,
        )


def _finish_config(plan: RolePlan, folder: Path) -> tuple[dict[str, Any], list[str]]:
    path = folder / "config.json"
    raw = json.loads(path.read_text())
    exported_kv = (raw.get("quantization") or {}).get("kv_cache_quant_algo")
    if plan.kv_cache == "fp8" and exported_kv != "FP8":
        raise CheckpointError(
            f"[{plan.role}] modelopt exported kv_cache_quant_algo {exported_kv!r}, not FP8: the "
            "KV-cache scales are missing. Report this with the modelopt version."
        )
    hf_config = json.loads((plan.hf_dir / "config.json").read_text())
    config, edits = apply_fixups(
        raw, hf_config, formats.get_format(plan.quantization), plan.kv_cache, plan.architecture, plan.model_type
    )
    if plan.quant_algo is not None and config["quantization"].get("quant_algo") != plan.quant_algo:
        raise CheckpointError(
            f"[{plan.role}] exported quant_algo {config['quantization'].get('quant_algo')!r}, "
            f"expected {plan.quant_algo!r}."
        )
    path.write_text(json.dumps(config, indent=4) + "\n")
    extra = folder / "quant_cfg.json"  # per-layer formats; TensorRT-LLM reads it only for MIXED_PRECISION
    if extra.is_file() and config["quantization"].get("quant_algo") != "MIXED_PRECISION":
        if json.loads(extra.read_text()).get("quantized_layers"):
            raise CheckpointError(
                f"[{plan.role}] modelopt wrote per-layer quantization (quant_cfg.json) for a "
                f"single-format export ({plan.quantization}). Report this with the modelopt version."
            )
        extra.unlink()
        edits.append("removed quant_cfg.json (no quantized layers)")
    return config, edits


def convert_role(
    plan: RolePlan,
    options: ConvertOptions,
    force: bool = False,
    verify: bool = False,
    log: Log = print,
    progress: bool = False,
) -> dict[str, Any]:
    """Convert one role; returns its result (the manifest, or the existing one when up to date)."""
    versions = tool_versions(*TOOLS)
    hashes = source_hashes(plan)
    digest = input_hash(plan, hashes, versions)
    with stage_output(plan.out_dir, stage="convert", force=force) as out:
        if out.up_to_date(digest):
            manifest = out.existing_manifest() or {}
            log(f"[{plan.role}] {plan.out_dir} is up to date (inputs unchanged); nothing to do. --force redoes it.")
            result = {"role": plan.role, "status": "skipped", "checkpoint": str(plan.out_dir), "manifest": manifest}
            if verify:
                from specbuild.convert.verify import verify_checkpoint

                result["verification"] = verify_checkpoint(plan.out_dir, plan.hf_dir, plan.quantization).to_dict()
            return result
        timings: dict[str, float] = {}
        start = time.perf_counter()
        device = resolve_device(options.device)
        log(f"[{plan.role}] loading {plan.hf_dir} on {device}")
        model = load_hf_model(plan, device)
        timings["load_s"] = round(time.perf_counter() - start, 3)
        fit_vocab(model, plan, log)
        if plan.pad_intermediate_to:
            log(
                f"[{plan.role}] padding the MLP width to {plan.pad_intermediate_to} (zeros) for AWQ blocks of "
                f"{plan.awq_block_size}"
            )
            pad_intermediate(model, plan.pad_intermediate_to)
        mark = time.perf_counter()
        calibration = calibrate(model, plan, options, device, log, progress)
        timings["quantize_s"] = round(time.perf_counter() - mark, 3)
        mark = time.perf_counter()
        log(f"[{plan.role}] exporting ({plan.quantization}, {plan.dtype}, tp {plan.tp_size}, pp {plan.pp_size})")
        export_checkpoint(model, plan, out.tmp)
        del model
        config, edits = _finish_config(plan, out.tmp)
        timings["export_s"] = round(time.perf_counter() - mark, 3)
        verification = None
        if verify:
            from specbuild.convert.verify import verify_checkpoint

            mark = time.perf_counter()
            report = verify_checkpoint(out.tmp, plan.hf_dir, plan.quantization)
            timings["verify_s"] = round(time.perf_counter() - mark, 3)
            verification = report.to_dict()
            if not report.passed:
                raise CheckpointError(
                    f"[{plan.role}] verification failed: {report.summary()}. The checkpoint was not written."
                )
        timings["total_s"] = round(time.perf_counter() - start, 3)
        quant = config.get("quantization") or {}
        manifest = out.commit(
            {
                "stage": "convert",
                "role": plan.role,
                "pair": plan.pair,
                "input_hash": digest,
                "spec": plan.spec_settings,
                "settings": plan.settings(),
                "quant_algo": quant.get("quant_algo"),
                "kv_cache_quant_algo": quant.get("kv_cache_quant_algo"),
                "mapping": config.get("mapping"),
                "vocab_size": config.get("vocab_size"),
                "vocab_trimmed": ({"from": plan.vocab_rows, "to": plan.trim_vocab_to} if plan.trim_vocab_to else None),
                "architecture": config.get("architecture"),
                "dtype": config.get("dtype"),
                "source": {"path": str(plan.hf_dir), "files": hashes},
                "files": hash_tree(out.tmp),
                "tool_versions": versions,
                "timings": timings,
                "calibration": calibration,
                "fixups": edits,
                "verification": verification,
                "device": device,
            }
        )
        log(f"[{plan.role}] wrote {plan.out_dir} (quant_algo {quant.get('quant_algo')}, {timings['total_s']:.1f} s)")
        return {
            "role": plan.role,
            "status": "ran",
            "checkpoint": str(plan.out_dir),
            "manifest": manifest,
            **({"verification": verification} if verification else {}),
        }
