"""Tiny random Hugging Face checkpoints of each family specbuild takes (specbuild.families), written by transformers
in the test, with a small trained tokenizer: no downloads."""

from __future__ import annotations

from pathlib import Path

from convert_helpers import CHAT_TEMPLATE, make_tokenizer

# family name -> (transformers config class, model class, what the family has that Llama does not)
SHAPES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {"sliding_window": 4096}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {"tie_word_embeddings": True}),  # qkv bias; tied, as 0.5B-1.5B are
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"tie_word_embeddings": True, "head_dim": 32}),  # q/k norm
    "gemma": ("GemmaConfig", "GemmaForCausalLM", {"head_dim": 32, "hidden_act": "gelu_pytorch_tanh"}),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {"pad_token_id": 0}),  # fused qkv and gate/up
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", {"head_dim": 32}),  # soft-capping, sandwich norms, sliding layers
}
# Gemma's tied, sqrt(hidden)-scaled embeddings make a small random model repeat its last input token; larger weights vary
STD = {"gemma": 0.3, "gemma2": 0.3}
EMBED_STD = {"gemma2": 0.02}  # its normalized attention and MLP outputs must not drown in the scaled embeddings
ENGINE_FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "gemma")  # modelopt writes TensorRT-LLM checkpoints of these
LLMAPI_FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "phi3")  # TensorRT-LLM 1.2.1's PyTorch backend registers these
LLMAPI_ONLY_FAMILIES = ("phi3",)  # modelopt exports no TensorRT-LLM checkpoint of it
PATHLESS_FAMILIES = ("gemma2",)  # neither: no TensorRT-LLM checkpoint, and 1.2.1 does not register it
REFERENCE_FAMILIES = ENGINE_FAMILIES + LLMAPI_ONLY_FAMILIES + PATHLESS_FAMILIES  # the reference runtime computes all
SERVED_FAMILIES = ENGINE_FAMILIES + LLMAPI_ONLY_FAMILIES  # those some path of 1.2.1 serves


def make_family(
    folder: Path,
    family: str,
    vocab_size: int = 256,
    hidden: int = 64,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    intermediate: int = 128,
    seed: int = 0,
    std: float | None = None,
    tokenizer: bool = True,
    chat: bool = False,
    tokenizer_vocab: int | None = None,
    **config_extra,
) -> Path:
    """Save a random `family` model to folder (every weight, biases and norms included, drawn larger than
    transformers' init so logits have real margins), with a trained BPE tokenizer of vocab_size tokens (chat: one that
    adds BOS and has a chat template writing BOS itself, as Llama 3's). tokenizer_vocab: a tokenizer smaller than the
    embedding (padded rows, as Qwen2.5 7B's 152064 rows hold a 151665-token tokenizer)."""
    import torch
    import transformers

    config_name, model_name, extra = SHAPES[family]
    std = STD.get(family, 0.15) if std is None else std
    torch.manual_seed(seed)
    config = getattr(transformers, config_name)(
        vocab_size=vocab_size,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        intermediate_size=intermediate,
        max_position_embeddings=256,
        bos_token_id=1,
        eos_token_id=2,
        **{**extra, **config_extra},
    )
    model = getattr(transformers, model_name)(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:
                p.normal_(0.0, std)
            elif name.endswith("norm.weight"):  # around 1 (Gemma's around 0: it scales by 1 + weight)
                p.copy_((0.0 if family.startswith("gemma") else 1.0) + torch.randn_like(p) * 0.1)
            else:  # biases
                p.normal_(0.0, std)
        if family in EMBED_STD:
            model.get_input_embeddings().weight.normal_(0.0, EMBED_STD[family])
    model.save_pretrained(folder, safe_serialization=True)
    if tokenizer:
        make_tokenizer(
            folder, tokenizer_vocab or vocab_size, chat_template=CHAT_TEMPLATE if chat else None, adds_bos=chat
        )
    return folder
