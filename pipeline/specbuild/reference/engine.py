"""The reference engine: a LlamaModel plus KV caches, scoring and decoding several sequences at once.

Two operations, both stateless from the caller's side (whole token lists in, like Triton calls):
- `logits(sequences, last)`: the logits after each of the last `last[i]` tokens of sequence i
  (verification: prefix + k draft tokens -> k + 1 rows), all sequences in one batched forward;
- `decode(sequences, max_new, pickers, end_ids)`: generate tokens for every sequence, one batched
  forward per step (drafting, or plain target decoding).

With `use_cache=True` each call starts from the prefix cache (longest shared prefix, rolled back
to it) and puts its caches back afterwards; with `use_cache=False` every forward recomputes every
position from scratch. Both give bit-identical logits (see model.py, batch invariance).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from specbuild.reference.kvcache import PrefixCache, SequenceKV
from specbuild.reference.model import LlamaModel

DEFAULT_PREFIX_CACHE_BYTES = 1 << 30  # K/V bytes the prefix cache may hold, over all sequences


@dataclass
class Decoded:
    tokens: list[int]  # [n] generated tokens; ends with the end id when the sequence stopped on it
    logits: np.ndarray  # [n, vocab] float32, the logits each token was chosen from


class ReferenceEngine:
    def __init__(self, model: LlamaModel, use_cache: bool = True, prefix_cache_bytes: int = DEFAULT_PREFIX_CACHE_BYTES):
        self.model = model
        self.use_cache = use_cache
        self.prefix_cache = PrefixCache(prefix_cache_bytes)
        self._lock = threading.Lock()  # the caches are shared; one call at a time per engine
        self.forward_calls = 0
        self.computed_rows = 0

    @property
    def vocab_size(self) -> int:
        return self.model.args.vocab_size

    def _acquire(self, tokens: list[int], keep_at_most: int, settled: int) -> SequenceKV:
        """A cache holding a prefix of tokens no longer than keep_at_most positions.

        settled: how many leading tokens this call takes as given (the rest are in question, e.g.
        draft tokens); the prefix cache lets this sequence's next call reuse the cache in place when
        it diverges only after them.
        """
        cache = None
        if self.use_cache:
            cache, shared = self.prefix_cache.take(tokens)
            if cache is not None:
                cache.truncate(min(shared, keep_at_most))
        if cache is None:
            cache = self.model.new_cache()
        cache.settled = settled
        return cache

    def _release(self, cache: SequenceKV) -> None:
        if self.use_cache:
            self.prefix_cache.put(cache)

    def _forward(self, caches: list[SequenceKV], sequences: list[list[int]], want: list[int]) -> list[np.ndarray]:
        if not self.use_cache:
            for cache in caches:
                cache.truncate(0)
        batch = [(cache, seq[cache.length :]) for cache, seq in zip(caches, sequences)]
        self.forward_calls += 1
        self.computed_rows += sum(len(new) for _, new in batch)
        return [t.numpy() for t in self.model.forward(batch, want)]

    def logits(self, sequences: list[list[int]], last: list[int]) -> list[np.ndarray]:
        """For each sequence, the float32 logits [last[i], vocab] after each of its last last[i] tokens."""
        with self._lock:
            caches = [self._acquire(seq, len(seq) - n, len(seq) - n + 1) for seq, n in zip(sequences, last)]
            try:
                return self._forward(caches, sequences, list(last))
            finally:
                for cache in caches:
                    self._release(cache)

    def decode(
        self,
        sequences: list[list[int]],
        max_new: list[int],
        pickers: list[Callable[[np.ndarray], int]],  # logits [vocab] -> token, one per sequence
        end_ids: list[int | None],
        stops: list[list[list[int]]] | None = None,  # per sequence: stop sequences, matched on generated tokens
    ) -> list[Decoded]:
        """Generate up to max_new[i] tokens after sequence i, stopping early at end_ids[i] or once the generated
        tokens end with one of stops[i] (kept, as TensorRT-LLM keeps a stop word)."""
        with self._lock:
            seqs = [list(s) for s in sequences]
            caches = [self._acquire(seq, len(seq) - 1, len(seq)) for seq in seqs]
            out = [Decoded([], np.zeros((0, self.vocab_size), np.float32)) for _ in seqs]
            rows: list[list[np.ndarray]] = [[] for _ in seqs]
            active = [i for i, n in enumerate(max_new) if n > 0]
            try:
                while active:
                    logits = self._forward([caches[i] for i in active], [seqs[i] for i in active], [1] * len(active))
                    still = []
                    for i, row in zip(active, logits):
                        token = int(pickers[i](row[0]))
                        rows[i].append(row[0])
                        out[i].tokens.append(token)
                        seqs[i].append(token)
                        done = out[i].tokens
                        stopped = stops is not None and any(
                            done[-len(w) :] == w for w in stops[i] if len(done) >= len(w)
                        )
                        if len(done) < max_new[i] and token != end_ids[i] and not stopped:
                            still.append(i)
                    active = still
            finally:
                for cache in caches:
                    self._release(cache)
            for decoded, r in zip(out, rows):
                if r:
                    decoded.logits = np.stack(r)
            return out
