"""Tiny Hugging Face Llama checkpoints (random weights, a small trained BPE tokenizer) and spec files for convert tests."""

from __future__ import annotations

from pathlib import Path

FALLBACK_TEXT = [
    "The quick brown fox jumps over the lazy dog while the cat sleeps on the warm mat.",
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))\n",
    '{"id": 1, "name": "Ada", "city": "London", "active": true, "tags": ["math", "code"]}',
    "Speculative decoding drafts tokens with a small model and verifies them with a large one.",
]


# A chat template in the style of Llama 3's: it writes the BOS token itself
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} </s> {% endfor %}"
    "{% if add_generation_prompt %}<|assistant|> {% endif %}"
)


def make_tokenizer(folder: Path, vocab_size: int, chat_template: str | None = None, adds_bos: bool = False) -> None:
    """A BPE tokenizer trained on a few lines (<unk> 0, <s> 1, </s> 2); adds_bos: it prepends <s> when encoding,
    as Llama's do."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    special = ["<unk>", "<s>", "</s>"] + (["<|system|>", "<|user|>", "<|assistant|>"] if chat_template else [])
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=special)
    tok.train_from_iterator(FALLBACK_TEXT * 4, trainer=trainer)
    if adds_bos:
        tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    if chat_template:
        fast.chat_template = chat_template
    fast.save_pretrained(folder)


def make_llama(
    folder: Path,
    vocab_size: int = 256,
    hidden: int = 64,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    intermediate: int = 128,
    seed: int = 0,
    tokenizer: bool = True,
    architecture: str = "LlamaForCausalLM",
    std: float = 0.15,
) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        intermediate_size=intermediate,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        rope_theta=50000.0,
    )
    model = LlamaForCausalLM(config)
    with torch.no_grad():  # larger weights than the 0.02 init, so logits have real margins
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, std)
    model.save_pretrained(folder, safe_serialization=True)
    if architecture != "LlamaForCausalLM":
        import json

        cfg = json.loads((folder / "config.json").read_text())
        cfg["architectures"] = [architecture]
        (folder / "config.json").write_text(json.dumps(cfg))
    if tokenizer:
        make_tokenizer(folder, vocab_size)
    return folder


def write_spec(
    path: Path,
    target: Path,
    draft: Path,
    output_dir: Path,
    target_q: str = "none",
    draft_q: str = "none",
    extra: str = "",
    kv_cache: str = "none",
) -> Path:
    path.write_text(
        f'name = "pair"\noutput_dir = "{output_dir}"\n'
        f'[target]\ncheckpoint = "{target}"\nquantization = "{target_q}"\nkv_cache = "{kv_cache}"\n'
        f'[draft]\ncheckpoint = "{draft}"\nquantization = "{draft_q}"\nkv_cache = "{kv_cache}"\n{extra}'
    )
    return path
