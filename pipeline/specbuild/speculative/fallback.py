"""A draft that fails is a step without one: the request goes on with target-only steps.

A draft is only an optimisation: a step with no draft is a plain target step, whose token is the target's own
(greedy: the same token K = 0 gives; sampling: drawn from the target's distribution, acceptance.py), so a failed
draft model call (its process dead or frozen until Triton fails the call, an error answer, a broken answer) need not
reach the client. `FallbackDrafter` wraps a request's draft-model drafter: where the call raises anything but the
client's own fault (RequestError: the client's request is at fault, and it hears so), the step gets an empty draft
marked with the failure, and the loop counts it (`SpeculationStats.fallback_steps`).

`DraftHealth` is the deployment's memory of it (one per `decode.drafting.Drafting`: the local session, each BLS
instance), shared by its requests: after a failure, drafts are not asked for during a pause that doubles with each
failure in a row (RETRY_FIRST_S up to RETRY_MAX_S), so a dead model costs one failed call per pause, not one per step
of every request; the first draft that succeeds ends it, and speculation resumes where the model serves again
(specbuild serve's supervisor reloads a dead model in about a second).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from specbuild.errors import RequestError
from specbuild.speculative.interfaces import Draft, Drafter, SamplingParams

__all__ = ["DraftHealth", "FallbackDrafter"]


class DraftHealth:
    """Whether a deployment's draft model is asked for drafts now (thread-safe; one per Drafting)."""

    RETRY_FIRST_S = 0.25  # the pause after a first failure
    RETRY_MAX_S = 2.0  # the longest pause, however many failures in a row

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self._lock = threading.Lock()
        self._retry_at = 0.0  # no draft is asked for before this time
        self.pause = 0.0  # the pause now, or the last one (0: the model is healthy)
        self.failures = 0  # draft calls that failed, ever
        self.last_error: str | None = None

    def may_try(self) -> bool:
        with self._lock:
            return self.clock() >= self._retry_at

    def failed(self, error: str) -> bool:
        """Count a failed draft call and pause; True when it is the first of a run of failures (worth a log line)."""
        with self._lock:
            first = self.pause == 0.0
            self.pause = self.RETRY_FIRST_S if first else min(2 * self.pause, self.RETRY_MAX_S)
            self._retry_at = self.clock() + self.pause
            self.failures += 1
            self.last_error = error
            return first

    def succeeded(self) -> bool:
        """A draft call answered; True when it ends a run of failures (worth a log line)."""
        with self._lock:
            recovered, self.pause = self.pause != 0.0, 0.0
            return recovered


class FallbackDrafter:
    """Drafter: `drafter` (a draft model's), or an empty draft marked failed where it fails or `health` pauses it.

    `log(message)` is told of each failed call (the first of a run says what follows) and when drafting resumes;
    `timer` times a failed call (its Draft.seconds)."""

    def __init__(
        self,
        drafter: Drafter,
        health: DraftHealth,
        log: Callable[[str], None] | None = None,
        timer: Callable[[], float] = time.perf_counter,
    ):
        self.drafter, self.health, self.log, self.timer = drafter, health, log, timer

    def propose(self, tokens: list[int], k: int, sampling: SamplingParams) -> Draft:
        if not self.health.may_try():
            return Draft(tokens=[], failure=f"paused after: {self.health.last_error}")
        t0 = self.timer()
        try:
            draft = self.drafter.propose(tokens, k, sampling)
        except RequestError:
            raise  # the client's request is at fault, not the draft model: the client hears why
        except Exception as err:  # noqa: BLE001 - any other failure of the draft costs only its speedup
            error = f"{type(err).__name__}: {err}"
            first = self.health.failed(error)
            if self.log is not None:  # every failed call, at most one per pause: specbuild serve's supervisor reads
                # Triton's "Stub process ... is not healthy" in these lines to find a stub that hangs
                self.log(
                    f"the draft model failed ({error}): steps run on the target alone until it answers again"
                    if first
                    else f"the draft model failed again ({error}); next try in {self.health.pause:.2f} s"
                )
            return Draft(tokens=[], seconds=self.timer() - t0, failure=error)
        if self.health.succeeded() and self.log is not None:
            self.log("the draft model answers again: drafting resumed")
        return draft
