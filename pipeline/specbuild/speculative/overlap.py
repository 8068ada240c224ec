"""The overlapped (draft-ahead) schedule's parts: proposing ahead, on a thread, and when it is worth it.

While the target verifies draft d1..dK, the drafter proposes the next step's draft from
context + d1..dK + g, where g (the guess) is its own top token after dK. If the target accepts the
whole draft and its bonus token is g, that early draft is exactly the draft the next step would ask
for, and the step skips its draft call (a hit); otherwise it is discarded (a miss). loop.py owns
the rules (which K, seed and context an early draft must have) and asks `DraftAhead` at each step; this
module holds the schedule's state and what it runs on (docs/speculative.md has the timeline picture):

- `propose_ahead(drafter, tokens, k, sampling)`: the reference body of an early draft, built from
  `propose` alone. Greedy: one call for k + 1 tokens, [g, d'1..d'k] (the greedy continuation of
  tokens + [g] is the rest of the greedy continuation of tokens). Sampling: a greedy one-token call
  for g, then propose(tokens + [g], k, sampling), the very call the next step would make.
- `ThreadedAhead`: runs `propose_ahead` on one worker thread, for drafters that have only `propose`
  (a drafter may bring its own asynchronous `propose_ahead`, see interfaces.AheadDrafter).
- `EarlyDraft`: an early draft in flight: the tokens it continues, the K it was asked for, its handle.
- `DraftAhead`: the schedule's state for one request (the early draft in flight, the gate), which the loop
  asks at each step for this step's early draft and to start the next.
- `AutoSchedule`: `overlap = "auto"`: draft ahead or not, whichever has been faster, measured in segments of
  steps in each mode (one per deployment, across requests); `Segments` is a request's side of it.
- `resolve_auto`: `overlap = "auto"` for a deployment: kept where the drafter and the target can run at
  the same time (enough cores), else off. Its callers say what "enough" is: in-process
  (`reference.loading.resolve_overlap`) 2 x torch's threads, in the Triton BLS a core per model process.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from specbuild.speculative.interfaces import Ahead, AheadDrafter, Draft, Drafter, Pending, SamplingParams
from specbuild.speculative.stats import SpeculationStats

__all__ = [
    "AutoSchedule",
    "DraftAhead",
    "EarlyDraft",
    "Segments",
    "ThreadedAhead",
    "ahead_proposer",
    "available_cores",
    "parse_setting",
    "propose_ahead",
    "resolve_auto",
]

GREEDY = SamplingParams()


def propose_ahead(drafter: Drafter, tokens: list[int], k: int, sampling: SamplingParams) -> Ahead:
    """g = the drafter's top token after `tokens`, and its k-token proposal continuing tokens + [g]."""
    t0 = time.perf_counter()
    if sampling.greedy:
        both = drafter.propose(list(tokens), k + 1, sampling)
        seconds = both.seconds or time.perf_counter() - t0
        if not both.tokens:
            return Ahead(None, Draft([]), seconds)
        per_token = seconds / len(both.tokens)
        rest = _tail(both, 1, per_token * (len(both.tokens) - 1))
        return Ahead(int(both.tokens[0]), rest, per_token)
    first = drafter.propose(list(tokens), 1, GREEDY)
    guess_seconds = first.seconds or time.perf_counter() - t0
    if not first.tokens:
        return Ahead(None, Draft([]), guess_seconds)
    guess = int(first.tokens[0])
    t1 = time.perf_counter()
    draft = drafter.propose(list(tokens) + [guess], k, sampling)
    if not draft.seconds:
        draft.seconds = time.perf_counter() - t1
    return Ahead(guess, draft, guess_seconds)


def _tail(draft: Draft, n: int, seconds: float) -> Draft:
    """The draft without its first n tokens (and their rows of probs / logits)."""
    changes = {
        "tokens": list(draft.tokens[n:]),
        "seconds": seconds,
        "probs": None if draft.probs is None else draft.probs[n:],
    }
    if getattr(draft, "logits", None) is not None:  # ContractDraft
        changes["logits"] = draft.logits[n:]
    return dataclasses.replace(draft, **changes)


class ThreadedAhead:
    """`propose_ahead` for a drafter that has only `propose`: on one worker thread (one per request).

    The worker is the only extra thread touching the drafter; the loop's own draft calls wait for
    the drafter's lock (the reference engine takes one per call), so its caches never see two calls.
    """

    def __init__(self, drafter: Drafter):
        self.drafter = drafter
        self._pool: ThreadPoolExecutor | None = None

    def propose_ahead(self, tokens: list[int], k: int, sampling: SamplingParams) -> Pending:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="specbuild-draft-ahead")
        return self._pool.submit(propose_ahead, self.drafter, list(tokens), k, sampling)

    def close(self) -> None:
        """Drop what has not started, wait for what has (so the drafter is idle when the request ends)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


def ahead_proposer(drafter: Drafter) -> AheadDrafter | ThreadedAhead:
    """The drafter itself when it proposes asynchronously, else a ThreadedAhead around it."""
    return drafter if isinstance(drafter, AheadDrafter) else ThreadedAhead(drafter)


@dataclass
class EarlyDraft:
    tokens: list[int]  # [n] the context it continues (context + draft of the step it overlapped), before g
    k: int  # the K asked for: the next step's K under the hit hypothesis
    handle: Pending

    def take(self, context: list[int], k: int) -> tuple[Ahead | None, float]:
        """(the early draft, seconds waited for it) when context == tokens + [g] and the step's K is k;
        (None, seconds waited) on a miss. On a clear miss (a rejected draft token) an early draft that has
        started is still waited for: the drafter is busy with it, so the step's own draft would wait anyway,
        and sent beside it to a Triton model it would queue behind it (a request meeting another at a busy
        Python model can wait 500 ms in Triton's batcher; specbuild.triton.configs)."""
        t0 = time.perf_counter()
        if k != self.k or len(context) != len(self.tokens) + 1 or context[:-1] != self.tokens:
            if not self.handle.cancel():
                with contextlib.suppress(Exception):  # a failed early draft is dropped; the step drafts anew
                    self.handle.result()
            return None, time.perf_counter() - t0
        try:
            ahead = self.handle.result()
        except Exception:  # noqa: BLE001 - a failed early draft is a miss: the step drafts anew (speculative.fallback)
            return None, time.perf_counter() - t0
        waited = time.perf_counter() - t0
        return (ahead, waited) if ahead.guess is not None and ahead.guess == context[-1] else (None, waited)


class DraftAhead:
    """The overlapped schedule, one request's: at each step, `take` the early draft proposed during the previous
    verify when it is exactly this step's draft (a hit), then `start` the next step's early draft before this
    step's verify. The loop asks; the rules on which K, seed and context an early draft must have are loop.py's.

    `next_k(output, draft, draft_seconds)`: the K the next step would choose if this one accepted the whole
    draft, or 0 when it would not draft (or not run); `seed_for(step)`: that step's drafter sampling params."""

    def __init__(
        self,
        drafter: Drafter,
        auto: AutoSchedule | None,
        next_k: Callable[[list[int], Draft, float], int],
        seed_for: Callable[[int], SamplingParams],
    ):
        self.proposer = ahead_proposer(drafter)
        self.segments = Segments(auto) if auto is not None else None  # "auto": draft ahead where it is faster
        self.next_k, self.seed_for = next_k, seed_for
        self.early: EarlyDraft | None = None  # proposed during the previous verify, for this step

    def take(self, context: list[int], k: int, stats: SpeculationStats) -> Draft | None:
        """This step's early draft when it continues exactly `context` with K `k`, else None (a miss). Called
        once at the start of every step (the "auto" schedule times its segments from it)."""
        if self.segments is not None:
            self.segments.step(len(context))
        if self.early is None:
            return None
        taken, waited = self.early.take(context, k)
        self.early = None
        if taken is not None:
            stats.record_early_hit(max(taken.draft.seconds - waited, 0.0))  # the drafting the verify hid
        return taken.draft if taken is not None else None

    def start(
        self,
        context: list[int],
        output: list[int],
        draft: Draft,
        draft_seconds: float,
        step: int,
        stats: SpeculationStats,
    ) -> None:
        """Propose step `step`'s draft as if this step were a hit (its draft all accepted, bonus token = the
        guess), unless that step would not draft or "auto" runs this segment sequentially."""
        if self.segments is not None and not self.segments.ahead:
            return
        k = self.next_k(output, draft, draft_seconds)
        if k <= 0:
            return
        tokens = context + list(draft.tokens)
        self.early = EarlyDraft(tokens, k, self.proposer.propose_ahead(tokens, k, self.seed_for(step)))
        stats.record_early_draft()

    def close(self) -> None:
        if self.early is not None:
            self.early.handle.cancel()
            self.early = None
        if isinstance(self.proposer, ThreadedAhead):
            self.proposer.close()


@dataclass
class AutoSchedule:
    """`overlap = "auto"`: draft ahead or not, whichever has been faster here, measured.

    Whether drafting ahead pays depends on what no formula here knows well: how often early drafts hit (the
    acceptance of the text at hand), and what the early draft running beside the verification costs it on this
    machine (shared cores, caches and memory bandwidth, the Python backend's queues); it can win on one workload
    and lose on another (docs/bench/results.md). So the schedule is measured:
    requests run in segments of `segment` steps, each in one mode; a segment's wall time and tokens go to that
    mode's running figure (seconds per token, weighted by `decay` per segment of that mode). The next segment runs
    the faster mode (drafting ahead must win by `margin`: it keeps a second core busy); each mode is measured once
    before that, and every `explore_every` segments the other mode runs one, so a change of text or load is seen.

    One per deployment (a local session, the BLS) learns across requests, and requests running at the same time
    report into it (thread-safe); a request without one gets its own. Tokens per step do not depend on the
    schedule (the same K, the same acceptance), so seconds per token compare the schedules alone. (One learner per
    K was tried: on the bench's short runs each K's own first look at the slower schedule cost more than mixing K
    did, docs/bench/results.md.)

    Looking at the other schedule costs its gap for a segment, so the look comes less often as the measured gap
    grows: every `explore_every` segments, or every gap / `explore_cost` segments where that is more (a schedule 21 %
    faster is left for 21 segments: the looks cost about 1 % of the time), at most every `max_explore_every`."""

    segment: int = 8
    explore_every: int = 8
    decay: float = 0.8
    margin: float = 0.02
    explore_cost: float = 0.01
    max_explore_every: int = 32
    clock: Callable[[], float] = time.perf_counter
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    _seconds: dict[bool, float] = field(default_factory=lambda: {True: 0.0, False: 0.0}, init=False, repr=False)
    _tokens: dict[bool, float] = field(default_factory=lambda: {True: 0.0, False: 0.0}, init=False, repr=False)
    _segments: dict[bool, int] = field(default_factory=lambda: {True: 0, False: 0}, init=False, repr=False)
    _since_exploring: int = field(default=0, init=False, repr=False)

    def seconds_per_token(self, ahead: bool) -> float | None:
        return self._seconds[ahead] / self._tokens[ahead] if self._tokens[ahead] else None

    def faster(self) -> bool:
        """Whether drafting ahead has been the faster schedule (by `margin`); True before anything is measured."""
        ahead, sequential = self.seconds_per_token(True), self.seconds_per_token(False)
        if ahead is None or sequential is None:
            return True
        return ahead * (1.0 + self.margin) < sequential

    def explore_interval(self) -> int:
        """Segments of the faster schedule between two looks at the other (see the class's docstring)."""
        ahead, sequential = self.seconds_per_token(True), self.seconds_per_token(False)
        if not ahead or not sequential:
            return self.explore_every
        gap = max(ahead, sequential) / min(ahead, sequential) - 1.0
        return min(self.max_explore_every, max(self.explore_every, math.ceil(gap / self.explore_cost)))

    def choose(self) -> bool:
        """The mode of a new segment: True = draft ahead."""
        with self._lock:
            for mode in (True, False):
                if not self._segments[mode]:
                    return mode
            best = self.faster()
            if self._since_exploring >= self.explore_interval():
                self._since_exploring = 0
                return not best
            self._since_exploring += 1
            return best

    def report(self, ahead: bool, seconds: float, tokens: int) -> None:
        """A finished segment: its wall time (step starts to the next step's start) and the tokens it made."""
        if tokens <= 0 or seconds <= 0:
            return
        with self._lock:
            self._seconds[ahead] = self.decay * self._seconds[ahead] + seconds
            self._tokens[ahead] = self.decay * self._tokens[ahead] + tokens
            self._segments[ahead] += 1

    def figures(self) -> dict[str, object]:
        with self._lock:
            return {
                "drafting_ahead": self.faster(),
                "segments": {"ahead": self._segments[True], "sequential": self._segments[False]},
                "seconds_per_token": {
                    "ahead": self.seconds_per_token(True),
                    "sequential": self.seconds_per_token(False),
                },
            }


class Segments:
    """One request's side of an AutoSchedule: which mode its current segment runs, and when it ends."""

    def __init__(self, schedule: AutoSchedule):
        self.schedule, self.clock = schedule, schedule.clock
        self.ahead = schedule.faster()  # the first step (the prompt's prefill) is not timed: the best guess
        self._started: tuple[float, int] | None = None  # (time, tokens) when the segment began
        self._steps = 0
        self._first = True

    def step(self, tokens: int) -> None:
        """A step begins; `tokens`: the context's length (prompt + output so far). Segments start at the second
        step: the first one's time is mostly the prompt's prefill, the same for either schedule."""
        if self._first:
            self._first = False
            return
        now = self.clock()
        if self._started is not None:
            self._steps += 1
            if self._steps >= self.schedule.segment:
                self.schedule.report(self.ahead, now - self._started[0], tokens - self._started[1])
                self._started = None
        if self._started is None:
            self.ahead, self._started, self._steps = self.schedule.choose(), (now, tokens), 0


CORES_ENV = "SPECBUILD_CORES"  # the cores to plan for, where the affinity mask and the CPU quota do not say it


def available_cores() -> int:
    """CPU cores this process may use: the fewer of its affinity mask (which containers and taskset narrow) and its
    cgroup's CPU quota, rounded up (a Kubernetes CPU limit leaves the mask at every core of the node and sets the
    quota); SPECBUILD_CORES, where set, overrides both."""
    if (override := os.environ.get(CORES_ENV)) is not None:
        if not override.strip().isdigit() or int(override) < 1:
            raise ValueError(f"{CORES_ENV} = {override!r}: must be a whole number of cores >= 1")
        return int(override)
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    quota = cgroup_cpu_quota()
    return max(1, min(cores, math.ceil(quota))) if quota is not None else cores


def cgroup_cpu_quota(root: Path = Path("/sys/fs/cgroup")) -> float | None:
    """CPUs the process's cgroup may use per period (cgroup v2 cpu.max, v1 cpu.cfs_quota_us over cpu.cfs_period_us),
    or None where there is no limit or no cgroup file to read (the kernel's cgroup-v2.rst and sched-bwc.rst)."""
    try:
        quota, period = (root / "cpu.max").read_text().split()  # "max 100000" or "200000 100000"
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota = int((root / "cpu" / "cpu.cfs_quota_us").read_text())  # -1: no limit
        period = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        return quota / period if quota > 0 and period > 0 else None
    except (OSError, ValueError):
        return None


def parse_setting(value: object, where: str = "overlap") -> bool | str:
    """True, False or "auto" from a config or request value (a bool; "true", "1", "yes", "on"; "false", "0", "no",
    "off"; "auto"; in any case, blanks around ignored); ValueError naming `where` otherwise."""
    word = str(value).strip().lower()  # str(True) is "True"
    if word in ("true", "1", "yes", "on"):
        return True
    if word in ("false", "0", "no", "off"):
        return False
    if word == "auto":
        return "auto"
    raise ValueError(f'{where} = {value!r} is invalid: use true, false or "auto".')


def resolve_auto(setting: bool | str, cores: int, need: int, what: str) -> tuple[bool | str, str]:
    """(the schedule, why) for a setting: True and False as asked; "auto" stays "auto" (AutoSchedule then
    drafts ahead where it has been faster) when `cores` >= `need`, the cores that run `what` at once, else False:
    with fewer, the drafter and the target only take turns."""
    if setting is True or setting is False:
        return setting, f"overlap {'on' if setting else 'off'} as asked"
    if cores >= need:
        return "auto", f"auto: {cores} cores for {what}"
    return False, f"auto: off, {cores} core{'s' if cores != 1 else ''} cannot run {what} at once"
