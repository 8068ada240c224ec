"""The fixed shapes batch invariance rests on: matmuls over row blocks, attention over key buckets.

Shared by the model (runtime/model.py), which computes on them, and the probe (runtime/exactness.py),
which checks on this machine that a row's result does not depend on its place or neighbours in them.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def run_blocks(fn: Callable[..., torch.Tensor], xs: list[torch.Tensor], block: int) -> torch.Tensor:
    """fn applied to fixed-size row blocks of xs: each [rows, ...], rows a multiple of block."""
    if xs[0].shape[0] == block:
        return fn(*xs)
    return torch.cat([fn(*blocks) for blocks in zip(*(x.split(block) for x in xs))])


KEY_BUCKET = 64  # attention reads keys in multiples of this (divides SequenceKV's capacity step)


def key_bucket_end(position: int) -> int:
    """How many keys a query at `position` attends over (the rest masked): fixed per position."""
    return (position // KEY_BUCKET + 1) * KEY_BUCKET
