"""A byte-level BPE tokenizer trained on the example corpus, saved as a Hugging Face fast tokenizer.

Special tokens follow the Llama layout: <unk> = 0, <s> = 1 (prepended by the post-processor),
</s> = 2, <pad> = 3. Byte-level BPE never produces <unk>; it is there because tools expect it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

SPECIAL_TOKENS = ("<unk>", "<s>", "</s>", "<pad>")
UNK_ID, BOS_ID, EOS_ID, PAD_ID = range(4)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def train_tokenizer(texts: Iterable[str], vocab_size: int):
    """Train a byte-level BPE `tokenizers.Tokenizer` (deterministic for a given text order)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", BOS_ID)]
    )
    for token, expected in zip(SPECIAL_TOKENS, range(4)):
        if tok.token_to_id(token) != expected:
            raise RuntimeError(f"special token {token} got id {tok.token_to_id(token)}, expected {expected}")
    return tok


def save_hf_tokenizer(tok, folder: Path, model_max_length: int) -> None:
    """Write tokenizer.json, tokenizer_config.json and special_tokens_map.json into `folder`."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    specials = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}
    added = {
        str(i): {
            "content": t,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for i, t in enumerate(SPECIAL_TOKENS)
    }
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": added,
        "add_bos_token": True,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": model_max_length,
        "padding_side": "left",
        **specials,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    (folder / "special_tokens_map.json").write_text(json.dumps(specials, indent=2, sort_keys=True) + "\n")
