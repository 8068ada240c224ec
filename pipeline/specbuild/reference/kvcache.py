"""KV caches: one per sequence with rollback, and a bounded LRU prefix cache of them.

A `SequenceKV` holds the keys and values of `tokens` (positions 0..length-1) for every layer.
Rejected draft positions are rolled back with `truncate`: only `length` moves, the stale rows
beyond it are never read (attention reads positions <= the query's own) and are overwritten next.

The `PrefixCache` serves stateless callers (the Triton BLS sends the whole sequence on every call,
as TensorRT-LLM's KV-cache reuse expects): a call whose tokens extend, or share a prefix with, an
earlier call's tokens takes that cache, rolls it back to the common prefix and computes only the
rest. Entries are moved out while in use and put back after the call; the least recently used are
dropped when the cached K/V bytes exceed the budget.

Moving is right for the entry's own sequence, whose next call can only diverge from it after its
`settled` prefix (the part its last call took as given: the prompt so far, not the draft tokens in
question). A call diverging earlier is another request sharing a preamble (a system prompt, a JSON
header) and gets a copy of the shared part instead: taking the entry would make its owner, still in
flight, recompute its sequence on its next call, and with more sequences in flight than a batch
holds that stealing cascades until nearly every call misses.
"""

from __future__ import annotations

from collections import OrderedDict

import torch

_GROW = 256  # capacity grows in steps of this many positions


class SequenceKV:
    def __init__(self, num_layers: int, kv_heads: int, head_dim: int, device: torch.device, dtype: torch.dtype):
        self.shape = (kv_heads, head_dim)
        self.device, self.dtype = device, dtype
        self.tokens: list[int] = []  # [length] the tokens whose keys/values are stored
        self.settled = 0  # positions its last caller took as given; its own next call diverges at or after them
        self.k: list[torch.Tensor] = [self._empty(0) for _ in range(num_layers)]  # each [capacity, kv_heads, head_dim]
        self.v: list[torch.Tensor] = [self._empty(0) for _ in range(num_layers)]

    def _empty(self, capacity: int) -> torch.Tensor:
        return torch.zeros(capacity, *self.shape, device=self.device, dtype=self.dtype)

    @property
    def length(self) -> int:
        return len(self.tokens)

    @property
    def capacity(self) -> int:
        return self.k[0].shape[0] if self.k else 0

    @property
    def nbytes(self) -> int:
        """Bytes held by the K/V tensors (arithmetic, not a walk over them: the prefix cache asks on every put)."""
        kv_heads, head_dim = self.shape
        return 2 * len(self.k) * self.capacity * kv_heads * head_dim * self.dtype.itemsize

    def reserve(self, n: int) -> None:
        """Make room for n positions (keeps the stored ones)."""
        if n <= self.capacity:
            return
        capacity = -(-n // _GROW) * _GROW
        for cache in (self.k, self.v):
            for i, old in enumerate(cache):
                new = self._empty(capacity)
                new[: self.length] = old[: self.length]
                cache[i] = new

    def copy_prefix(self, n: int) -> SequenceKV:
        """A new cache holding this one's first n positions (this one unchanged)."""
        copy = SequenceKV(len(self.k), *self.shape, device=self.device, dtype=self.dtype)
        copy.reserve(n)
        for src, dst in ((self.k, copy.k), (self.v, copy.v)):
            for old, new in zip(src, dst):
                new[:n] = old[:n]
        copy.tokens = self.tokens[:n]
        return copy

    def commit(self, tokens: list[int]) -> None:
        """Record that the keys/values of `tokens` were written after the current length."""
        self.tokens.extend(tokens)

    def truncate(self, n: int) -> None:
        """Roll back to the first n positions (rejected draft tokens, or a diverging prefix)."""
        del self.tokens[n:]


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo] and a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


class PrefixCache:
    def __init__(self, max_bytes: int, max_entries: int = 64):
        self.max_bytes = max_bytes  # budget: K/V bytes held over all entries
        self.max_entries = max_entries  # bounds the lookup's linear scan; about the sequences in flight
        self.entries: OrderedDict[int, SequenceKV] = OrderedDict()  # id -> cache, least recently used first
        self.hits = 0  # calls that reused at least one position
        self.reused_tokens = 0  # positions not recomputed thanks to the cache
        self.copies = 0  # hits served with a copy of a shared prefix (the entry stayed for its owner)

    def take(self, tokens: list[int]) -> tuple[SequenceKV | None, int]:
        """The entry sharing the longest prefix with tokens, and that prefix's length.

        The entry itself (removed from the cache) when the tokens diverge from it at or after its
        settled prefix (its own sequence, rolling back rejected draft tokens); otherwise a copy of the
        shared prefix, leaving the entry for the sequence that owns it.
        """
        best, best_len, head = None, 0, tokens[:1]
        for key in reversed(self.entries):  # most recent first: a sequence's own entry is found early
            entry = self.entries[key]
            if entry.length <= best_len or entry.tokens[: best_len + 1] != head:
                continue  # cannot share more than best_len: one comparison instead of a search
            best, best_len = key, common_prefix(entry.tokens, tokens)
            if best_len == len(tokens):
                break
            head = tokens[: best_len + 1]
        if best is None:
            return None, 0
        self.hits += 1
        self.reused_tokens += best_len
        entry = self.entries[best]
        if best_len < entry.settled:
            self.copies += 1
            self.entries.move_to_end(best)
            return entry.copy_prefix(best_len), best_len
        return self.entries.pop(best), best_len

    def put(self, entry: SequenceKV) -> None:
        if entry.length == 0 or entry.nbytes > self.max_bytes:
            return
        self.entries[id(entry)] = entry
        total = sum(e.nbytes for e in self.entries.values())
        while total > self.max_bytes or len(self.entries) > self.max_entries:
            _, dropped = self.entries.popitem(last=False)
            total -= dropped.nbytes

    def clear(self) -> None:
        self.entries.clear()
