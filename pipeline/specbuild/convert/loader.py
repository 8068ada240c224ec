"""Load a TensorRT-LLM checkpoint (config.json + rank{N}.safetensors) back into Hugging Face form.

This is the reference backend's weight loader: it maps TensorRT-LLM weight names back to
`LlamaForCausalLM` names, splits the fused q/k/v (and fused gate/up, when present), merges
tensor- and pipeline-parallel shards, and dequantizes what modelopt exported:

    FP8                  w = fp8 * weights_scaling_factor                      (per tensor)
    W8A8_SQ_PER_CHANNEL  w = int8 * weights_scaling_factor[out]
    W4A16_AWQ            w = int4 * weights_scaling_factor[out, in // group]   (2 int4 per int8, along out)
    W4A8_AWQ             as W4A16_AWQ, then rounded through fp8 with weights_scaling_factor_2
    W8A16 / W4A16        float weights; trtllm-build quantizes them per output channel, which
                         `simulate_build_quant` reproduces (symmetric, max-abs scale)

AWQ and SmoothQuant also carry `prequant_scaling_factor[in]` (the smoothing scale applied to the
layer's input); it is folded into the weight. Static activation quantization (FP8, SQ, W4A8) is
not a weight property: it is returned as `activation_quant` and applied by `to_hf_model`'s hooks.
The FP8 KV cache is not simulated (its scales are only checked to be present).

Naming (TensorRT-LLM LLaMA, as exported by modelopt): attention.qkv = [q; k; v] per rank,
attention.dense = o_proj, mlp.fc = gate_proj, mlp.gate = up_proj, mlp.proj = down_proj,
post_layernorm = post_attention_layernorm; a fused mlp.fc of twice the width is [up; gate].
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specbuild import families
from specbuild.errors import CheckpointError
from specbuild.quantization import FORMATS

LOADER_ARCHITECTURES = tuple(f.architecture for f in families.FAMILIES.values() if f.engine_export)
QUANT_ALGOS = tuple(fmt.quant_algo for fmt in FORMATS.values())  # specbuild.quantization's, each read below
REQUIRED_KEYS = (
    "architecture",
    "dtype",
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "hidden_act",
)
_COLUMN = ("attention.qkv", "mlp.fc", "mlp.gate")  # split along the output dim across TP ranks
_ROW = ("attention.dense", "mlp.proj")  # split along the input dim
_HF_LINEAR = {
    "attention.dense": "self_attn.o_proj",
    "mlp.fc": "mlp.gate_proj",
    "mlp.gate": "mlp.up_proj",
    "mlp.proj": "mlp.down_proj",
}
FP8_MAX = 448.0


@dataclass
class ActivationQuant:
    """Static per-tensor input quantization TensorRT-LLM applies before a quantized GEMM."""

    kind: str  # "fp8" or "int8"
    scale: float  # activation_scaling_factor
    pre_quant_scale: Any = None  # torch.Tensor [in_features] or None; already folded into the weight


@dataclass
class LoadedCheckpoint:
    hf_config: dict[str, Any]  # transformers LlamaConfig keyword arguments
    state_dict: dict[str, Any]  # HF LlamaForCausalLM names -> dequantized torch.Tensor (dtype asked for)
    trtllm_config: dict[str, Any]  # the checkpoint's config.json as written
    activation_quant: dict[str, ActivationQuant] = field(default_factory=dict)  # HF module name -> input quant
    notes: list[str] = field(default_factory=list)  # what was simulated or skipped

    @property
    def quant_algo(self) -> str | None:
        return (self.trtllm_config.get("quantization") or {}).get("quant_algo")


def read_trtllm_config(ckpt_dir: Path) -> dict[str, Any]:
    path = Path(ckpt_dir) / "config.json"
    if not path.is_file():
        raise CheckpointError(f"{ckpt_dir} has no config.json: not a TensorRT-LLM checkpoint. Run `specbuild convert`.")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckpointError(f"{path} is unreadable ({err}). Run `specbuild convert --force`.") from None
    if not isinstance(config, dict):
        raise CheckpointError(f"{path} is not a JSON object. Run `specbuild convert --force`.")
    missing = [key for key in REQUIRED_KEYS if config.get(key) is None]
    if missing:
        raise CheckpointError(f"{path} lacks the mandatory keys {missing}. Run `specbuild convert --force`.")
    if config["architecture"] not in LOADER_ARCHITECTURES:
        raise CheckpointError(
            f"{path}: architecture {config['architecture']!r} is not supported by the reference loader. "
            f"Supported: {', '.join(LOADER_ARCHITECTURES)}."
        )
    algo = (config.get("quantization") or {}).get("quant_algo")
    if algo not in QUANT_ALGOS:
        raise CheckpointError(
            f"{path}: quant_algo {algo!r} is not supported by the reference loader. "
            f"Supported: {', '.join(str(a) for a in QUANT_ALGOS)}."
        )
    return config


def _load_rank(path: Path) -> dict[str, Any]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    if not path.is_file():
        raise CheckpointError(f"{path} is missing: the checkpoint is incomplete. Run `specbuild convert --force`.")
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, RuntimeError, ValueError) as err:
        raise CheckpointError(f"{path} is corrupt ({err}). Run `specbuild convert --force`.") from None


def _need(tensors: dict[str, Any], name: str, where: Path) -> Any:
    if name not in tensors:
        raise CheckpointError(f"{where}: tensor {name!r} is missing. Run `specbuild convert --force`.")
    return tensors[name]


def unpack_int4(packed: Any) -> Any:
    """[out / 2, in] int8 holding two signed int4 along the output dim -> [out, in] int8 in -8..7."""
    import torch

    raw = packed.view(torch.uint8).to(torch.int16)
    low, high = raw & 0x0F, (raw >> 4) & 0x0F
    low = torch.where(low >= 8, low - 16, low)
    high = torch.where(high >= 8, high - 16, high)
    out = torch.stack([low, high], dim=1)  # [out / 2, 2, in]: row 2j is the low nibble, 2j + 1 the high
    return out.reshape(-1, packed.shape[-1]).to(torch.int8)


def fp8_round_trip(x: Any, scale: Any) -> Any:
    import torch

    return (x / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).float() * scale


def weight_only_round_trip(weight: Any, bits: int) -> Any:
    """What trtllm-build does to W8A16/W4A16 weights: symmetric per-output-channel quantization."""
    qmax = 2 ** (bits - 1) - 1
    scale = weight.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / qmax  # [out, 1]
    return (weight / scale).round().clamp(-qmax - 1, qmax) * scale


def _dequant_linear(
    tensors: dict[str, Any], prefix: str, algo: str | None, where: Path, simulate_build_quant: bool
) -> tuple[Any, Any, ActivationQuant | None]:
    """(weight [out, in] float32, bias [out] or None, activation quant) of one linear layer on one rank."""
    import torch

    weight = _need(tensors, f"{prefix}.weight", where)
    bias = tensors.get(f"{prefix}.bias")
    bias = bias.float() if bias is not None else None
    if weight.dtype in (torch.float16, torch.bfloat16, torch.float32):
        w = weight.float()
        if simulate_build_quant and algo in ("W8A16", "W4A16"):
            w = weight_only_round_trip(w, 8 if algo == "W8A16" else 4)
        return w, bias, None
    scale = _need(tensors, f"{prefix}.weights_scaling_factor", where).float()
    if weight.dtype == torch.float8_e4m3fn:
        w = weight.float() * (scale if scale.numel() == 1 else scale.reshape(-1, 1))
        act_kind = "fp8"
    elif algo == "W8A8_SQ_PER_CHANNEL":
        w = weight.float() * (scale if scale.numel() == 1 else scale.reshape(-1, 1))
        act_kind = "int8"
    elif algo in ("W4A16_AWQ", "W4A8_AWQ"):
        q = unpack_int4(weight).float()  # [out, in]
        group = q.shape[1] // scale.shape[1]
        w = q * scale.repeat_interleave(group, dim=1)
        act_kind = None
        if algo == "W4A8_AWQ":
            w = fp8_round_trip(w, _need(tensors, f"{prefix}.weights_scaling_factor_2", where).float())
            act_kind = "fp8"
    else:
        raise CheckpointError(f"{where}: {prefix}.weight has dtype {weight.dtype}, unexpected for {algo}.")
    pqs = tensors.get(f"{prefix}.prequant_scaling_factor")
    if pqs is not None:
        pqs = pqs.float()
        w = w * pqs.reshape(1, -1)
    act = None
    if act_kind is not None and f"{prefix}.activation_scaling_factor" in tensors:
        act = ActivationQuant(act_kind, float(tensors[f"{prefix}.activation_scaling_factor"].float().max()), pqs)
    elif pqs is not None:
        act = ActivationQuant("none", 1.0, pqs)
    return w, bias, act


def _layer_counts(rank_tensors: list[dict[str, Any]], tp: int, pp: int) -> list[int]:
    counts = []
    for pp_rank in range(pp):
        names = rank_tensors[pp_rank * tp].keys()
        counts.append(len({n.split(".")[2] for n in names if n.startswith("transformer.layers.")}))
    return counts


def load_trtllm_checkpoint(
    ckpt_dir: str | Path, dtype: Any = None, rank: int | None = None, simulate_build_quant: bool = True
) -> LoadedCheckpoint:
    """Load, dequantize and merge a TensorRT-LLM checkpoint. `rank`: load only that rank (world size 1 only)."""
    import torch

    dtype = dtype or torch.float32
    ckpt_dir = Path(ckpt_dir)
    config = read_trtllm_config(ckpt_dir)
    mapping = config.get("mapping") or {}
    tp, pp = int(mapping.get("tp_size", 1)), int(mapping.get("pp_size", 1))
    world = int(mapping.get("world_size", tp * pp))
    if world != tp * pp:
        raise CheckpointError(f"{ckpt_dir}/config.json: mapping world_size {world} != tp_size {tp} x pp_size {pp}.")
    if rank is not None and not 0 <= rank < world:
        raise CheckpointError(f"rank {rank} does not exist in {ckpt_dir} (world size {world}).")
    if rank is not None and world > 1:
        raise CheckpointError(f"{ckpt_dir} is sharded over {world} ranks; load it with rank=None to merge them.")
    paths = [ckpt_dir / f"rank{r}.safetensors" for r in range(world)]
    ranks = [_load_rank(path) for path in paths]
    algo = (config.get("quantization") or {}).get("quant_algo")
    kv_algo = (config.get("quantization") or {}).get("kv_cache_quant_algo")

    family = families.FAMILIES[config["architecture"]]
    heads, layers = int(config["num_attention_heads"]), int(config["num_hidden_layers"])
    kv_heads = int(config.get("num_key_value_heads") or heads)
    hidden = int(config["hidden_size"])
    head_dim = int(config.get("head_size") or hidden // heads)
    vocab = int(config["vocab_size"])
    counts = _layer_counts(ranks, tp, pp)
    if sum(counts) != layers:
        raise CheckpointError(
            f"{ckpt_dir}: the rank files hold {sum(counts)} layers, config.json says num_hidden_layers = {layers}. "
            "Run `specbuild convert --force`."
        )
    state: dict[str, Any] = {}
    acts: dict[str, ActivationQuant] = {}

    emb_dim = int(config.get("embedding_sharding_dim", 0)) if config.get("use_parallel_embedding") else None
    emb = [_need(ranks[t], "transformer.vocab_embedding.weight", paths[t]) for t in range(tp)]
    emb = torch.cat(emb, dim=emb_dim) if emb_dim is not None and tp > 1 else emb[0]
    state["model.embed_tokens.weight"] = emb[:vocab].float()
    last = ranks[(pp - 1) * tp : pp * tp]
    state["model.norm.weight"] = _need(last[0], "transformer.ln_f.weight", paths[(pp - 1) * tp]).float()
    if "lm_head.weight" in last[0]:
        state["lm_head.weight"] = torch.cat([r["lm_head.weight"].float() for r in last], dim=0)[:vocab]
    elif config.get("share_embedding_table") or config.get("tie_word_embeddings"):
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    else:
        raise CheckpointError(f"{ckpt_dir}: tensor 'lm_head.weight' is missing. Run `specbuild convert --force`.")

    offset = 0
    for pp_rank, count in enumerate(counts):
        shard = ranks[pp_rank * tp : (pp_rank + 1) * tp]
        shard_paths = paths[pp_rank * tp : (pp_rank + 1) * tp]
        where = shard_paths[0]
        for local in range(count):
            g, src = offset + local, f"transformer.layers.{local}"
            dst = f"model.layers.{g}"
            state[f"{dst}.input_layernorm.weight"] = _need(shard[0], f"{src}.input_layernorm.weight", where).float()
            state[f"{dst}.post_attention_layernorm.weight"] = _need(
                shard[0], f"{src}.post_layernorm.weight", where
            ).float()
            if family.qk_norm:  # per-head norms, replicated on every rank
                for trt, hf in (("q_layernorm", "q_norm"), ("k_layernorm", "k_norm")):
                    state[f"{dst}.self_attn.{hf}.weight"] = _need(
                        shard[0], f"{src}.attention.{trt}.weight", where
                    ).float()
            parts = {
                name: [
                    _dequant_linear(t, f"{src}.{name}", algo, path, simulate_build_quant)
                    for t, path in zip(shard, shard_paths)
                ]
                for name in (*_COLUMN, *_ROW)
                if f"{src}.{name}.weight" in shard[0]
            }
            for name in ("attention.qkv", "attention.dense", "mlp.fc", "mlp.proj"):
                if name not in parts:
                    raise CheckpointError(
                        f"{where}: tensor '{src}.{name}.weight' is missing. Run `specbuild convert --force`."
                    )
            if kv_algo:
                for t, path in zip(shard, shard_paths):
                    _need(t, f"{src}.attention.kv_cache_scaling_factor", path)
            _merge_qkv(state, acts, dst, parts["attention.qkv"], heads, kv_heads, head_dim, tp)
            fc = parts["mlp.fc"]
            if "mlp.gate" not in parts:  # fused [up; gate] per rank
                half = fc[0][0].shape[0] // 2
                parts["mlp.gate"] = [(w[:half], b[:half] if b is not None else None, a) for w, b, a in fc]
                parts["mlp.fc"] = [(w[half:], b[half:] if b is not None else None, a) for w, b, a in fc]
            for name, hf in _HF_LINEAR.items():
                _merge_linear(state, acts, f"{dst}.{hf}", parts[name], row=name in _ROW)
        offset += count
    if family.norm_offset:  # the checkpoint stores Gemma's 1 + weight; transformers' form is the weight (exact in fp32)
        for name in state:
            if name.endswith("norm.weight") and ".self_attn." not in name:
                state[name] = state[name] - 1.0
    for name in state:
        state[name] = state[name].to(dtype)
    notes = []
    if algo in ("W8A16", "W4A16"):
        notes.append(
            "weight-only quantization simulated as trtllm-build applies it"
            if simulate_build_quant
            else "weight-only quantization NOT simulated: float weights as stored"
        )
    if kv_algo:
        notes.append(f"{kv_algo} KV-cache quantization is not simulated (its scales are present)")
    return LoadedCheckpoint(
        hf_config=hf_config_from_trtllm(config),
        state_dict=state,
        trtllm_config=config,
        activation_quant=acts,
        notes=notes,
    )


def _merge_linear(state: dict, acts: dict, name: str, parts: list, row: bool) -> None:
    import torch

    state[f"{name}.weight"] = torch.cat([w for w, _, _ in parts], dim=1 if row else 0)
    if parts[0][1] is not None:
        state[f"{name}.bias"] = parts[0][1] if row else torch.cat([b for _, b, _ in parts], dim=0)
    act = parts[0][2]
    if act is not None:
        if row and act.pre_quant_scale is not None:
            act = ActivationQuant(act.kind, act.scale, torch.cat([a.pre_quant_scale for _, _, a in parts]))
        acts[name] = act


def _merge_qkv(
    state: dict, acts: dict, dst: str, parts: list, heads: int, kv_heads: int, head_dim: int, tp: int
) -> None:

    q_rows = heads // tp * head_dim
    kv_rows = max(1, kv_heads // tp) * head_dim
    keep_kv = range(0, tp, max(1, tp // kv_heads))  # with kv_heads < tp the kv heads are replicated
    for proj, lo, hi, ranks in (
        ("q_proj", 0, q_rows, range(tp)),
        ("k_proj", q_rows, q_rows + kv_rows, keep_kv),
        ("v_proj", q_rows + kv_rows, q_rows + 2 * kv_rows, keep_kv),
    ):
        sliced = [(parts[r][0][lo:hi], None if parts[r][1] is None else parts[r][1][lo:hi], parts[r][2]) for r in ranks]
        _merge_linear(state, acts, f"{dst}.self_attn.{proj}", sliced, row=False)
    if parts[0][0].shape[0] != q_rows + 2 * kv_rows:
        raise CheckpointError(
            f"{dst}: fused qkv has {parts[0][0].shape[0]} rows per rank, expected {q_rows + 2 * kv_rows} "
            f"({heads} heads, {kv_heads} kv heads, head size {head_dim}, tp {tp})."
        )


def hf_config_from_trtllm(config: dict[str, Any]) -> dict[str, Any]:
    """The transformers config's keyword arguments describing the checkpoint's model (its family's config class)."""
    hidden, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
    scaling = dict(config["rotary_scaling"]) if isinstance(config.get("rotary_scaling"), dict) else None
    if scaling is not None and "type" in scaling:
        scaling.setdefault("rope_type", scaling["type"])  # transformers reads rope_type
    family = families.FAMILIES[config["architecture"]]
    return {
        "architectures": [family.architecture],
        "model_type": family.hf_model_type,
        "vocab_size": int(config["vocab_size"]),
        "hidden_size": hidden,
        "intermediate_size": int(config.get("intermediate_size") or 4 * hidden),
        "num_hidden_layers": int(config["num_hidden_layers"]),
        "num_attention_heads": heads,
        "num_key_value_heads": int(config.get("num_key_value_heads") or heads),
        "head_dim": int(config.get("head_size") or hidden // heads),
        "hidden_act": config["hidden_act"],
        "rms_norm_eps": float(config.get("norm_epsilon", 1e-5)),
        "max_position_embeddings": int(config.get("max_position_embeddings") or 2048),
        "rope_theta": float(config.get("rotary_base", 10000.0)),
        "rope_scaling": scaling,
        "tie_word_embeddings": bool(config.get("share_embedding_table", False)),
        "attention_bias": bool(config.get("bias", False)),
        "mlp_bias": bool(config.get("mlp_bias", config.get("has_mlp_bias", False))),
    }


def _fake_quant_input(act: ActivationQuant):

    def hook(module: Any, args: tuple) -> tuple:
        (x,) = args  # [batch, seq, in_features]
        if act.kind == "none":
            return None
        pqs = act.pre_quant_scale
        xs = x * pqs if pqs is not None else x
        if act.kind == "fp8":
            xs = fp8_round_trip(xs.float(), act.scale).to(x.dtype)
        else:
            xs = ((xs / act.scale).round().clamp(-128, 127) * act.scale).to(x.dtype)
        return (xs / pqs if pqs is not None else xs,)  # the weight has pqs folded in

    return hook


def to_hf_model(loaded: LoadedCheckpoint, simulate_activations: bool = True, device: Any = "cpu") -> Any:
    """The family's transformers model (e.g. `LlamaForCausalLM`) in eval mode holding the loaded weights (with
    input fake-quant hooks if asked)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    dtype = next(iter(loaded.state_dict.values())).dtype
    arguments = dict(loaded.hf_config)
    config = AutoConfig.for_model(arguments.pop("model_type"), **arguments)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    model = model.to_empty(device=device).to(dtype)
    missing, unexpected = model.load_state_dict(loaded.state_dict, strict=False)
    missing = [
        m for m in missing if "rotary_emb" not in m and not (m == "lm_head.weight" and config.tie_word_embeddings)
    ]  # tied: tie_weights below
    if missing or unexpected:
        raise CheckpointError(
            f"checkpoint does not fit {type(model).__name__}: missing {missing[:5]}, unexpected {unexpected[:5]}."
        )
    if config.tie_word_embeddings:
        model.tie_weights()
    _remake_buffers(model, config, device)
    if simulate_activations:
        for name, act in loaded.activation_quant.items():
            if act.kind != "none":
                pqs = None if act.pre_quant_scale is None else act.pre_quant_scale.to(device, dtype)
                hook = _fake_quant_input(ActivationQuant(act.kind, act.scale, pqs))
                model.get_submodule(name).register_forward_pre_hook(hook)
    return model.eval()


def _remake_buffers(model: Any, config: Any, device: Any) -> None:
    """The buffers a checkpoint does not hold were made on the meta device (empty): remake each from what it is
    computed from, and refuse a model with one this function does not know (its output would be garbage)."""
    import torch

    model.model.rotary_emb = type(model.model.rotary_emb)(config=config, device=device)
    for name, module in model.named_modules():
        for buffer in module._non_persistent_buffers_set:
            if buffer in ("inv_freq", "original_inv_freq") and module is model.model.rotary_emb:
                continue
            if buffer == "embed_scale" and hasattr(module, "scalar_embed_scale"):  # Gemma's sqrt(hidden_size)
                setattr(module, buffer, torch.tensor(module.scalar_embed_scale, device=device))
                continue
            raise CheckpointError(
                f"{type(model).__name__}: buffer {name}.{buffer} is not in the checkpoint and the "
                "loader cannot remake it; the family needs support in specbuild.convert.loader."
            )
