"""The reference backend: a PyTorch-runnable engine made from the same TensorRT-LLM checkpoint.

Layout of a reference engine folder (what the reference runtime and the CPU Triton models load):

    config.json          Hugging Face config (e.g. LlamaConfig fields), torch_dtype float32
    model.safetensors    Hugging Face tensor names (model.layers.N.self_attn.q_proj.weight, ...),
                         DEQUANTIZED to float32 whatever the checkpoint's quantization
    engine.json          the limits a trtllm-build engine would have (target: max_seq_len + K), the
                         quant_algo the weights came from, vocab_size, the logits dtype a trtllm-build
                         engine of this checkpoint would have, the loader's notes
    activation_quant.json / .safetensors
                         only for FP8 / INT8 activation quantization (fp8, int8_sq, w4a8_awq): the static
                         input scales per module, which the runtime may apply (convert.loader.to_hf_model)
    tokenizer files      copied from the Hugging Face checkpoint, so the folder is self-contained
    manifest.json        inputs' hashes, tool versions, smoke-test result

float32 is deliberate: the reference engine exists to exercise the converted (and quantized,
then dequantized) weights numerically on any machine, and CPU float16 matmuls would add their
own rounding on top. The quantization error itself is kept: weights are the dequantized values.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any, Callable

from specbuild.artifacts import hash_file, stage_output, tool_versions, write_json
from specbuild.engines.plan import RolePlan
from specbuild.engines.trtllm import engine_input_hash
from specbuild.engines.versions import REFERENCE_FORMAT
from specbuild.errors import BuildError, CheckpointError
from specbuild.progress import quiet_library_bars

TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model", "vocab.json",
    "merges.txt", "added_tokens.json", "generation_config.json", "chat_template.jinja",
)
SMOKE_TOKENS = 8


def tokenizer_files(hf_dir: Path) -> list[Path]:
    found = [hf_dir / name for name in TOKENIZER_FILES if (hf_dir / name).is_file()]
    if not any(p.name in ("tokenizer.json", "tokenizer.model", "vocab.json") for p in found):
        raise CheckpointError(
            f"no tokenizer files (tokenizer.json, tokenizer.model or vocab.json) in {hf_dir}: the reference engine "
            "copies the tokenizer so it is self-contained. Point the spec's checkpoint at a full Hugging Face model folder."
        )
    return found


def engine_json(plan: RolePlan, vocab_size: int, checkpoint_config: dict[str, Any]) -> dict[str, Any]:
    """checkpoint_config: the TensorRT-LLM checkpoint's config.json. Its logits_dtype (modelopt writes one;
    PretrainedConfig's default is float32) is the engine's, since specbuild passes trtllm-build no
    --logits_dtype; the reference model returns generation_logits in it and checks the declared type."""
    built = plan.expected_build_config()
    return {
        "format": "specbuild-reference",
        "format_version": REFERENCE_FORMAT,
        "role": plan.role,
        "max_batch_size": built["max_batch_size"],
        "max_input_len": built["max_input_len"],
        "max_seq_len": built["max_seq_len"],
        "max_num_tokens": built["max_num_tokens"],
        "max_draft_len": built["max_draft_len"],
        "speculative_decoding_mode": plan.speculative_decoding_mode,
        "gather_generation_logits": plan.gather_generation_logits,
        "quant_algo": plan.quant_algo,
        "kv_cache_quant_algo": plan.kv_cache_quant_algo,
        "source_dtype": plan.dtype,
        "dtype": "float32",
        "logits_dtype": str(checkpoint_config.get("logits_dtype") or "float32"),
        "vocab_size": vocab_size,
    }


def write_config(hf_config: dict[str, Any], hf_dir: Path, folder: Path) -> dict[str, Any]:
    """The HF config.json: the loader's config arguments (the family's transformers config), the special token ids and
    family keys of the original model, float32."""
    from transformers import AutoConfig

    data = dict(hf_config)
    original = hf_dir / "config.json"
    if original.is_file():
        try:
            source = json.loads(original.read_text())
        except (OSError, json.JSONDecodeError):
            source = {}
        # the special tokens, and what the family reads that a TensorRT-LLM checkpoint does not carry (its window,
        # the activation under its family's key)
        for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
            if source.get(key) is not None:
                data[key] = source[key]
        for key in ("sliding_window", "use_sliding_window", "max_window_layers", "hidden_activation"):
            if key in source:  # null included: a Mistral without a window must not get MistralConfig's default
                data[key] = source[key]
    model_type = data.pop("model_type", "llama")
    config = AutoConfig.for_model(model_type, **data)
    config.dtype = "float32"
    config.save_pretrained(str(folder))
    return config.to_dict()


def write_activation_quant(activation_quant: dict[str, Any], folder: Path) -> str | None:
    """Static input quantization (FP8 / INT8 activations) is not a weight property: kept beside the weights.

    activation_quant.json: {HF module name: {"kind": "fp8"|"int8", "scale": float, "pre_quant_scale": bool}};
    activation_quant.safetensors: the pre_quant_scale vectors [in_features], by module name.
    """
    from safetensors.torch import save_file

    active = {name: act for name, act in activation_quant.items() if act.kind != "none"}
    if not active:
        return None
    write_json(folder / "activation_quant.json", {
        name: {"kind": act.kind, "scale": act.scale, "pre_quant_scale": act.pre_quant_scale is not None}
        for name, act in sorted(active.items())
    })
    scales = {name: act.pre_quant_scale.float().contiguous() for name, act in active.items()
              if act.pre_quant_scale is not None}
    if scales:
        save_file(scales, str(folder / "activation_quant.safetensors"), metadata={"format": "pt"})
    return "activation_quant.json"


def write_weights(state_dict: dict[str, Any], path: Path) -> int:
    """Save as float32 safetensors; tensors sharing storage (tied embeddings) are copied apart."""
    import torch
    from safetensors.torch import save_file

    tensors, seen = {}, set()
    for name, tensor in state_dict.items():
        t = tensor.detach().to(torch.float32).contiguous()
        if t.data_ptr() in seen:
            t = t.clone()
        seen.add(t.data_ptr())
        tensors[name] = t
    save_file(tensors, str(path), metadata={"format": "pt"})
    return sum(t.numel() for t in tensors.values())


def smoke_test(folder: Path, vocab_size: int, source: Path | None = None,
               converted: Path | None = None) -> dict[str, Any]:
    """Load the folder with transformers and run one forward pass over a few tokens.
    source, converted: the HF and TensorRT-LLM checkpoints, searched for NaN/Inf when the logits hold any."""
    import torch
    from transformers import AutoModelForCausalLM

    from transformers.utils import logging as hf_logging

    bar_was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # one small load: no "Loading weights" bar in the build log
    try:
        with quiet_library_bars():
            model, info = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32, output_loading_info=True)
    finally:
        if bar_was_on:
            hf_logging.enable_progress_bar()
    missing = [k for k in info.get("missing_keys", []) if not (k == "lm_head.weight" and model.config.tie_word_embeddings)]
    unexpected = list(info.get("unexpected_keys", []))
    if missing or unexpected:
        raise BuildError(
            f"the reference engine's weights do not match {type(model).__name__}: missing {missing[:5]}, "
            f"unexpected {unexpected[:5]}. The checkpoint loader mapped names wrongly; report this with the checkpoint's config.json."
        )
    model.eval()
    n = SMOKE_TOKENS
    input_ids = (torch.arange(n, dtype=torch.long) * 7919 % vocab_size).unsqueeze(0)  # [1, n]
    with torch.no_grad():
        logits = model(input_ids=input_ids).logits  # [1, n, vocab]
    shape = list(logits.shape)
    finite = bool(torch.isfinite(logits).all())
    if shape != [1, n, vocab_size]:
        raise BuildError(
            f"the reference engine's smoke test failed: logits shape {shape} (expected [1, {n}, {vocab_size}]). "
            "The converted checkpoint's shapes are wrong; run `specbuild convert --force` and check its log."
        )
    if not finite:
        from specbuild.check.weights import smoke_failure_advice

        advice = smoke_failure_advice(source, converted) if source and converted else ""
        raise BuildError(f"the reference engine's smoke test failed: its logits hold NaN or Inf. {advice}".strip())
    return {"tokens": n, "logits_shape": shape, "finite": finite, "argmax": logits[0].argmax(-1).tolist()}


def reference_input_hash(plan: RolePlan, hf_dir: Path) -> tuple[str, dict[str, str], dict[str, str]]:
    """(input hash, checkpoint file hashes, tokenizer file hashes)."""
    tok_hashes = {p.name: hash_file(p) for p in tokenizer_files(hf_dir)}
    input_hash, files = engine_input_hash(plan, "reference", {"format": REFERENCE_FORMAT, "tokenizer": tok_hashes})
    return input_hash, files, tok_hashes


def build_reference_role(plan: RolePlan, pair: str, hf_dir: Path, force: bool = False,
                         log: Callable[[str], None] = lambda m: None) -> dict[str, Any]:
    started = time.monotonic()
    input_hash, files, tok_hashes = reference_input_hash(plan, hf_dir)
    tokenizer = tokenizer_files(hf_dir)
    with stage_output(plan.engine_dir, stage="build", force=force) as out:
        if out.up_to_date(input_hash):
            log(f"{plan.role}: reference engine up to date ({plan.engine_dir}), skipped. Use --force to rebuild.")
            return {"role": plan.role, "status": "skipped", "engine_dir": str(plan.engine_dir),
                    "manifest": out.existing_manifest()}
        import torch

        from specbuild.convert.loader import load_trtllm_checkpoint

        log(f"{plan.role}: loading the TensorRT-LLM checkpoint {plan.checkpoint_dir}")
        loaded = load_trtllm_checkpoint(plan.checkpoint_dir, dtype=torch.float32)
        config = write_config(loaded.hf_config, hf_dir, out.tmp)
        vocab_size = int(config["vocab_size"])
        checkpoint_config = dict(loaded.trtllm_config)
        n_params = write_weights(loaded.state_dict, out.tmp / "model.safetensors")
        act_file = write_activation_quant(loaded.activation_quant, out.tmp)
        notes = list(loaded.notes)
        del loaded
        write_json(out.tmp / "engine.json", {**engine_json(plan, vocab_size, checkpoint_config),
                                             "activation_quant": act_file,
                                             "notes": notes})
        for path in tokenizer:
            shutil.copyfile(path, out.tmp / path.name)
        log(f"{plan.role}: smoke test (one forward pass over {SMOKE_TOKENS} tokens)")
        smoke = smoke_test(out.tmp, vocab_size, source=hf_dir, converted=plan.checkpoint_dir)
        versions = {**tool_versions("torch", "transformers", "safetensors"), "reference_format": REFERENCE_FORMAT}
        manifest = out.commit({
            "stage": "build",
            "backend": "reference",
            "pair": pair,
            "role": plan.role,
            "input_hash": input_hash,
            "checkpoint_input_hash": (plan.checkpoint_manifest or {}).get("input_hash"),
            "inputs": {"checkpoint_dir": str(plan.checkpoint_dir), "files": files,
                       "tokenizer_dir": str(hf_dir), "tokenizer_files": tok_hashes},
            "argv": None,
            "argv_text": None,
            "tool_versions": versions,
            "settings": plan.settings(),
            "build_config": plan.expected_build_config(),
            "parameters": n_params,
            "smoke_test": smoke,
            "seconds": round(time.monotonic() - started, 3),
        })
    log(f"{plan.role}: reference engine written to {plan.engine_dir} ({n_params:,} parameters, float32)")
    return {"role": plan.role, "status": "ran", "engine_dir": str(plan.engine_dir), "manifest": manifest}
