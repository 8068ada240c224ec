"""A target that fails is a pause, not an error: the BLS's verify call is tried again until the target serves again.

Each verify call (and a guided request's constrained step) is the whole request so far (the prompt and every token accepted, specbuild.contract.adapters;
KV-cache reuse makes the repeat cheap on a GPU), and a failed call returned nothing the loop used, so calling again
once the target answers gives the very step the failed call would have: the stream goes on exactly as without the
fault, greedy or sampled. `RetryingVerifier` wraps the BLS's ContractVerifier: a call that fails with ModelCallError
(the target's stub dead or frozen until Triton fails the call, the model not ready while specbuild serve's supervisor
reloads it, a transient error answer) is tried again, after a wait that doubles from FIRST_WAIT_S to MAX_WAIT_S, for
up to `deadline_s` from the step's first failure (the spec's `serve.target_retry_s`). Past it the request ends with
TargetUnavailable (UNAVAILABLE to the client, after every token already streamed), which says the request may be
sent again. The client's own fault (RequestError: INVALID_ARG) is never retried, and a cancelled request stops waiting.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import numpy as np

from specbuild.speculative.interfaces import Draft, SamplingParams, Verification, Verifier
from specbuild.triton.models.common import ModelCallError

__all__ = ["RetryingVerifier", "TargetUnavailable"]

T = TypeVar("T")


class TargetUnavailable(ModelCallError):
    """The target did not serve again within the deadline: the request may be sent again (UNAVAILABLE)."""


class RetryingVerifier:
    """Verifier: `verifier`, its calls tried again while they fail with ModelCallError, up to `deadline_s` a step.

    `log(message)` is told when a step's call first fails and when the target answers again; `cancelled()` ends the
    wait (the failure is raised). `retries` and `waited_s` count this request's repeated calls and the time they took.
    """

    FIRST_WAIT_S = 0.1  # before the first repeat
    MAX_WAIT_S = 1.0  # the longest wait between two calls

    def __init__(
        self,
        verifier: Verifier,
        deadline_s: float,
        log: Callable[[str], None] | None = None,
        cancelled: Callable[[], bool] | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ):
        self.verifier, self.deadline_s, self.log, self.cancelled = verifier, deadline_s, log, cancelled
        self.clock, self.sleep = clock, sleep
        self.retries = 0
        self.waited_s = 0.0

    @property
    def max_draft_len(self) -> int:
        return self.verifier.max_draft_len

    def verify(self, tokens: list[int], draft: Draft, sampling: SamplingParams) -> Verification:
        return self._retried(lambda: self.verifier.verify(tokens, draft, sampling))

    def step_banning(self, tokens: list[int], banned: np.ndarray, sampling: SamplingParams) -> int:
        """A guided request's constrained step (speculative.guide), tried again like a verification."""
        return self._retried(lambda: self.verifier.step_banning(tokens, banned, sampling))  # type: ignore[attr-defined]

    def _retried(self, call: Callable[[], T]) -> T:
        first_failure: float | None = None
        wait = self.FIRST_WAIT_S
        while True:
            try:
                verification = call()
            except TargetUnavailable:
                raise
            except ModelCallError as err:
                now = self.clock()
                if first_failure is None:
                    first_failure = now
                    self._tell(
                        f"the target model failed ({err}): the request waits for it, up to {self.deadline_s:g} s"
                    )
                waited = now - first_failure
                if waited >= self.deadline_s:
                    self.waited_s += waited
                    raise TargetUnavailable(
                        f"{err} (tried again for {waited:.1f} s, up to serve.target_retry_s = {self.deadline_s:g} s, "
                        "and it did not serve again); the text streamed so far stands, and the request may be sent "
                        "again"
                    ) from err
                if self.cancelled is not None and self.cancelled():
                    raise
                self.sleep(min(wait, self.deadline_s - waited))
                wait = min(2 * wait, self.MAX_WAIT_S)
                self.retries += 1
                continue
            if first_failure is not None:
                waited = self.clock() - first_failure
                self.waited_s += waited
                self._tell(f"the target model answers again after {waited:.1f} s: the request goes on")
            return verification

    def _tell(self, message: str) -> None:
        if self.log is not None:
            self.log(message)
