"""Helpers for the build tests: a spec in tmp_path and hand-written TensorRT-LLM checkpoint folders.

The checkpoints here are only config.json + manifest.json + a tiny rank0.safetensors placeholder:
enough for planning and for the fake trtllm-build, never for a real build.
"""

from __future__ import annotations

import json
from pathlib import Path

from specbuild.config import Spec, spec_from_dict

FAKE_TRTLLM_BUILD = Path(__file__).resolve().parent / "trtllm-build"


def make_spec(tmp_path: Path, **sections) -> Spec:
    raw = {
        "name": "pair",
        "output_dir": str(tmp_path / "engines"),
        "target": {"checkpoint": str(tmp_path / "hf-target")},
        "draft": {"checkpoint": str(tmp_path / "hf-draft")},
        "speculative": {"max_draft_len": 4, "num_draft_tokens": 4},
        "build": {"max_batch_size": 4, "max_input_len": 1024, "max_seq_len": 2048, "max_num_tokens": 8192},
    }
    for name, values in sections.items():
        raw[name] = {**raw.get(name, {}), **values}
    return spec_from_dict(raw, base_dir=tmp_path)


def fake_checkpoint(
    spec: Spec,
    role: str,
    quant_algo=None,
    kv_cache_quant_algo=None,
    world_size: int = 1,
    pair: str | None = None,
    manifest: bool = True,
    input_hash: str = "ckpt-hash-1",
) -> Path:
    folder = spec.pair_dir / role / "checkpoint"
    folder.mkdir(parents=True, exist_ok=True)
    config = {
        "architecture": "LlamaForCausalLM",
        "dtype": "float16",
        "vocab_size": 512,
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "hidden_act": "silu",
        "max_position_embeddings": 4096,
        "mapping": {"world_size": world_size, "tp_size": world_size, "pp_size": 1},
        "quantization": {"quant_algo": quant_algo, "kv_cache_quant_algo": kv_cache_quant_algo},
    }
    (folder / "config.json").write_text(json.dumps(config))
    for rank in range(world_size):
        (folder / f"rank{rank}.safetensors").write_bytes(b"placeholder %d" % rank)
    if manifest:
        (folder / "manifest.json").write_text(
            json.dumps(
                {
                    "stage": "convert",
                    "role": role,
                    "pair": pair or spec.name,
                    "input_hash": input_hash,
                    "quant_algo": quant_algo,
                    "kv_cache_quant_algo": kv_cache_quant_algo,
                    "mapping": config["mapping"],
                    "vocab_size": 512,
                    "tool_versions": {},
                }
            )
        )
    return folder
