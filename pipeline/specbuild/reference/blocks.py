"""The fixed shapes batch invariance rests on: matmuls over row blocks, attention over key buckets.

Shared by the model (reference/model.py), which computes on them, and the probe (reference/exactness.py),
which checks on this machine that a row's result does not depend on its place or neighbours in them.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def run_blocks(
    fn: Callable[..., torch.Tensor], xs: list[torch.Tensor], block: int, wide: tuple[int, ...] = ()
) -> torch.Tensor:
    """fn applied to fixed-size row blocks of xs: each [rows, ...], rows a multiple of block.

    wide (multiples of block, largest first): long runs of rows (a prompt's prefill) go in calls of as many of the
    largest size as fit, then the next, the rest in blocks. Only sizes the probe found give every row the bits its
    block gives it (reference/exactness.py), so which rows share a call still never changes a row's result."""
    rows = xs[0].shape[0]
    if rows == block:
        return fn(*xs)
    parts, at = [], 0
    for size in (*wide, block):
        end = at + (rows - at) // size * size
        parts += [fn(*chunk) for chunk in zip(*(x[at:end].split(size) for x in xs))] if end > at else []
        at = end
    return torch.cat(parts) if len(parts) > 1 else parts[0]


KEY_BUCKET = 64  # attention reads keys in multiples of this (divides SequenceKV's capacity step)


def key_bucket_end(position: int) -> int:
    """How many keys a query at `position` attends over (the rest masked): fixed per position."""
    return (position // KEY_BUCKET + 1) * KEY_BUCKET
