"""A draft that fails is a target-only step (speculative.fallback): greedy output equal to K = 0 on held-out prompts
whatever steps the draft model fails, sampled output distributed as the target's (with a negative control), the
deployment's pause after a failure, the client's own fault passed on, and the count in the stats. The same against
the real server, the draft model's process killed mid-stream: tests/test_triton_faults.py."""

from __future__ import annotations

import numpy as np
import pytest
from test_speculative_distribution import P_CORRECT, P_WRONG, chi_square_pvalue, exact_joint
from toy_model import NGramModel, ToyDrafter, ToyVerifier, random_model

from specbuild.decode.drafting import Drafting
from specbuild.drafters import LookupSettings
from specbuild.errors import RequestError
from specbuild.speculative.fallback import DraftHealth, FallbackDrafter
from specbuild.speculative.interfaces import SamplingParams
from specbuild.speculative.loop import GenerationRequest, run
from specbuild.triton.models.common import ModelCallError

VOCAB = 24
TARGET = random_model(VOCAB, order=2, scale=3.0, seed=11)
DRAFT = NGramModel(TARGET.table + np.random.default_rng(12).normal(0.0, 0.5, size=TARGET.table.shape))


class FlakyDrafter(ToyDrafter):
    """A draft model whose calls fail where `fails(call)` says, as a dead or frozen model's calls do."""

    def __init__(self, model, fails):
        super().__init__(model)
        self.fails, self.attempts = fails, 0

    def propose(self, tokens, k, sampling):
        self.attempts += 1
        if self.fails(self.attempts):
            raise ModelCallError("model 'tensorrt_llm_draft' failed: Stub process is not healthy.")
        return super().propose(tokens, k, sampling)


class StoppedClock:
    """A clock that moves only when told: pauses then end exactly where a test says."""

    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Ticking:
    """A clock 10 s later at every reading: each failure's pause is over by the next step."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 10.0
        return self.now


def held_out_prompts(n: int, seed: int = 21) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, VOCAB, size=int(rng.integers(3, 12))).tolist() for _ in range(n)]


@pytest.mark.parametrize("pattern", ["every other call", "a run of calls", "every call"])
def test_greedy_output_equals_k0_whatever_steps_the_draft_fails(pattern):
    fails = {
        "every other call": lambda n: n % 2 == 0,
        "a run of calls": lambda n: 3 <= n <= 9,
        "every call": lambda n: True,
    }[pattern]
    verifier = ToyVerifier(TARGET, max_draft_len=6)
    fallbacks = 0
    for prompt in held_out_prompts(30):
        baseline = run(prompt, ToyDrafter(DRAFT), verifier, GenerationRequest(max_tokens=24, num_draft_tokens=0))
        for k in (1, 4):
            flaky = FlakyDrafter(DRAFT, fails)
            drafter = FallbackDrafter(flaky, DraftHealth(clock=Ticking()))
            out = run(prompt, drafter, verifier, GenerationRequest(max_tokens=24, num_draft_tokens=k))
            assert out.tokens == baseline.tokens, (pattern, k, prompt)
            asked = out.stats.by_drafter["model"]["steps"]  # the steps with K > 0 (a last step may have K = 0)
            assert flaky.attempts == asked  # the ticking clock ends every pause before the next step
            assert out.stats.fallback_steps == sum(fails(n) for n in range(1, asked + 1))
            fallbacks += out.stats.fallback_steps
            if pattern == "every call":
                assert out.stats.fallback_steps == asked and out.stats.drafted == 0
    assert fallbacks > 0


def test_after_a_failure_the_deployment_pauses_its_drafts_doubling_to_a_cap_and_a_success_ends_it():
    clock, told = StoppedClock(), []
    health = DraftHealth(clock=clock)
    assert health.last_error is None and DraftHealth(clock=lambda: 0.0).may_try()  # healthy from the first instant
    dead = True
    flaky = FlakyDrafter(DRAFT, lambda n: dead)
    timer = iter(range(1000))  # each failed call takes 1 "second" of this timer
    drafter = FallbackDrafter(flaky, health, told.append, timer=lambda: float(next(timer)))
    pauses = []
    for _ in range(6):
        draft = drafter.propose([1, 2], 2, SamplingParams())
        assert draft.tokens == [] and draft.failure.startswith("ModelCallError: model 'tensorrt_llm_draft' failed")
        assert draft.seconds == 1.0  # the failed call's own time, by the drafter's timer
        start = clock.now
        while not health.may_try():  # paused: no call is made
            assert drafter.propose([1, 2], 2, SamplingParams()).failure.startswith("paused after: ModelCallError")
            clock.now += 0.125
        pauses.append(clock.now - start)
    assert pauses == [0.25, 0.5, 1.0, 2.0, 2.0, 2.0] and flaky.attempts == 6 and health.failures == 6
    error = "ModelCallError: model 'tensorrt_llm_draft' failed: Stub process is not healthy."
    assert told == [  # one line per failed call, none while paused
        f"the draft model failed ({error}): steps run on the target alone until it answers again",
        f"the draft model failed again ({error}); next try in 0.50 s",
        f"the draft model failed again ({error}); next try in 1.00 s",
        *[f"the draft model failed again ({error}); next try in 2.00 s"] * 3,
    ]
    dead = False
    assert len(drafter.propose([1, 2], 2, SamplingParams()).tokens) == 2
    assert told[-1] == "the draft model answers again: drafting resumed" and len(told) == 7
    assert len(drafter.propose([1, 2], 2, SamplingParams()).tokens) == 2 and len(told) == 7
    dead = True
    drafter.propose([1, 2], 2, SamplingParams())
    assert told[-1].startswith("the draft model failed (")  # a new run of failures, from the first pause
    clock.now += 0.25
    assert health.may_try()


def test_the_clients_own_fault_is_not_a_draft_failure():
    class Refusing:
        def propose(self, tokens, k, sampling):
            raise RequestError("end_id = 99999 is outside the vocabulary")

    health = DraftHealth()
    with pytest.raises(RequestError, match="end_id = 99999"):
        FallbackDrafter(Refusing(), health).propose([1], 1, SamplingParams())
    assert health.failures == 0 and health.may_try()


def test_a_deployments_requests_share_the_pause():
    clock = StoppedClock()
    drafting = Drafting.create("model", FlakyDrafter(DRAFT, lambda n: True), LookupSettings())
    drafting.health = DraftHealth(clock=clock)
    first, second = drafting.drafter("model"), drafting.drafter("hybrid")
    assert first.propose([1, 2], 2, SamplingParams()).failure.startswith("ModelCallError")
    assert drafting.model.attempts == 1
    assert second.propose([5, 6, 7], 2, SamplingParams()).failure.startswith("paused after")  # the hybrid's model
    assert drafting.model.attempts == 1  # the second request did not call the dead model


TARGET4 = random_model(4, order=2, scale=1.5, seed=13)
DRAFT4 = NGramModel(TARGET4.table + np.random.default_rng(14).normal(0.0, 1.0, size=TARGET4.table.shape))


class LosesQ:
    """A wrong fallback: on a failure it drafts from the draft model elsewhere but loses q on the way and sends a
    uniform placeholder, so tokens are accepted with min(1, p / uniform) instead of min(1, p / q): biased."""

    def __init__(self, flaky):
        self.flaky = flaky

    def propose(self, tokens, k, sampling):
        try:
            return self.flaky.propose(tokens, k, sampling)
        except ModelCallError:
            draft = ToyDrafter(DRAFT4).propose(tokens, k, sampling)
            draft.probs = np.full_like(draft.probs, 1.0 / draft.probs.shape[1])
            return draft


def flaky_samples(prompt: list[int], n: int, wrong: bool = False) -> np.ndarray:
    """n seeded 3-token samples with K = 2 through a draft model that fails every other call."""
    out = np.zeros((n, 3), dtype=np.int64)
    for i in range(n):
        flaky = FlakyDrafter(DRAFT4, lambda call: call % 2 == 0)
        drafter = LosesQ(flaky) if wrong else FallbackDrafter(flaky, DraftHealth(clock=Ticking()))
        request = GenerationRequest(max_tokens=3, num_draft_tokens=2, sampling=SamplingParams(temperature=1.0, seed=i))
        out[i] = run(prompt, drafter, ToyVerifier(TARGET4, max_draft_len=2), request).tokens
    return out


def test_sampled_output_follows_the_targets_distribution_through_failures():
    """A target-only step samples the target's own token: the chi-square test of test_speculative_distribution.py
    passes through failures, and catches a fallback that loses the draft's q."""
    prompt = [3, 1]
    joint = exact_joint(TARGET4, prompt, 3, SamplingParams(temperature=1.0))
    assert chi_square_pvalue(flaky_samples(prompt, 8_000), joint) > P_CORRECT
    assert chi_square_pvalue(flaky_samples(prompt, 8_000, wrong=True), joint) < P_WRONG
