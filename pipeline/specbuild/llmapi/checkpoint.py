"""`specbuild convert --backend llmapi`: one Hugging Face checkpoint per role, as TensorRT-LLM's PyTorch
backend loads it, at <output_dir>/<name>/<role>/hf_checkpoint (stage "convert-hf").

The same plan as the engine path (`specbuild.convert.plan`: architecture, vocabulary padding or trimming,
calibration), then:
- quantized (fp8 weights, optionally an FP8 KV cache): modelopt quantizes with calibration and
  `modelopt.torch.export.export_hf_checkpoint` writes safetensors, config.json with quantization_config,
  and hf_quant_config.json (NVIDIA/Model-Optimizer modelopt/torch/export/unified_export_hf.py);
- unquantized: the weights at the spec's dtype with `save_pretrained`, and **no hf_quant_config.json**:
  modelopt 0.37 (what TensorRT-LLM 1.2 pins) writes one with "quant_algo": null even for an unquantized
  model, and TensorRT-LLM's loader then raises "Pre-quantized checkpoint must have quant_algo."
  (tensorrt_llm/llmapi/llm_utils.py ModelLoader._update_from_hf_quant_config). A file like that is
  refused here too.
The tokenizer files are copied beside the weights (the LLM API loads the tokenizer from `model`).
Cached and atomic like every stage (`specbuild.artifacts.stage_output`); `--verify` reads the folder
back and compares it with the original model (`hfexport.verify_export`).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from specbuild.artifacts import combined_hash, hash_tree, stage_output, tool_versions
from specbuild.config import Spec
from specbuild.contract import llmapi as contract
from specbuild.convert.plan import TOOLS, ConvertOptions, RolePlan
from specbuild.errors import CheckpointError, SpecError
from specbuild.llmapi.args import check_spec

STAGE = "convert-hf"
FOLDER = "hf_checkpoint"
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".msgpack", ".h5", ".gguf")
NOT_COPIED = ("config.json", "generation_config.json", "model.safetensors.index.json", "pytorch_model.bin.index.json")


def checkpoint_dir(spec: Spec, role: str) -> Path:
    return spec.pair_dir / role / FOLDER


def plan_roles(spec: Spec, roles: list[str], options: ConvertOptions) -> list[RolePlan]:
    from specbuild.convert.plan import plan_roles as engine_plans

    check_spec(spec)
    for role in roles:
        model = spec.role(role)
        if model.kv_cache == "fp8" and model.quantization == "none":
            raise SpecError(
                f"{role}.kv_cache = 'fp8' with quantization = 'none': the exported hf_quant_config.json "
                'would have quant_algo null, which TensorRT-LLM refuses ("Pre-quantized checkpoint must '
                f'have quant_algo."). Set {role}.quantization = "fp8", or kv_cache = "none".'
            )
    return [
        dataclasses.replace(plan, out_dir=checkpoint_dir(spec, plan.role))
        for plan in engine_plans(spec, roles, options, path="llmapi")
    ]


def describe(plan: RolePlan) -> dict[str, Any]:
    quantized = plan.quantization != "none"
    files = ["config.json", "generation_config.json", "model.safetensors", "<tokenizer files>"]
    files += [contract.HF_QUANT_CONFIG] if quantized else []
    return {
        **plan.settings(),
        "stage": STAGE,
        "exporter": "modelopt export_hf_checkpoint" if quantized else "save_pretrained",
        "would_write": [str(plan.out_dir / f) for f in (*files, "manifest.json")],
    }


def _copy_tokenizer(source: Path, folder: Path) -> list[str]:
    copied = []
    for path in sorted(source.iterdir()):
        if (
            path.is_file()
            and path.name not in NOT_COPIED
            and not path.name.endswith(WEIGHT_SUFFIXES)
            and not (folder / path.name).exists()
        ):
            shutil.copy2(path, folder / path.name)
            copied.append(path.name)
    return copied


def export(model: Any, plan: RolePlan, folder: Path) -> None:
    import torch

    from specbuild.convert.export import _quiet_stdout

    dtype = getattr(torch, plan.dtype)
    model = model.to(dtype)  # modelopt keeps unquantized tensors (norms, embeddings) in the model's own dtype
    with torch.inference_mode(), _quiet_stdout():
        if plan.quantization == "none":
            model.save_pretrained(folder, safe_serialization=True)
        else:
            from modelopt.torch.export import export_hf_checkpoint

            export_hf_checkpoint(model, dtype=dtype, export_dir=folder)


def check_written(plan: RolePlan, folder: Path) -> tuple[str | None, str | None, list[str]]:
    """(quant_algo, kv_cache_quant_algo, edits): what the folder says, checked against the plan."""
    from specbuild.llmapi.hfexport import quant_algo

    edits = []
    path = folder / contract.HF_QUANT_CONFIG
    if plan.quantization == "none" and path.is_file():
        data = json.loads(path.read_text()).get("quantization") or {}
        if data.get("quant_algo") is None and data.get("kv_cache_quant_algo") is None:
            path.unlink()  # modelopt 0.37's file for an unquantized model: TensorRT-LLM would refuse it
            edits.append(f"removed {contract.HF_QUANT_CONFIG} (quant_algo null)")
    algo, kv = quant_algo(folder)
    if algo != plan.quant_algo:
        raise CheckpointError(
            f"[{plan.role}] the export says quant_algo {algo!r}, expected {plan.quant_algo!r}. "
            "Report this with the modelopt version."
        )
    if kv != plan.kv_cache_quant_algo:
        raise CheckpointError(
            f"[{plan.role}] the export says kv_cache_quant_algo {kv!r}, expected "
            f"{plan.kv_cache_quant_algo!r}: the KV-cache scales are missing."
        )
    return algo, kv, edits


def input_hash(plan: RolePlan, source_hashes: dict[str, str], versions: dict[str, str | None]) -> str:
    """What the role's checkpoint is made from: its settings, the source files' hashes (hash_tree of plan.hf_dir),
    the tools' versions (tool_versions(*TOOLS))."""
    return combined_hash(STAGE, plan.settings(), source_hashes, versions)


def convert_role(
    plan: RolePlan,
    options: ConvertOptions,
    force: bool = False,
    verify: bool = False,
    log: Callable[[str], None] = print,
    progress: bool = False,
) -> dict[str, Any]:
    from specbuild.convert.export import calibrate, fit_vocab, load_hf_model, resolve_device
    from specbuild.llmapi.hfexport import verify_export

    hashes, versions = hash_tree(plan.hf_dir), tool_versions(*TOOLS)  # the weights are read once
    digest = input_hash(plan, hashes, versions)
    with stage_output(plan.out_dir, stage=STAGE, force=force) as out:
        if out.up_to_date(digest):
            log(f"[{plan.role}] {plan.out_dir} is up to date (inputs unchanged); nothing to do. --force redoes it.")
            result = {
                "role": plan.role,
                "status": "skipped",
                "checkpoint": str(plan.out_dir),
                "manifest": out.existing_manifest() or {},
            }
            if verify:
                result["verification"] = verify_export(
                    plan.out_dir, plan.hf_dir, plan.quantization, plan.dtype
                ).to_dict()
            return result
        start = time.perf_counter()
        device = resolve_device(options.device)
        log(f"[{plan.role}] loading {plan.hf_dir} on {device}")
        model = load_hf_model(plan, device)
        fit_vocab(model, plan, log)
        calibration = calibrate(model, plan, options, device, log, progress)
        log(f"[{plan.role}] writing the Hugging Face checkpoint ({plan.quantization}, {plan.dtype})")
        export(model, plan, out.tmp)
        del model
        algo, kv, edits = check_written(plan, out.tmp)
        tokenizer_files = _copy_tokenizer(plan.hf_dir, out.tmp)
        verification = None
        if verify:
            report = verify_export(out.tmp, plan.hf_dir, plan.quantization, plan.dtype)
            verification = report.to_dict()
            if not report.passed:
                raise CheckpointError(
                    f"[{plan.role}] verification failed: {report.summary()}. The checkpoint was not written."
                )
        manifest = out.commit(
            {
                "stage": STAGE,
                "backend": "llmapi",
                "role": plan.role,
                "pair": plan.pair,
                "input_hash": digest,
                "spec": plan.spec_settings,
                "settings": plan.settings(),
                "quant_algo": algo,
                "kv_cache_quant_algo": kv,
                "vocab_size": json.loads((out.tmp / "config.json").read_text()).get("vocab_size"),
                "source": {"path": str(plan.hf_dir), "files": hashes},
                "files": hash_tree(out.tmp),
                "tokenizer_files": tokenizer_files,
                "tool_versions": versions,
                "calibration": calibration,
                "edits": edits,
                "verification": verification,
                "device": device,
                "seconds": round(time.perf_counter() - start, 3),
            }
        )
        log(f"[{plan.role}] wrote {plan.out_dir} (quant_algo {algo})")
        return {
            "role": plan.role,
            "status": "ran",
            "checkpoint": str(plan.out_dir),
            "manifest": manifest,
            **({"verification": verification} if verification else {}),
        }


def convert_pair(
    spec: Spec,
    roles: list[str],
    options: ConvertOptions | None = None,
    force: bool = False,
    verify: bool = False,
    log: Callable[[str], None] = print,
    progress: bool = False,
) -> list[dict]:
    options = options or ConvertOptions()
    return [
        convert_role(plan, options, force=force, verify=verify, log=log, progress=progress)
        for plan in plan_roles(spec, roles, options)
    ]
