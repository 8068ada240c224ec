"""Tiny Hugging Face checkpoint folders for the check tests, written without torch.

Weights are zero float16 tensors with Llama tensor names and shapes (safetensors.numpy), the
tokenizer a `tokenizers` WordLevel vocabulary; both are read by specbuild exactly like real ones.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

SPECIALS = {"unk": "<unk>", "bos": "<s>", "eos": "</s>"}


def words(n: int) -> list[str]:
    """n distinct tokens: the three specials, then w3, w4, ..."""
    return [SPECIALS["unk"], SPECIALS["bos"], SPECIALS["eos"]] + [f"w{i}" for i in range(3, n)]


def write_tokenizer(folder: Path, tokens: list[str], added: list[str] = (), eos: str = "</s>") -> None:
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

    folder.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.WordLevel({t: i for i, t in enumerate(tokens)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens([AddedToken(t, special=True) for t in (*SPECIALS.values(), *added)])
    tok.save(str(folder / "tokenizer.json"))
    config = {"bos_token": "<s>", "eos_token": eos, "unk_token": "<unk>", "tokenizer_class": "PreTrainedTokenizerFast"}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))


def llama_config(vocab_rows: int, **overrides) -> dict:
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab_rows,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 4096,
        "tie_word_embeddings": False,
        "torch_dtype": "float16",
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    config.update(overrides)
    return config


def llama_tensors(config: dict) -> dict[str, np.ndarray]:
    h, i, v = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    head_dim = h // config["num_attention_heads"]
    kv = config["num_key_value_heads"] * head_dim
    shapes = {"model.embed_tokens.weight": (v, h), "model.norm.weight": (h,)}
    if not config.get("tie_word_embeddings"):
        shapes["lm_head.weight"] = (v, h)
    for layer in range(config["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        shapes.update(
            {
                p + "self_attn.q_proj.weight": (h, h),
                p + "self_attn.k_proj.weight": (kv, h),
                p + "self_attn.v_proj.weight": (kv, h),
                p + "self_attn.o_proj.weight": (h, h),
                p + "mlp.gate_proj.weight": (i, h),
                p + "mlp.up_proj.weight": (i, h),
                p + "mlp.down_proj.weight": (h, i),
                p + "input_layernorm.weight": (h,),
                p + "post_attention_layernorm.weight": (h,),
            }
        )
    return {name: np.zeros(shape, dtype=np.float16) for name, shape in shapes.items()}


def write_checkpoint(
    folder: Path, vocab_rows: int, tokens: list[str] | None = None, weights: str = "safetensors", **config_overrides
) -> Path:
    """A model folder: config.json, weights ("safetensors", "pickle" or "none") and a tokenizer."""
    from safetensors.numpy import save_file

    folder.mkdir(parents=True, exist_ok=True)
    config = llama_config(vocab_rows, **config_overrides)
    (folder / "config.json").write_text(json.dumps(config))
    if weights == "safetensors":
        save_file(llama_tensors(config), str(folder / "model.safetensors"))
    elif weights == "pickle":
        (folder / "pytorch_model.bin").write_bytes(b"\x80\x04not really a pickle")
    write_tokenizer(folder, tokens if tokens is not None else words(vocab_rows))
    return folder


def write_spec(path: Path, target: Path, draft: Path, extra: str = "", gpu: str = 'name = "H100-80GB"') -> Path:
    path.write_text(
        f'name = "tiny"\n'
        f'[target]\ncheckpoint = "{target}"\n'
        f'[draft]\ncheckpoint = "{draft}"\n'
        f"[build]\nmax_batch_size = 2\nmax_input_len = 128\nmax_seq_len = 256\nmax_num_tokens = 512\n"
        f"[gpu]\n{gpu}\n{extra}"
    )
    return path


def make_pair(
    root: Path, target_rows: int = 1000, draft_rows: int = 1000, draft_tokens: list[str] | None = None, **spec_kwargs
) -> Path:
    """A target/draft pair under `root` and its spec file; returns the spec path."""
    target = write_checkpoint(root / "target", target_rows, tokens=words(1000))
    draft_tokens = draft_tokens if draft_tokens is not None else words(1000)
    draft = write_checkpoint(root / "draft", draft_rows, tokens=draft_tokens)
    return write_spec(root / "specbuild.toml", target, draft, **spec_kwargs)
