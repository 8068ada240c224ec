"""Drafting from text that is already there: prompt lookup, a pool across requests, and the hybrid.

Prompt lookup (n-gram drafting, as TensorRT-LLM's NGram drafter, `tensorrt_llm/_torch/speculative/ngram.py`, and its
engine-path example `examples/ngram/run_dtm_ngram.py`): the last n tokens of the context (prompt + output so far)
are searched for earlier in the context, n from `max_matching_ngram_size` down to 1, the longest first; the tokens
that followed the match, up to k, are the proposal. Of several matches, the oldest (`is_use_oldest`, NVIDIA's default)
or the newest (`is_keep_all` false keeps one match per n-gram, the newest). No match: no proposal, and the step is a plain target step, as it is with K = 0.

A proposal is deterministic: `Draft.probs` is None, which the acceptance rule reads as a one-hot q at the proposed
token (`acceptance.py`), so sampling stays exact and greedy output equals K = 0's.

The pool (`is_public_pool`): the sequences (prompt + output) of recent requests, bounded to `pool_max_tokens` tokens
in all: the oldest sequence goes first, and a sequence longer than the cap keeps its last `pool_max_tokens` tokens.
A step searches its own context first, then the pool, newest sequence first, at each n before the next shorter one,
so a longer match in the pool wins over a shorter one in the request.

The hybrid: per step, the lookup's proposal when it matched at least `hybrid_min_match` tokens and is expected to
give as many tokens per unit of time as the draft model's, by what the request has seen (`HybridDrafter`), else the
draft model's; on a lookup step the draft model is not called.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from specbuild import drafters
from specbuild.drafters import LookupSettings
from specbuild.speculative.adaptive import expected_tokens_per_step
from specbuild.speculative.interfaces import Draft, Drafter, SamplingParams

__all__ = ["HybridDrafter", "LookupDrafter", "LookupPool", "Match", "PoolIndex", "find_match", "make_drafter"]


@dataclass(frozen=True)
class Match:
    tokens: list[int]  # [<= k] the tokens that followed the match: the proposal
    ngram: int  # n: how many context tokens matched
    where: str  # "request" (its own context) or "pool"


def _starts(haystack: np.ndarray, pattern: np.ndarray) -> np.ndarray:
    """The start indexes of pattern in haystack, ascending."""
    n = pattern.size
    if haystack.size < n:
        return np.empty(0, dtype=np.int64)
    windows = np.lib.stride_tricks.sliding_window_view(haystack, n)  # [len - n + 1, n]
    return np.flatnonzero((windows == pattern).all(axis=1))


def _continuation(sequence: np.ndarray, tail: np.ndarray, k: int, oldest: bool) -> list[int] | None:
    """Up to k tokens that followed tail in sequence. An occurrence at the very end has nothing after it and is no
    match: so a request's own context, which ends with tail, never matches itself."""
    starts = _starts(sequence, tail)
    starts = starts[starts + tail.size < sequence.size]  # something must follow
    if starts.size == 0:
        return None
    start = int(starts[0] if oldest else starts[-1]) + tail.size
    return [int(t) for t in sequence[start : start + k]]


_NO_TOKENS = np.empty(0, dtype=np.int64)


class PoolIndex:
    """A pool's sequences end to end, newest first, searched in one pass per n-gram: the first sequence (newest) with
    a match gives it, as `_continuation` over each sequence in turn would, without a call per sequence (a step's
    search of a full pool took milliseconds that way, as long as a small model's step). Made once per change of the
    pool (LookupPool.index, shared_pool.SharedLookupPool.index)."""

    def __init__(self, sequences: Sequence[np.ndarray]):  # newest first
        lengths = np.array([s.size for s in sequences], dtype=np.int64)
        self.flat = np.concatenate([*sequences, _NO_TOKENS])  # [tokens] int64, as the pools hold them
        self.owner = np.repeat(np.arange(lengths.size), lengths)  # [tokens] the sequence each token is in
        self.end = np.repeat(np.cumsum(lengths), lengths)  # [tokens] where that sequence ends in flat

    def continuation(self, tail: np.ndarray, k: int, oldest: bool) -> list[int] | None:
        """Up to k tokens that followed tail in the newest sequence holding it with something after it."""
        n, flat = tail.size, self.flat
        starts = np.flatnonzero(flat[: max(flat.size - n, 0)] == tail[0])  # [matches] room for tail and one more
        for j in range(1, n):
            starts = starts[flat[starts + j] == tail[j]]
        starts = starts[starts + n < self.end[starts]]  # inside one sequence, something following it there
        if starts.size == 0:
            return None
        newest = starts[self.owner[starts] == self.owner[starts[0]]]
        start = int(newest[0] if oldest else newest[-1])
        return [int(t) for t in flat[start + n : min(start + n + k, int(self.end[start]))]]


def find_match(
    context: Sequence[int], k: int, settings: LookupSettings, pool: LookupPool | None = None
) -> Match | None:
    """The lookup's proposal for context: the longest matching n-gram's continuation (module docstring)."""
    if k <= 0 or (len(context) < 2 and pool is None):
        return None
    sequence = np.asarray(context, dtype=np.int64)
    index = pool.index() if pool is not None else None
    for n in range(min(settings.max_matching_ngram_size, sequence.size), 0, -1):
        tail = sequence[-n:]
        found = _continuation(sequence, tail, k, settings.oldest)
        if found:
            return Match(found, n, "request")
        found = index.continuation(tail, k, settings.oldest) if index is not None else None
        if found:
            return Match(found, n, "pool")
    return None


class LookupPool:
    """Recent requests' token sequences, bounded in tokens, shared by the requests of one deployment (thread-safe)."""

    def __init__(self, max_tokens: int):
        if max_tokens < 1:
            raise ValueError(f"pool max_tokens = {max_tokens}: must be >= 1")
        self.max_tokens = max_tokens
        self._sequences: deque[np.ndarray] = deque()  # oldest first
        self._lock = threading.Lock()
        self.tokens = 0  # held now
        self.added = 0  # sequences ever added
        self.evicted = 0  # sequences dropped to stay within max_tokens
        self._index: PoolIndex | None = None  # made by index(), dropped by add()

    def add(self, tokens: Sequence[int]) -> None:
        """Keep one finished request's prompt + output (its last max_tokens tokens), evicting the oldest to fit."""
        sequence = np.asarray(list(tokens)[-self.max_tokens :], dtype=np.int64)
        if sequence.size < 2:
            return
        with self._lock:
            while self._sequences and self.tokens + sequence.size > self.max_tokens:
                self.tokens -= self._sequences.popleft().size
                self.evicted += 1
            self._sequences.append(sequence)
            self.tokens += sequence.size
            self.added += 1
            self._index = None

    def sequences(self) -> list[np.ndarray]:
        """The held sequences, newest first (a snapshot: adding later does not change it)."""
        with self._lock:
            return list(reversed(self._sequences))

    def index(self) -> PoolIndex:
        """The held sequences as one PoolIndex, made again only after an add."""
        with self._lock:
            if self._index is None:
                self._index = PoolIndex(list(reversed(self._sequences)))
            return self._index

    def figures(self) -> dict[str, int]:
        with self._lock:
            return {
                "sequences": len(self._sequences),
                "tokens": self.tokens,
                "max_tokens": self.max_tokens,
                "added": self.added,
                "evicted": self.evicted,
            }

    def close(self) -> None:
        """Nothing to let go of: the pool lives in this process (speculative.shared_pool's is shared)."""


class LookupDrafter:
    """Drafter: prompt lookup over the request's context (and the pool when given); no model is called."""

    def __init__(
        self, settings: LookupSettings, pool: LookupPool | None = None, clock: Callable[[], float] = time.perf_counter
    ):
        self.settings, self.pool, self.clock = settings, pool, clock

    def match(self, tokens: Sequence[int], k: int) -> Match | None:
        return find_match(tokens, k, self.settings, self.pool)

    def propose(self, tokens: list[int], k: int, sampling: SamplingParams) -> Draft:
        t0 = self.clock()
        found = self.match(tokens, k)
        return Draft(tokens=found.tokens if found else [], seconds=self.clock() - t0, source=drafters.LOOKUP)


class HybridDrafter:
    """Drafter: per step the lookup's proposal or the draft model's, for one request (make one per request).

    The lookup's proposal is taken when its match is at least `hybrid_min_match` tokens long and it is expected to give
    at least as many tokens per unit of time as the draft model's: E(a_lookup, n) >= E(a_model, k) / (1 + c), with E the
    expected tokens per verify step (speculative.adaptive), a each drafter's acceptance in this request so far (read
    from how the context continued after its proposals; 0.5 before any), n the lookup's proposal length and c the
    draft model's call time over a verify step's (the time between two proposals, less the model's own; SEEDED_C before
    one of each is seen, and always for seeded sampling, whose text must not depend on timings). On a lookup step the
    draft model is not called.

    Drafting ahead (overlap on or "auto"), the early drafts are the draft model's (`early_drafter`: a lookup costs
    too little to hide); a step whose early draft is a hit takes it, as a model step would (its call is already made),
    and the loop tells this drafter (`adopt`), which learns from it as from its own proposals."""

    PRIOR = (1.0, 2.0)  # (accepted, drafted) pseudo-counts per drafter: acceptance 0.5 until measured
    SEEDED_C = 0.25  # c before it is measured, and for seeded sampling (speculative.loop.SEEDED_COST_RATIO)

    def __init__(self, lookup: LookupDrafter, model: Drafter):
        self.lookup, self.model, self.clock = lookup, model, lookup.clock
        # name -> [accepted, drafted]
        self.counts = {name: list(self.PRIOR) for name in (drafters.LOOKUP, drafters.MODEL)}
        self._last: tuple[int, list[int], str] | None = None  # the previous proposal: context length, tokens, drafter
        self._ended: float | None = None  # when the previous proposal was returned
        self._seconds = {drafters.MODEL: [0.0, 0], "verify": [0.0, 0]}  # name -> [seconds, calls]

    def propose(self, tokens: list[int], k: int, sampling: SamplingParams) -> Draft:
        t0 = self.clock()
        self._learn(tokens, t0)
        found = self.lookup.match(tokens, k)
        if found is not None and found.ngram >= self.lookup.settings.hybrid_min_match:
            c = self.SEEDED_C if sampling.seed is not None and not sampling.greedy else self.cost_ratio()
            if expected_tokens_per_step(self.acceptance(drafters.LOOKUP), len(found.tokens)) * (1 + c) >= (
                expected_tokens_per_step(self.acceptance(drafters.MODEL), k)
            ):
                draft = Draft(tokens=found.tokens, seconds=self.clock() - t0, source=drafters.LOOKUP)
                return self._proposed(tokens, draft)
        draft = self.model.propose(tokens, k, sampling)
        draft.source = drafters.MODEL
        self._seconds[drafters.MODEL][0] += draft.seconds or self.clock() - t0
        self._seconds[drafters.MODEL][1] += 1
        return self._proposed(tokens, draft)

    @property
    def early_drafter(self) -> Drafter:
        """What proposes this drafter's early drafts when the loop drafts ahead: the draft model."""
        return self.model

    def adopt(self, tokens: list[int], draft: Draft) -> None:
        """The loop took an early draft (the draft model's) for this step: learned from as this step's proposal."""
        self._learn(tokens, self.clock())
        self._proposed(tokens, draft)

    def acceptance(self, name: str) -> float:
        accepted, drafted = self.counts[name]
        return accepted / drafted

    def cost_ratio(self) -> float:
        (model_s, models), (verify_s, verifies) = self._seconds[drafters.MODEL], self._seconds["verify"]
        if not models or not verifies or verify_s <= 0:
            return self.SEEDED_C
        return (model_s / models) / (verify_s / verifies)

    def _proposed(self, tokens: list[int], draft: Draft) -> Draft:
        self._last = (len(tokens), list(draft.tokens), draft.source)
        self._ended = self.clock()
        return draft

    def _learn(self, tokens: list[int], now: float) -> None:
        """What became of the previous proposal: the context now continues with its accepted prefix."""
        if self._ended is not None:
            self._seconds["verify"][0] += now - self._ended
            self._seconds["verify"][1] += 1
        if self._last is None:
            return
        start, proposal, name = self._last
        accepted = 0
        while (
            accepted < len(proposal)
            and start + accepted < len(tokens)
            and tokens[start + accepted] == proposal[accepted]
        ):
            accepted += 1
        self.counts[name][0] += accepted
        self.counts[name][1] += len(proposal)


def make_drafter(name: str, model: Drafter | None, settings: LookupSettings, pool: LookupPool | None) -> Drafter:
    """The drafter called `name` (specbuild.drafters) over a draft model (None: there is none) and the lookup."""
    record = drafters.get(name)
    if record.needs_draft_model and model is None:
        raise ValueError(f"drafter {name!r} needs a draft model")
    if name == drafters.MODEL:
        return model
    lookup = LookupDrafter(settings, pool if settings.is_public_pool else None)
    if name == drafters.LOOKUP:
        return lookup
    if name == "hybrid":
        return HybridDrafter(lookup, model)
    raise AssertionError(f"drafter {name!r} has a record but no construction here")
