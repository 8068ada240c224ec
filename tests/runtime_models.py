"""Tiny random Llama checkpoints for the reference-runtime tests (made in-test, saved as safetensors)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch


def make_llama(
    folder: Path,
    seed: int = 0,
    vocab: int = 97,
    hidden: int = 32,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    intermediate: int = 64,
    tie: bool = False,
    rope_scaling: dict | None = None,
    init_std: float = 0.2,
    **config_extra,
):
    """Save a random LlamaForCausalLM to folder; return it (eval mode, float32).

    init_std is larger than transformers' default 0.02 so greedy outputs vary from token to
    token instead of repeating one token (a degenerate test would prove little).
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=512,
        tie_word_embeddings=tie,
        rope_scaling=rope_scaling,
        initializer_range=init_std,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        **config_extra,
    )
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(".bias"):  # transformers zeroes biases; random ones prove they are used
                param.normal_(0.0, init_std)
    model.save_pretrained(folder)
    return model


def prompts(n: int, vocab: int, seed: int = 0, min_len: int = 3, max_len: int = 12) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(min_len, max_len + 1, (n,), generator=g)
    return [
        torch.randint(
            3,
            vocab,
            (
                int(
                    n_,
                ),
            ),
            generator=g,
        ).tolist()
        for n_ in lengths
    ]


@pytest.fixture(autouse=True, scope="module")
def single_thread():
    """One torch thread: the CI machine has 2 cores shared with other tests; spinning OpenMP threads hurt."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
