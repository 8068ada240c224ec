"""A failed target call is tried again until the target serves (triton.models.target_retry): greedy output equal to
K = 0 on held-out prompts whatever calls fail, sampled output exactly the undisturbed run's (a repeated call is the
same call), the deadline with its UNAVAILABLE error, the client's fault and a cancelled request not waited on. The
same against the real server, the target's process killed mid-stream: tests/test_triton_faults.py."""

from __future__ import annotations

import numpy as np
import pytest
from toy_model import NGramModel, ToyDrafter, ToyVerifier, random_model

from specbuild.errors import RequestError
from specbuild.speculative.interfaces import SamplingParams
from specbuild.speculative.loop import GenerationRequest, run
from specbuild.triton.models.common import ModelCallError
from specbuild.triton.models.target_retry import RetryingVerifier, TargetUnavailable

VOCAB = 24
TARGET = random_model(VOCAB, order=2, scale=3.0, seed=31)
DRAFT = NGramModel(TARGET.table + np.random.default_rng(32).normal(0.0, 0.5, size=TARGET.table.shape))
DEAD = "model 'tensorrt_llm' failed: Stub process 'tensorrt_llm_0_0' is not healthy."


class FlakyVerifier(ToyVerifier):
    """A target whose calls fail where `fails(call)` says, as a dead, frozen or reloading model's calls do."""

    def __init__(self, model, fails, max_draft_len=6):
        super().__init__(model, max_draft_len=max_draft_len)
        self.fails, self.attempts = fails, 0

    def verify(self, tokens, draft, sampling):
        self.attempts += 1
        if self.fails(self.attempts):
            raise ModelCallError(DEAD)
        return super().verify(tokens, draft, sampling)


class FakeTime:
    """A clock that a sleep moves: the waits of a test take no time."""

    def __init__(self):
        self.now, self.slept = 100.0, []  # not 0: a time is never mistaken for a duration

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(round(seconds, 6))
        self.now += seconds


def retrying(verifier, deadline_s=30.0, **kwargs):
    time = FakeTime()
    return RetryingVerifier(verifier, deadline_s, clock=time.clock, sleep=time.sleep, **kwargs), time


def held_out_prompts(n: int, seed: int = 41) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, VOCAB, size=int(rng.integers(3, 12))).tolist() for _ in range(n)]


@pytest.mark.parametrize("pattern", ["every other call", "a run of calls"])
def test_greedy_output_equals_k0_whatever_target_calls_fail(pattern):
    fails = {"every other call": lambda n: n % 2 == 0, "a run of calls": lambda n: 3 <= n <= 12}[pattern]
    retried = 0
    for prompt in held_out_prompts(30):
        baseline = run(prompt, ToyDrafter(DRAFT), ToyVerifier(TARGET, 6), GenerationRequest(24, num_draft_tokens=0))
        for k in (0, 1, 4):
            verifier, _ = retrying(FlakyVerifier(TARGET, fails))
            out = run(prompt, ToyDrafter(DRAFT), verifier, GenerationRequest(24, num_draft_tokens=k))
            assert out.tokens == baseline.tokens, (pattern, k, prompt)
            assert verifier.retries == sum(fails(n) for n in range(1, verifier.verifier.attempts + 1))
            retried += verifier.retries
    assert retried > 0


def test_sampled_output_is_the_undisturbed_runs():
    """A repeated call is the same call: seeded sampling gives token for token the run without failures."""
    for seed in range(20):
        request = GenerationRequest(24, num_draft_tokens=3, sampling=SamplingParams(temperature=1.0, seed=seed))
        prompt = [1, 2, 3]
        undisturbed = run(prompt, ToyDrafter(DRAFT), ToyVerifier(TARGET, 6), request)
        verifier, _ = retrying(FlakyVerifier(TARGET, lambda n: n % 3 == 1))
        assert run(prompt, ToyDrafter(DRAFT), verifier, request).tokens == undisturbed.tokens


def test_the_waits_double_to_a_second_and_the_deadline_ends_the_request_unavailable():
    told = []
    verifier, time = retrying(FlakyVerifier(TARGET, lambda n: True), deadline_s=5.0, log=told.append)
    with pytest.raises(TargetUnavailable) as err:
        verifier.verify([1, 2], ToyDrafter(DRAFT).propose([1, 2], 2, SamplingParams()), SamplingParams())
    assert time.slept == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0, 0.5]  # the last wait ends at the deadline
    assert time.now == 105.0 and verifier.retries == 8 and verifier.verifier.attempts == 9
    assert verifier.waited_s == 5.0
    assert str(err.value) == (
        f"{DEAD} (tried again for 5.0 s, up to serve.target_retry_s = 5 s, and it did not serve again); the text "
        "streamed so far stands, and the request may be sent again"
    )
    assert isinstance(err.value, ModelCallError)  # the BLS logs it, as any failed model call
    assert told == [f"the target model failed ({DEAD}): the request waits for it, up to 5 s"]


def test_a_target_back_within_the_deadline_is_a_pause_and_said_so():
    told = []
    verifier, time = retrying(FlakyVerifier(TARGET, lambda n: n <= 3 or n == 5), deadline_s=5.0, log=told.append)
    draft = ToyDrafter(DRAFT).propose([1, 2], 2, SamplingParams())
    verification = verifier.verify([1, 2], draft, SamplingParams())
    assert verification.tokens and verifier.retries == 3 and time.now == pytest.approx(100.7)
    assert verifier.waited_s == pytest.approx(0.7)
    assert told[-1] == "the target model answers again after 0.7 s: the request goes on" and len(told) == 2
    verifier.verify([1, 2], draft, SamplingParams())  # the fifth call fails, the sixth answers: 0.1 s more
    assert verifier.retries == 4 and verifier.waited_s == pytest.approx(0.8)


def test_the_time_waited_adds_up_across_steps_even_when_one_gives_up():
    verifier, _ = retrying(FlakyVerifier(TARGET, lambda n: n != 2), deadline_s=1.0)
    draft = ToyDrafter(DRAFT).propose([1, 2], 1, SamplingParams())
    verifier.verify([1, 2], draft, SamplingParams())  # the first call fails, the second answers: 0.1 s
    with pytest.raises(TargetUnavailable):
        verifier.verify([1, 2], draft, SamplingParams())  # every later call fails: 1.0 s
    assert verifier.waited_s == pytest.approx(1.1)


def test_a_deadline_of_zero_ends_the_request_at_the_first_failure():
    verifier, time = retrying(FlakyVerifier(TARGET, lambda n: n == 1), deadline_s=0.0)
    with pytest.raises(TargetUnavailable):
        verifier.verify([1, 2], ToyDrafter(DRAFT).propose([1, 2], 1, SamplingParams()), SamplingParams())
    assert time.slept == [] and verifier.verifier.attempts == 1


def test_the_clients_own_fault_and_a_cancelled_request_are_not_waited_on():
    class Refusing(ToyVerifier):
        def verify(self, tokens, draft, sampling):
            raise RequestError("end_id = 99999 is outside the vocabulary")

    verifier, time = retrying(Refusing(TARGET, 6))
    with pytest.raises(RequestError):
        verifier.verify([1], ToyDrafter(DRAFT).propose([1], 1, SamplingParams()), SamplingParams())
    assert time.slept == []
    verifier, time = retrying(FlakyVerifier(TARGET, lambda n: True), cancelled=lambda: len(time.slept) >= 2)
    with pytest.raises(ModelCallError) as err:
        verifier.verify([1], ToyDrafter(DRAFT).propose([1], 1, SamplingParams()), SamplingParams())
    assert not isinstance(err.value, TargetUnavailable) and time.slept == [0.1, 0.2]


def test_the_wrapper_reports_the_targets_draft_limit():
    assert retrying(ToyVerifier(TARGET, max_draft_len=5))[0].max_draft_len == 5
