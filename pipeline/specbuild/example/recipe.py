"""The recipe of the built-in example pair: model shapes, tokenizer size, training schedule, seeds.

The cache key of a built pair is a hash of its recipe plus `RECIPE_VERSION` and the corpus
fingerprint, so changing any number here (or the code's version constant) rebuilds the pair.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from specbuild.artifacts import combined_hash

RECIPE_VERSION = 5  # bump when the training code changes in a way that changes the weights


@dataclass(frozen=True)
class ModelShape:
    num_hidden_layers: int
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int  # < num_attention_heads: grouped-query attention, like real pairs
    intermediate_size: int
    max_position_embeddings: int = 2048

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


@dataclass(frozen=True)
class Recipe:
    variant: str
    vocab_size: int  # BPE vocabulary, specials included; both models use exactly this many rows
    target: ModelShape
    draft: ModelShape
    seq_len: int  # training context in tokens
    batch_size: int  # sequences per optimizer step
    target_steps: int  # target training steps (the draft trains alongside, distilling from it)
    distill_steps: int  # extra draft-only steps against the finished target
    target_lr: float
    draft_lr: float
    warmup_steps: int
    embed_lr_mult: float  # embeddings and lm_head learn this many times faster (leaves the unigram plateau early)
    distill_weight: float  # draft loss = w * KL(target || draft) + (1 - w) * next-token cross-entropy
    json_records: int  # generated JSON records in the training corpus
    code_files: int  # training stdlib files used (first N of the sorted list); 0 = all
    eval_prompts: dict[str, int]  # held-out prompts per kind for the agreement measurement
    eval_new_tokens: int  # target greedy tokens per prompt, compared position by position
    seed: int = 0
    torch_threads: int = 1  # fixed, so the weights do not depend on the machine's core count (and
    # one thread is much faster than two when other work shares a 2-core machine)
    storage_dtype: str = "float16"  # trained in float32, then rounded to this (and measured so), so the
    # committed copy stores half the bytes and unpacks to exactly the weights that were measured

    def key(self, corpus_fingerprint: str) -> str:
        """A short hash of everything that determines the pair's weights."""
        return combined_hash(RECIPE_VERSION, dataclasses.asdict(self), corpus_fingerprint)[:12]


VARIANTS: dict[str, Recipe] = {
    # The demo pair. Committed, trained (package data, see example/packaged.py): about 20 minutes on
    # one CPU core to rebuild. Target/draft decode cost ratio c is about 0.2 on CPU.
    "full": Recipe(
        variant="full",
        vocab_size=2048,
        target=ModelShape(
            num_hidden_layers=8, hidden_size=192, num_attention_heads=6, num_key_value_heads=2, intermediate_size=512
        ),
        draft=ModelShape(
            num_hidden_layers=1, hidden_size=128, num_attention_heads=4, num_key_value_heads=2, intermediate_size=352
        ),
        seq_len=256,
        batch_size=8,
        target_steps=1600,
        distill_steps=160,
        target_lr=1.5e-3,
        draft_lr=4e-3,
        warmup_steps=20,
        embed_lr_mult=10.0,
        distill_weight=0.9,
        json_records=3000,
        code_files=0,
        eval_prompts={"code": 8, "prose": 4, "json": 4},
        eval_new_tokens=32,
    ),
    # For tests: seconds, not minutes. Still a real, trained pair; its agreement is reported, not promised.
    "tiny": Recipe(
        variant="tiny",
        vocab_size=768,
        target=ModelShape(
            num_hidden_layers=4, hidden_size=128, num_attention_heads=4, num_key_value_heads=2, intermediate_size=352
        ),
        draft=ModelShape(
            num_hidden_layers=1, hidden_size=64, num_attention_heads=2, num_key_value_heads=1, intermediate_size=176
        ),
        seq_len=128,
        batch_size=8,
        target_steps=100,
        distill_steps=20,
        target_lr=3e-3,
        draft_lr=4e-3,
        warmup_steps=5,
        embed_lr_mult=10.0,
        distill_weight=0.9,
        json_records=400,
        code_files=24,
        eval_prompts={"code": 2, "prose": 1, "json": 1},
        eval_new_tokens=16,
    ),
}
