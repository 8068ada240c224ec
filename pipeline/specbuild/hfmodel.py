"""Facts about a Hugging Face checkpoint folder, read without importing torch or transformers.

`read_model_info(path)` reads `config.json` (plain json) and the headers of the `*.safetensors`
files (an 8-byte length and a JSON header per file, so counting parameters costs no tensor I/O).
Pickle weights (`pytorch_model*.bin`, `*.pt`, `*.pth`) are refused unless `allow_pickle=True`:
loading them runs arbitrary code. `trust_remote_code` is never used anywhere in specbuild.

`SUPPORTED_ARCHITECTURES` maps the HF class name to the TensorRT-LLM / modelopt `model_type`, for the families
specbuild takes (`specbuild.families`, which says which path takes each).
"""

from __future__ import annotations

import dataclasses
import json
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specbuild.errors import CheckpointError
from specbuild.families import FAMILIES

SUPPORTED_ARCHITECTURES: dict[str, str] = {  # HF class name -> the TensorRT-LLM / modelopt model_type
    name: family.model_type for name, family in FAMILIES.items()
}

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt")
_SAFETENSORS_MAX_HEADER = 100 * 1024 * 1024  # the safetensors format's own limit

# Rope types whose `factor` is already folded into max_position_embeddings in the HF config;
# for the others ("linear", "dynamic", "yarn") trtllm-build deduces max_seq_len as positions x factor.
_FACTOR_INCLUDED_ROPE_TYPES = ("llama3", "longrope", "su", "default")


@dataclass(frozen=True)
class ModelInfo:
    path: Path | None  # the checkpoint folder (None for a config-only description, e.g. in tests)
    architecture: str  # HF class name, e.g. "LlamaForCausalLM"
    model_type: str  # HF model_type, e.g. "llama"
    vocab_size: int  # embedding rows (may exceed the tokenizer's size: padding)
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    max_position_embeddings: int | None
    tie_word_embeddings: bool
    rope_scaling: dict[str, Any] | None
    torch_dtype: str | None  # the dtype the checkpoint was saved in ("bfloat16", ...)
    num_params: int  # from the safetensors headers when present, else estimated from config.json
    num_params_source: str  # "safetensors" or "config"
    weight_files: tuple[str, ...] = ()  # file names relative to `path`
    has_safetensors: bool = False
    num_experts: int = 1  # mixture-of-experts models: experts per layer
    config: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)  # raw config.json

    @property
    def trtllm_model_type(self) -> str | None:
        return SUPPORTED_ARCHITECTURES.get(self.architecture)

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def position_limit(self) -> int | None:
        """The longest sequence the model's position encoding covers (what trtllm-build deduces)."""
        if self.max_position_embeddings is None:
            return None
        scaling = self.rope_scaling or {}
        rope_type = str(scaling.get("rope_type", scaling.get("type", "default")))
        factor = scaling.get("factor", 1.0)
        if rope_type in _FACTOR_INCLUDED_ROPE_TYPES or not isinstance(factor, (int, float)) or factor < 1:
            return self.max_position_embeddings
        return int(self.max_position_embeddings * factor)

    def summary(self) -> dict[str, Any]:
        """The JSON-friendly facts a report shows."""
        return {
            "path": str(self.path) if self.path else None,
            "architecture": self.architecture,
            "trtllm_model_type": self.trtllm_model_type,
            "vocab_size": self.vocab_size,
            "num_params": self.num_params,
            "num_layers": self.num_layers,
            "num_heads": self.num_heads,
            "num_kv_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "hidden_size": self.hidden_size,
            "max_position_embeddings": self.max_position_embeddings,
            "position_limit": self.position_limit,
            "torch_dtype": self.torch_dtype,
            "tie_word_embeddings": self.tie_word_embeddings,
            "weight_format": "safetensors" if self.has_safetensors else "pickle",
        }


def _int_field(config: Mapping[str, Any], where: str, *keys: str, default: int | None = None) -> int:
    for key in keys:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    if default is not None:
        return default
    raise CheckpointError(
        f"{where}: config.json has no positive integer {keys[0]!r}. "
        "Is this a Hugging Face causal-LM checkpoint? Re-save it with transformers' save_pretrained."
    )


def estimate_num_params(
    *,
    vocab_size: int,
    hidden_size: int,
    num_layers: int,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    intermediate_size: int,
    tie_word_embeddings: bool,
    attention_bias: bool = False,
    num_experts: int = 1,
) -> int:
    """Parameters of a Llama-style decoder (gated MLP, RMSNorm), as stored in the HF checkpoint."""
    q_out, kv_out = num_heads * head_dim, num_kv_heads * head_dim
    attention = hidden_size * (q_out + 2 * kv_out) + q_out * hidden_size
    if attention_bias:
        attention += q_out + 2 * kv_out
    mlp = 3 * hidden_size * intermediate_size * num_experts
    if num_experts > 1:
        mlp += hidden_size * num_experts  # router
    per_layer = attention + mlp + 2 * hidden_size  # + input and post-attention norms
    embeddings = vocab_size * hidden_size * (1 if tie_word_embeddings else 2)
    return num_layers * per_layer + embeddings + hidden_size  # + final norm


def info_from_config(config: Mapping[str, Any], path: Path | None = None, where: str = "config") -> ModelInfo:
    """A ModelInfo from a parsed HF config.json (weights not inspected: num_params is estimated)."""
    if not isinstance(config, Mapping):
        raise CheckpointError(f"{where}: config.json is not a JSON object. Re-save the model with save_pretrained.")
    if isinstance(config.get("text_config"), Mapping) and "hidden_size" not in config:
        raise CheckpointError(
            f"{where}: a multimodal checkpoint ({config.get('architectures')}); specbuild handles text-only "
            "causal LMs. Extract the language model and save it on its own."
        )
    architectures = config.get("architectures")
    if not isinstance(architectures, list) or not architectures or not isinstance(architectures[0], str):
        raise CheckpointError(
            f"{where}: config.json has no 'architectures' list, so the model class is unknown. "
            'Add e.g. "architectures": ["LlamaForCausalLM"] or re-save the model with save_pretrained.'
        )
    hidden = _int_field(config, where, "hidden_size", "n_embd", "d_model")
    layers = _int_field(config, where, "num_hidden_layers", "n_layer", "num_layers")
    heads = _int_field(config, where, "num_attention_heads", "n_head")
    kv_heads = _int_field(config, where, "num_key_value_heads", default=heads)
    head_dim = _int_field(config, where, "head_dim", default=hidden // heads)
    vocab = _int_field(config, where, "vocab_size")
    intermediate = _int_field(config, where, "intermediate_size", "n_inner", default=4 * hidden)
    experts = _int_field(config, where, "num_local_experts", "num_experts", default=1)
    max_pos = config.get("max_position_embeddings")
    max_pos = max_pos if isinstance(max_pos, int) and not isinstance(max_pos, bool) and max_pos > 0 else None
    rope = config.get("rope_scaling") or config.get("rope_parameters")
    rope = dict(rope) if isinstance(rope, Mapping) else None
    if rope is not None and rope.get("rope_type", rope.get("type")) in (None, "default") and "factor" not in rope:
        rope = None  # transformers 5 writes rope_parameters even without scaling
    tie = bool(config.get("tie_word_embeddings", False))
    dtype = config.get("torch_dtype", config.get("dtype"))
    model_type = str(config.get("model_type", ""))
    num_params = estimate_num_params(
        vocab_size=vocab,
        hidden_size=hidden,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=intermediate,
        tie_word_embeddings=tie,
        attention_bias=bool(config.get("attention_bias", model_type == "qwen2")),
        num_experts=experts,
    )
    return ModelInfo(
        path=path,
        architecture=architectures[0],
        model_type=model_type,
        vocab_size=vocab,
        hidden_size=hidden,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=intermediate,
        max_position_embeddings=max_pos,
        tie_word_embeddings=tie,
        rope_scaling=rope,
        torch_dtype=str(dtype) if dtype else None,
        num_params=num_params,
        num_params_source="config",
        num_experts=experts,
        config=dict(config),
    )


def safetensors_header(path: Path) -> dict[str, Any]:
    """The JSON header of one .safetensors file: {tensor name: {"dtype", "shape", "data_offsets"}}."""
    try:
        with open(path, "rb") as f:
            raw_len = f.read(8)
            if len(raw_len) != 8:
                raise CheckpointError(f"{path}: truncated safetensors file (no header). Download or save it again.")
            (length,) = struct.unpack("<Q", raw_len)
            if length > _SAFETENSORS_MAX_HEADER:
                raise CheckpointError(f"{path}: not a safetensors file (header length {length}). Save it again.")
            blob = f.read(length)
    except OSError as err:
        raise CheckpointError(f"{path}: cannot be read ({err.strerror}). Check its permissions.") from None
    try:
        header = json.loads(blob)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise CheckpointError(f"{path}: corrupt safetensors header. Download or save the checkpoint again.") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: corrupt safetensors header. Download or save the checkpoint again.")
    header.pop("__metadata__", None)
    return header


def count_safetensors_params(files: list[Path]) -> int:
    total = 0
    for path in files:
        for name, entry in safetensors_header(path).items():
            shape = entry.get("shape") if isinstance(entry, dict) else None
            if not isinstance(shape, list):
                raise CheckpointError(f"{path}: tensor {name!r} has no shape in the header. Save the checkpoint again.")
            count = 1
            for dim in shape:
                count *= int(dim)
            total += count
    return total


def _weight_files(folder: Path) -> tuple[list[Path], list[Path]]:
    safetensors = sorted(p for p in folder.glob("*.safetensors") if p.is_file())
    index = folder / "model.safetensors.index.json"
    if index.is_file():  # sharded: count only the shards the index names (Mistral folders also hold consolidated.*)
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map", {})
        except (UnicodeDecodeError, json.JSONDecodeError, AttributeError):
            raise CheckpointError(f"{index} is not a valid safetensors index. Download it again.") from None
        named = {str(name) for name in weight_map.values()} if isinstance(weight_map, dict) else set()
        missing = sorted(n for n in named if not (folder / n).is_file())
        if missing:
            raise CheckpointError(
                f"{folder}: {len(missing)} weight shard(s) named in {index.name} are missing (e.g. {missing[0]}). "
                "The download is incomplete: download the missing files."
            )
        safetensors = sorted(folder / n for n in named)
    pickles = sorted(
        p for p in folder.iterdir() if p.is_file() and p.suffix in PICKLE_SUFFIXES and p.name != "training_args.bin"
    )
    return safetensors, pickles


def read_model_info(path: str | Path, allow_pickle: bool = False, role: str = "model") -> ModelInfo:
    """Read a Hugging Face checkpoint folder's facts; raises CheckpointError with the fix on bad input."""
    folder = Path(path)
    where = f"{role} checkpoint {str(folder)!r}"
    if not folder.exists():
        raise CheckpointError(
            f"{where} does not exist. Fix {role}.checkpoint in the spec, or download the model there."
        )
    if not folder.is_dir():
        raise CheckpointError(f"{where} is not a folder. Point {role}.checkpoint at the Hugging Face model folder.")
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise CheckpointError(
            f"{where} has no config.json: not a Hugging Face model folder. "
            "Point it at the folder that holds config.json and the weights."
        )
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except OSError as err:
        raise CheckpointError(f"{config_path} cannot be read ({err.strerror}). Check its permissions.") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckpointError(f"{config_path} is not valid JSON ({err}). Download or save the model again.") from None
    info = info_from_config(config, path=folder.resolve(), where=where)
    try:
        safetensors, pickles = _weight_files(folder)
    except OSError as err:
        raise CheckpointError(f"{where} cannot be listed ({err.strerror}). Check its permissions.") from None
    if safetensors:
        num_params = count_safetensors_params(safetensors)
        return _replace(info, safetensors, num_params, "safetensors", True)
    if pickles:
        if not allow_pickle:
            names = ", ".join(p.name for p in pickles[:3])
            raise CheckpointError(
                f"{where} has only pickle weights ({names}); loading pickles can run arbitrary code. "
                "Convert it to safetensors (transformers: model.save_pretrained(dir, safe_serialization=True)), "
                "or pass --allow-pickle if you trust the file."
            )
        return _replace(info, pickles, info.num_params, "config", False)
    raise CheckpointError(
        f"{where} has no weights (*.safetensors). Download the weight files into it, "
        "or point the spec at the complete model folder."
    )


def _replace(info: ModelInfo, files: list[Path], num_params: int, source: str, safetensors: bool) -> ModelInfo:
    return dataclasses.replace(
        info,
        weight_files=tuple(p.name for p in files),
        num_params=num_params,
        num_params_source=source,
        has_safetensors=safetensors,
    )


def listed_end_ids(folder: str | Path) -> list[int]:
    """The end-of-sequence ids a checkpoint lists (a reference engine copies its generation_config.json):
    generation_config.json's eos_token_id, one id or a list (Llama 3.x instruct models list three, their tokenizer's
    eos among them), else config.json's; [] when neither says. The one reader of them, for every path."""
    for name in ("generation_config.json", "config.json"):
        try:
            value = json.loads((Path(folder) / name).read_text()).get("eos_token_id")
        except (OSError, ValueError, AttributeError):
            continue
        ids = [
            v
            for v in (value if isinstance(value, list) else [value])
            if isinstance(v, int) and not isinstance(v, bool) and v >= 0
        ]
        if ids:
            return list(dict.fromkeys(ids))
    return []


def checkpoint_vocab_size(folder: str | Path) -> int | None:
    """config.json's vocab_size in `folder` (a checkpoint, or a reference engine, which copies it; a multimodal
    config's text_config), the model's rows: None where it does not say."""
    try:
        config = json.loads((Path(folder) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    for where in (config, config.get("text_config") if isinstance(config, dict) else None):
        value = where.get("vocab_size") if isinstance(where, dict) else None
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def end_ids(first: int | None, others: Iterable[int | None]) -> tuple[int, ...]:
    """Every id that ends a generation, each once: `first` (the one sent to the models as end_id), then the others
    (the tokenizer's eos, the checkpoint's listed ones)."""
    return tuple(dict.fromkeys(i for i in (first, *others) if i is not None))
