"""TensorRT-LLM's word-list format for stop and bad words: [2, n] int32 per request.

Row 0 holds every word's token ids back to back; row 1 the cumulative end offset of each word,
padded with -1 (NVIDIA/TensorRT-LLM `triton_backend/all_models/inflight_batcher_llm/preprocessing/1/
model.py`, `_to_word_list_format`). An absent input is [b, 2, 0]; words that all encode to nothing give
[b, 2, 1] = [[0], [-1]]. numpy only; the tokenizer is anything with `encode(text, add_special_tokens=)`.
"""

from __future__ import annotations

import numpy as np

__all__ = ["from_sequences", "to_word_list", "word_sequences"]


def to_word_list(
    tokenizer, rows: list[list[str]] | None, batch: int = 1, extra: list[list[int]] | None = None
) -> np.ndarray:  # -> [b, 2, m]
    """Each row's words, tokenized without special tokens, in the [2, m] format (rows None: the input was absent);
    `extra`: token id sequences added to every row (words already tokenized)."""
    if rows is None and not extra:
        return np.empty((batch, 2, 0), dtype=np.int32)
    sequences = [
        [ids for ids in (tokenizer.encode(word, add_special_tokens=False) for word in words) if ids]
        for words in (rows if rows is not None else [[] for _ in range(batch)])
    ]
    return from_sequences([row + list(extra or []) for row in sequences])


def from_sequences(rows: list[list[list[int]]]) -> np.ndarray:  # -> [b, 2, m]
    """Each row's token id sequences in the [2, m] format."""
    flat_rows, offset_rows = [], []
    for sequences in rows:
        ids: list[int] = []
        offsets: list[int] = []
        for word_ids in sequences:
            ids.extend(word_ids)
            offsets.append(len(ids))
        flat_rows.append(ids)
        offset_rows.append(offsets)
    width = max(1, *(len(r) for r in flat_rows), *(len(r) for r in offset_rows))
    out = np.zeros((len(rows), 2, width), dtype=np.int32)
    out[:, 1, :] = -1
    for i, (ids, offsets) in enumerate(zip(flat_rows, offset_rows)):
        out[i, 0, : len(ids)] = ids
        out[i, 1, : len(offsets)] = offsets
    return out


def word_sequences(word_list: np.ndarray | None) -> list[list[int]]:
    """The token id sequences of one request's word list ([2, m], or [1, 2, m] with its batch dimension)."""
    if word_list is None or np.asarray(word_list).size == 0:  # [b, 2, 0]: no words
        return []
    array = np.asarray(word_list)
    array = array.reshape(-1, 2, array.shape[-1])[0]
    ids, offsets = array[0], array[1]
    sequences, start = [], 0
    for end in offsets:
        if end < 0:
            break
        if end > start:
            sequences.append([int(t) for t in ids[start:end]])
        start = int(end)
    return sequences
