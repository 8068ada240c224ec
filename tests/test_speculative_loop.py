"""The draft/verify loop: greedy equality, determinism, stops, budget, clamping, contracts."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from toy_model import NGramModel, ToyDrafter, ToyVerifier, random_model

from specbuild.errors import GenerationError, RequestError
from specbuild.speculative.acceptance import accept_greedy
from specbuild.speculative.draft_len import resolve_k
from specbuild.speculative.interfaces import Draft, SamplingParams, Verification
from specbuild.speculative.loop import DRAFTER, VERIFIER, GenerationRequest, derive_seed, generate, run

V = 12
EOS = 11


# --- scripted fakes: the target's greedy continuation is a fixed list -------------------------


class ScriptDrafter:
    """Proposes script[n], script[n + 1], ... where n = tokens generated so far."""

    def __init__(self, script, prompt_len, end_id=None):
        self.script, self.prompt_len, self.end_id = list(script), prompt_len, end_id
        self.asked: list[int] = []

    def propose(self, tokens, k, sampling):
        self.asked.append(k)
        n = len(tokens) - self.prompt_len
        out = []
        for t in self.script[n : n + k]:
            out.append(t)
            if t == self.end_id:
                break
        return Draft(out)


class ScriptVerifier:
    """A greedy target whose argmax after n generated tokens is script[n]; uses the real greedy rule."""

    def __init__(self, script, prompt_len, max_draft_len=8):
        self.script, self.prompt_len, self.max_draft_len = list(script), prompt_len, max_draft_len
        self.calls: list[list[int]] = []

    def verify(self, tokens, draft, sampling):
        self.calls.append(list(draft.tokens))
        n = len(tokens) - self.prompt_len
        logits = np.zeros((len(draft.tokens) + 1, V))
        logits[np.arange(len(draft.tokens) + 1), self.script[n : n + len(draft.tokens) + 1]] = 1.0
        accepted, out = accept_greedy(draft.tokens, logits)
        return Verification(accepted, out)


PROMPT = [3, 7]


def script_run(target, draft, k, max_tokens=50, end_id=EOS, stops=(), max_draft_len=8, drafter_end_id=EOS):
    drafter = ScriptDrafter(draft, len(PROMPT), drafter_end_id)
    verifier = ScriptVerifier(target, len(PROMPT), max_draft_len)
    request = GenerationRequest(max_tokens=max_tokens, num_draft_tokens=k, end_id=end_id, stop_sequences=stops)
    return run(PROMPT, drafter, verifier, request), drafter, verifier


# --- greedy speculative == greedy target-only --------------------------------------------------


def greedy_reference(model: NGramModel, prompt, max_tokens, end_id):
    """Plain greedy decoding, written independently of the loop."""
    seq, out = list(prompt), []
    while len(out) < max_tokens:
        t = int(np.argmax(model.logits(seq)))
        if t == end_id:
            return out, "eos"
        out.append(t)
        seq.append(t)
    return out, "length"


@pytest.mark.parametrize("k", [1, 2, 4, 8])
@pytest.mark.parametrize("drafter_kind", ["perfect", "partial", "unrelated"])
def test_greedy_speculative_equals_greedy_target_only(k, drafter_kind):
    target = random_model(V, order=2, scale=2.0, seed=1)
    other = random_model(V, order=2, scale=2.0, seed=2)
    table = {"perfect": target.table, "partial": target.table + 0.9 * other.table, "unrelated": other.table}
    drafter = ToyDrafter(NGramModel(table[drafter_kind]), end_id=EOS)
    prompts = [list(p) for p in np.random.default_rng(0).integers(0, EOS, size=(25, 3))]
    for prompt in prompts:
        request = GenerationRequest(max_tokens=30, num_draft_tokens=k, end_id=EOS)
        result = run(prompt, drafter, ToyVerifier(target, max_draft_len=8), request)
        assert (result.tokens, result.finish_reason) == greedy_reference(target, prompt, 30, EOS)
        baseline = run(
            prompt, drafter, ToyVerifier(target), GenerationRequest(max_tokens=30, num_draft_tokens=0, end_id=EOS)
        )
        assert baseline.tokens == result.tokens
        if drafter_kind == "perfect":
            assert result.stats.acceptance_rate == 1.0


def test_k0_never_calls_the_drafter_and_is_one_token_per_step():
    target = random_model(V, seed=1)
    drafter = ToyDrafter(target)
    request = GenerationRequest(max_tokens=9, num_draft_tokens=0)
    result = run(PROMPT, drafter, ToyVerifier(target), request)
    assert drafter.calls == 0
    assert result.stats.steps == 9 and result.stats.drafted == 0 and result.stats.mean_accepted_len == 1.0
    steps = list(generate(PROMPT, drafter, ToyVerifier(target), request))
    assert [s.draft_seconds for s in steps] == [0.0] * 9  # a plain step spent nothing drafting


# --- determinism --------------------------------------------------------------------------------


def sampled(seed, k=4, temperature=1.0, **kw):
    target = random_model(V, seed=1)
    drafter = NGramModel(target.table + random_model(V, seed=2).table)
    request = GenerationRequest(
        max_tokens=40, num_draft_tokens=k, sampling=SamplingParams(temperature=temperature, seed=seed, **kw)
    )
    return run(PROMPT, ToyDrafter(drafter), ToyVerifier(target), request)


def test_same_seed_same_output_and_stats():
    a, b = sampled(123), sampled(123)
    assert a.tokens == b.tokens
    assert a.stats.accepted == b.stats.accepted and a.stats.per_position_accepted == b.stats.per_position_accepted
    assert sampled(9, top_k=5, top_p=0.8).tokens == sampled(9, top_k=5, top_p=0.8).tokens


def test_different_seeds_differ_and_unseeded_requests_run():
    outputs = {tuple(sampled(s).tokens) for s in range(6)}
    assert len(outputs) > 1
    assert len(sampled(None).tokens) == 40
    # an unseeded request draws its seed anew: six of them do not all give one text (a fixed seed in its place would;
    # 40 tokens sampled at temperature 1 from 12, where six fixed seeds already give several texts)
    assert len({tuple(sampled(None).tokens) for _ in range(6)}) > 1


def test_derived_seeds_are_distinct_per_step_and_role_and_fit_64_bits():
    seeds = {derive_seed(42, step, role) for step in range(200) for role in (DRAFTER, VERIFIER)}
    assert len(seeds) == 400
    assert all(0 <= s < 2**63 for s in seeds)
    assert derive_seed(42, 3, VERIFIER) == derive_seed(42, 3, VERIFIER) != derive_seed(43, 3, VERIFIER)
    # All 63 bits carry the hash: the top one and the lowest one are each set in about half the seeds.
    assert 150 < sum(s >> 62 for s in seeds) < 250 and 150 < sum(s & 1 for s in seeds) < 250
    assert 150 < sum(s >> 32 & 1 for s in seeds) < 250  # the first word's lowest bit lands at bit 32, not 33


def test_the_seed_derivation_is_the_documented_one():
    """A seeded request's text depends on each call's derived seed, on every path (in process, the BLS, the draft's
    child): the derivation is derive_seed's docstring, SeedSequence([seed, step, role]) read as two 32-bit words,
    the first the high one, cut to 63 bits. Changing it changes every seeded output, which is a release note."""
    for seed, step, role in [(0, 0, DRAFTER), (42, 3, VERIFIER), (2**40 + 7, 1000, DRAFTER)]:
        words = np.random.SeedSequence([seed, step, role]).generate_state(2, np.uint32).astype(">u4")
        assert derive_seed(seed, step, role) == int(words.view(">u8")[0]) % 2**63


def test_each_call_gets_its_derived_seed_and_greedy_passes_sampling_through():
    seen = []

    class Recording(ToyVerifier):
        def verify(self, tokens, draft, sampling):
            seen.append(sampling)
            return super().verify(tokens, draft, sampling)

    target = random_model(V, seed=1)
    request = GenerationRequest(max_tokens=6, num_draft_tokens=0, sampling=SamplingParams(temperature=0.9, seed=5))
    run(PROMPT, ToyDrafter(target), Recording(target), request)
    assert [s.seed for s in seen] == [derive_seed(5, i, VERIFIER) for i in range(6)]
    assert all(s.temperature == 0.9 for s in seen)
    seen.clear()
    run(PROMPT, ToyDrafter(target), Recording(target), GenerationRequest(max_tokens=3, num_draft_tokens=0))
    assert all(s == SamplingParams() for s in seen)


# --- EOS ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("drafter_stops_at_eos", [True, False])
def test_eos_inside_the_draft_ends_at_once_and_is_not_emitted(drafter_stops_at_eos):
    script = [5, 6, EOS, 7, 8, 9]
    result, drafter, verifier = script_run(script, script, k=4, drafter_end_id=EOS if drafter_stops_at_eos else None)
    assert result.tokens == [5, 6]
    assert result.finish_reason == "eos"
    assert len(verifier.calls) == 1  # no wasted round after EOS


def test_eos_as_bonus_token():
    result, _, verifier = script_run([5, 6, EOS, 1], [5, 6, 1, 1], k=2)
    assert verifier.calls == [[5, 6]]
    assert (result.tokens, result.finish_reason) == ([5, 6], "eos")
    assert result.stats.accepted == 2 and result.stats.mean_accepted_len == 3.0


def test_eos_as_recovered_token():
    result, _, _ = script_run([5, EOS, 1, 1], [5, 9, 1, 1], k=3)
    assert (result.tokens, result.finish_reason) == ([5], "eos")


def test_without_end_id_eos_is_an_ordinary_token():
    result, _, _ = script_run([5, EOS, 1, 2], [5, EOS, 1, 2], k=3, max_tokens=4, end_id=None, drafter_end_id=None)
    assert (result.tokens, result.finish_reason) == ([5, EOS, 1, 2], "length")


# --- stop sequences -----------------------------------------------------------------------------


def test_stop_sequence_spanning_two_steps():
    script = [1, 2, 3, 4, 5, 6, 7, 8]
    steps = list(
        generate(
            PROMPT,
            ScriptDrafter(script, 2),
            ScriptVerifier(script, 2),
            GenerationRequest(max_tokens=50, num_draft_tokens=2, stop_sequences=[[9, 9], [3, 4]]),
        )
    )
    assert [s.tokens for s in steps] == [[1, 2, 3], [4]]  # step 2 verified [4, 5, 6] but stops after 4
    assert steps[-1].finish_reason == "stop" and steps[0].finish_reason is None


def test_stop_sequence_earliest_match_wins_and_prompt_is_not_matched():
    script = [7, 1, 2, 3, 4]  # PROMPT ends with 7: [7, 7] only matches if the prompt counted
    result, _, _ = script_run(script, script, k=4, stops=[[7, 7], [2, 3, 4], [1, 2]])
    assert (result.tokens, result.finish_reason) == ([7, 1, 2], "stop")


def test_a_stop_sequence_that_is_the_whole_output_so_far_stops():
    script = [1, 2, 3, 4, 5, 6, 7, 8]
    result, _, _ = script_run(script, script, k=4, stops=[[1, 2]])
    assert (result.tokens, result.finish_reason) == ([1, 2], "stop")
    result, _, _ = script_run(script, script, k=0, stops=[[1]])
    assert (result.tokens, result.finish_reason) == ([1], "stop")


def test_stop_on_the_last_budget_token_reports_stop():
    script = [1, 2, 3, 4]
    result, _, _ = script_run(script, script, k=4, max_tokens=3, stops=[[2, 3]])
    assert (result.tokens, result.finish_reason) == ([1, 2, 3], "stop")


# --- budget and K clamping ----------------------------------------------------------------------


@pytest.mark.parametrize("max_tokens", [1, 2, 5, 7, 13])
@pytest.mark.parametrize("k", [1, 3, 4])
def test_exactly_max_tokens_and_k_clamped_to_the_remaining_budget(max_tokens, k):
    script = list(range(1, 11)) * 3
    result, drafter, verifier = script_run(script, script, k=k, max_tokens=max_tokens)
    assert result.tokens == script[:max_tokens] and result.finish_reason == "length"
    produced = 0
    for asked, draft in zip(drafter.asked, [c for c in verifier.calls if c]):
        assert asked <= max_tokens - produced - 1
        produced += len(draft) + 1
    assert sum(len(c) + 1 for c in verifier.calls) == max_tokens  # perfect drafter: nothing wasted


def test_k_is_resolved_before_the_loop_which_refuses_one_above_max_draft_len():
    """K is resolved once (draft_len.resolve_k, through decode.request.RequestRules): the loop takes it as given and
    refuses a K its verifier cannot take instead of clamping it a second time."""
    script = list(range(1, 11)) * 3
    with pytest.raises(GenerationError, match="num_draft_tokens = 8 exceeds the verifier's max_draft_len = 3"):
        script_run(script, script, k=8, max_tokens=20, max_draft_len=3)
    result, drafter, verifier = script_run(script, script, k=resolve_k(8, 3).k, max_tokens=20, max_draft_len=3)
    assert max(drafter.asked) == 3
    assert all(len(c) <= 3 for c in verifier.calls)
    assert result.tokens == script[:20]
    assert result.stats.per_position_drafted[0] == len(drafter.asked) and len(result.stats.per_position_drafted) == 3


def test_max_draft_len_zero_means_plain_decoding():
    script = [1, 2, 3, 4]
    result, drafter, _ = script_run(script, script, k=resolve_k(4, 0).k, max_tokens=4, max_draft_len=0)
    assert drafter.asked == [] and result.tokens == script


# --- streaming steps and stats ------------------------------------------------------------------


def test_steps_stream_the_result_and_carry_stats_on_the_last_step():
    target = random_model(V, seed=1)
    drafter = NGramModel(target.table + random_model(V, seed=3).table)
    request = GenerationRequest(max_tokens=25, num_draft_tokens=3, sampling=SamplingParams(temperature=1.0, seed=1))
    steps = list(generate(PROMPT, ToyDrafter(drafter), ToyVerifier(target), request))
    result = run(PROMPT, ToyDrafter(drafter), ToyVerifier(target), request)
    assert [t for s in steps for t in s.tokens] == result.tokens
    assert all(s.stats is None and s.finish_reason is None for s in steps[:-1])
    final = steps[-1].stats
    assert final.steps == len(steps) == [s.index for s in steps][-1] + 1
    assert final.accepted == sum(s.accepted for s in steps) and final.drafted == sum(s.drafted for s in steps)
    assert final.draft_seconds > 0 and final.target_seconds > 0
    assert result.to_dict()["stats"]["steps"] == final.steps


def test_scripted_stats_are_exact():
    target = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    draft = [1, 2, 9, 9, 5, 6, 7, 8, 9, 10]  # drafts by position: the draft's token n follows n outputs
    result, _, verifier = script_run(target, draft, k=3, max_tokens=10)
    # [1, 2 | 9 -> 3], [9 -> 4], [5, 6, 7 | bonus 8], budget 2 -> k = 1: [9 | bonus 10]
    assert verifier.calls == [[1, 2, 9], [9, 5, 6], [5, 6, 7], [9]]
    s = result.stats
    assert (s.steps, s.drafted, s.accepted) == (4, 10, 6)
    assert s.per_position_drafted == [4, 3, 3] and s.per_position_accepted == [3, 2, 1]
    assert s.acceptance_rate == pytest.approx(0.6)
    assert s.mean_accepted_len == pytest.approx(10 / 4)
    assert result.tokens == target


# --- contract violations and bad requests -------------------------------------------------------


def test_drafter_returning_too_many_tokens_is_an_error():
    class Greedy(ScriptDrafter):
        def propose(self, tokens, k, sampling):
            return Draft([1] * (k + 1))

    with pytest.raises(GenerationError, match=r"the drafter returned \[1, 1, 1\] for k = 2"):
        run(PROMPT, Greedy([], 2), ScriptVerifier([1] * 9, 2), GenerationRequest(max_tokens=5, num_draft_tokens=2))


def test_drafter_returning_a_distribution_per_token_too_many_or_a_negative_id_is_an_error():
    class ExtraRow(ScriptDrafter):
        def propose(self, tokens, k, sampling):
            return Draft([1, 2], np.full((3, V), 1.0 / V))  # 3 distributions for 2 tokens

    class Negative(ScriptDrafter):
        def propose(self, tokens, k, sampling):
            return Draft([1, -1])

    request = GenerationRequest(max_tokens=5, num_draft_tokens=2)
    with pytest.raises(GenerationError, match=r"returned probs of shape \(3, 12\) for 2 tokens"):
        run(PROMPT, ExtraRow([], 2), ScriptVerifier([1] * 9, 2), request)
    with pytest.raises(
        GenerationError, match=r": it must return one distribution per drafted token \(\[k, vocab\]\) or None\.$"
    ):
        run(PROMPT, ExtraRow([], 2), ScriptVerifier([1] * 9, 2), request)
    with pytest.raises(GenerationError, match=r"the drafter returned \[1, -1\] for k = 2"):
        run(PROMPT, Negative([], 2), ScriptVerifier([1] * 9, 2), request)


@pytest.mark.parametrize(
    "verification",
    [
        Verification(2, [1, 2]),
        Verification(1, [4, 2]),
        Verification(3, [1, 2, 3, 4, 5]),
        Verification(0, []),
        Verification(0, [-1]),  # a negative id (a padded -1 left in) is not a token
    ],
)
def test_verifier_breaking_the_contract_is_an_error(verification):
    class Broken:
        max_draft_len = 4

        def verify(self, tokens, draft, sampling):
            return verification

    with pytest.raises(
        GenerationError, match=r"accepted draft prefix plus exactly one token \(include end_id as that "
    ):
        run(PROMPT, ScriptDrafter([1, 2, 3, 4], 2), Broken(), GenerationRequest(max_tokens=9, num_draft_tokens=4))
    with pytest.raises(GenerationError, match=r"token \(include end_id as that token when the target ends\)\.$"):
        run(PROMPT, ScriptDrafter([1, 2, 3, 4], 2), Broken(), GenerationRequest(max_tokens=9, num_draft_tokens=4))


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"max_tokens": 0}, r"max_tokens = 0 is invalid: ask for at least 1 token\."),
        ({"max_tokens": 5, "num_draft_tokens": -1}, r"num_draft_tokens = -1 is invalid"),
        ({"max_tokens": 5, "end_id": -2}, r"end_id = -2 is invalid"),
        ({"max_tokens": 5, "stop_sequences": [[]]}, r"stop sequence \[\] is invalid"),
        ({"max_tokens": 5, "stop_sequences": ["stop"]}, r"stop sequence 'stop' is invalid"),
        ({"max_tokens": 5, "sampling": SamplingParams(temperature=1.0, top_p=2.0)}, r"top_p = 2.0 is invalid"),
        ({"max_tokens": 5, "cost_ratio": -1.0}, r"cost_ratio = -1.0 is invalid"),
    ],
)
def test_invalid_requests_raise_request_error(kwargs, message):
    with pytest.raises(RequestError, match=message):
        run(PROMPT, ScriptDrafter([], 2), ScriptVerifier([1] * 9, 2), GenerationRequest(**kwargs))


def test_empty_prompt_and_bad_max_draft_len():
    with pytest.raises(RequestError, match="give at least one token id"):
        run([], ScriptDrafter([], 0), ScriptVerifier([1], 0), GenerationRequest(max_tokens=1))
    verifier = ScriptVerifier([1], 2, max_draft_len=-1)
    with pytest.raises(GenerationError, match=r"verifier.max_draft_len = -1 is invalid"):
        run(PROMPT, ScriptDrafter([], 2), verifier, GenerationRequest(max_tokens=1))


def test_generate_validates_at_the_call_not_at_the_first_step():
    with pytest.raises(RequestError, match="max_tokens = 0"):
        generate(PROMPT, ScriptDrafter([], 2), ScriptVerifier([1], 2), GenerationRequest(max_tokens=0))


def test_numpy_prompt_and_numpy_token_ids_come_out_as_python_ints():
    class NumpyVerifier(ScriptVerifier):
        def verify(self, tokens, draft, sampling):
            v = super().verify(tokens, draft, sampling)
            return Verification(np.int64(v.accepted), list(np.array(v.tokens, dtype=np.int32)))

    script = [1, 2, 3, 4, 5]
    request = GenerationRequest(max_tokens=5, num_draft_tokens=2, stop_sequences=[[4, 5]])
    result = run(np.array(PROMPT, dtype=np.int32), ScriptDrafter(script, 2), NumpyVerifier(script, 2), request)
    assert result.tokens == script and result.finish_reason == "stop"
    assert all(type(t) is int for t in result.tokens)


def test_seeded_adaptive_sampling_ignores_wall_clock(monkeypatch):
    """Same seed -> same text even when step timings differ (adaptive K must not read the clock)."""
    from toy_model import ToyDrafter, ToyVerifier, random_model

    from specbuild.speculative import loop as loop_module
    from specbuild.speculative.interfaces import SamplingParams

    target, draft = random_model(12, seed=1), random_model(12, seed=2)
    request = loop_module.GenerationRequest(
        max_tokens=40, num_draft_tokens=4, adaptive=True, sampling=SamplingParams(temperature=1.0, seed=7)
    )
    clock = iter(range(10**6))
    monkeypatch.setattr(loop_module.time, "perf_counter", lambda: float(next(clock)) ** 1.5)
    first = loop_module.run([1, 2], ToyDrafter(draft), ToyVerifier(target, max_draft_len=4), request).tokens
    monkeypatch.setattr(loop_module.time, "perf_counter", lambda: float(next(clock)) * 0.001)
    second = loop_module.run([1, 2], ToyDrafter(draft), ToyVerifier(target, max_draft_len=4), request).tokens
    assert first == second


def test_any_of_several_end_ids_ends_the_request_and_is_not_emitted():
    """A checkpoint may list several end ids (Llama 3.x instruct: three): each ends the request as end_id does, at
    any position of a step, and K does not change where."""
    target = [1, 2, 9, 4, 5, 6, 7, 8]  # 9 is an end id other than EOS
    for k in (0, 1, 3, 5):
        drafter = ScriptDrafter(target, len(PROMPT), EOS)
        request = GenerationRequest(max_tokens=20, num_draft_tokens=k, end_id=EOS, other_end_ids=(9,))
        result = run(PROMPT, drafter, ScriptVerifier(target, len(PROMPT)), request)
        assert result.tokens == [1, 2] and result.finish_reason == "eos", k
    with pytest.raises(RequestError, match="end_id = -3 is invalid"):
        GenerationRequest(max_tokens=2, end_id=EOS, other_end_ids=(-3,)).validate()


def test_run_returns_a_plain_result_and_passes_its_controller_and_guide_on():
    """run(): the tokens, the finish reason and the stats as one dict (the CLI's --json); the controller it is given is
    the one the loop updates (the request's own would be a fresh one); a guide reaches generate, which refuses a
    verifier that cannot step banning tokens."""
    from specbuild.speculative.adaptive import AdaptiveK

    script = [1, 2, 3, 4, 5, 6]
    request = GenerationRequest(max_tokens=6, num_draft_tokens=4, adaptive=True, cost_ratio=0.1)
    controller = AdaptiveK(4, cost_ratio=0.1)
    result = run(PROMPT, ScriptDrafter(script, 2), ScriptVerifier(script, 2), request, controller)
    assert result.to_dict() == {"tokens": script, "finish_reason": "length", "stats": result.stats.to_dict()}
    assert controller.alpha > 0.8  # its prior: every draft token was accepted
    with pytest.raises(GenerationError, match="a guided request needs a verifier that can step with banned tokens"):
        run(
            PROMPT, ScriptDrafter(script, 2), ScriptVerifier(script, 2), GenerationRequest(max_tokens=6), guide=object()
        )


def test_a_k0_request_neither_drafts_ahead_nor_times_itself_into_the_shared_schedule():
    """overlap = "auto" with K = 0: no early draft, and none of its steps reported to the deployment's AutoSchedule
    (plain steps would teach it a schedule they never ran)."""
    from specbuild.speculative.overlap import AutoSchedule

    script = [1, 2, 3, 4, 5, 6, 7, 8]
    schedule = AutoSchedule(segment=1)
    drafter = ScriptDrafter(script, 2)
    request = GenerationRequest(max_tokens=6, num_draft_tokens=0, overlap="auto")
    steps = list(generate(PROMPT, drafter, ScriptVerifier(script, 2), request, schedule=schedule))
    assert [t for s in steps for t in s.tokens] == script[:6] and drafter.asked == []
    assert schedule.figures()["segments"] == {"ahead": 0, "sequential": 0}
    k1 = GenerationRequest(max_tokens=6, num_draft_tokens=1, overlap="auto")  # the control: K > 0 reports
    list(generate(PROMPT, ScriptDrafter(script, 2), ScriptVerifier(script, 2), k1, schedule=schedule))
    assert sum(schedule.figures()["segments"].values()) > 0


class Controller:
    """What _k_after_a_hit asks of an adaptive-K controller: a copy, fed the hypothetical step, then its choice (the
    feeds each choice saw are kept on the class: the copy is another instance)."""

    seen: list = []

    def __init__(self, choice: int):
        self.choice, self.fed = choice, ()

    def update(self, *args):
        self.fed = (*self.fed, args)  # rebound, as AdaptiveK's fields are: the original keeps its own

    def choose(self) -> int:
        Controller.seen.append(self.fed)
        return self.choice


@pytest.mark.parametrize(("choice", "k_max", "max_tokens", "expected"), [(2, 4, 50, 2), (7, 4, 50, 4), (4, 4, 10, 3)])
def test_the_k_after_a_hit_is_the_controllers_choice_after_a_whole_accepted_draft(
    choice, k_max, max_tokens, expected, monkeypatch
):
    """Drafting ahead guesses the next step's K as if this step accepted its whole draft: the controller fed that
    (K drafted, K accepted, this draft's seconds; the target's time is not known yet) on a copy, its choice bounded by
    k_max and by the budget left after the draft and a bonus token (less one: the next step's own bonus)."""
    from specbuild.speculative.loop import _k_after_a_hit

    monkeypatch.setattr(Controller, "seen", [])
    controller = Controller(choice)
    request = GenerationRequest(max_tokens=max_tokens, num_draft_tokens=k_max)
    draft = Draft(tokens=[5, 6, 7])  # the output would be 5 tokens long: 2 + 3
    assert _k_after_a_hit([1, 2], draft, 0.25, request, [], k_max, controller) == expected
    assert Controller.seen == [((3, 3, 0.25),)] and controller.fed == ()  # the request's own controller untouched
    assert _k_after_a_hit([1, 2], draft, 0.25, request, [], k_max, None) == min(k_max, max_tokens - 7)


def test_a_loop_that_ends_without_a_finish_reason_is_an_error_not_a_short_answer(monkeypatch):
    """run() returns at the step that carries a finish reason; generate() always ends with one. A loop that stopped
    without one (a broken drafter path, say) must not pass for a complete answer."""
    from specbuild.speculative import loop
    from specbuild.speculative.loop import Step

    monkeypatch.setattr(loop, "generate", lambda *args, **kwargs: iter([Step(0, [5], 0, 0, 0, 0.0, 0.0)]))
    with pytest.raises(GenerationError, match="^the draft/verify loop ended without a finish reason$"):
        run([1], drafter=None, verifier=None, request=GenerationRequest(max_tokens=4))  # generate() is the fake


class FixedK:
    """An adaptive-K controller that always chooses `k` (AdaptiveK's interface: update, then choose)."""

    def __init__(self, k: int):
        self.k = k

    def update(self, *args):
        pass

    def choose(self) -> int:
        return self.k


@pytest.mark.parametrize("overlap", [False, True])
def test_an_adaptive_k_is_followed_bounded_by_the_requests_k_and_drafted_ahead_with(overlap):
    """The loop's K is the controller's choice, never above the request's num_draft_tokens; drafting ahead guesses
    the next step's K from the same controller, so a perfect drafter's early drafts all hit at a K below the
    request's."""
    target = random_model(V, seed=1)
    request = GenerationRequest(max_tokens=30, num_draft_tokens=4, adaptive=True, overlap=overlap)
    for choice, k in ((2, 2), (6, 4)):
        steps = list(generate(PROMPT, ToyDrafter(target), ToyVerifier(target), request, controller=FixedK(choice)))
        assert {s.k for s in steps[:-1]} == {k}  # the last step's K may be cut by the budget
        if overlap:
            assert steps[-1].stats.early_draft_hits == len(steps) - 1


class Reports:
    """A drafter and verifier (the toy's) whose answers report the seconds given (0.0: none, so the loop times the
    call)."""

    def __init__(self, model, draft_seconds: float, target_seconds: float):
        self.drafter, self.verifier = ToyDrafter(model), ToyVerifier(model)
        self.draft_seconds, self.target_seconds = draft_seconds, target_seconds
        self.max_draft_len = self.verifier.max_draft_len

    def propose(self, tokens, k, sampling):
        draft = self.drafter.propose(tokens, k, sampling)
        draft.seconds = self.draft_seconds
        return draft

    def verify(self, tokens, draft, sampling):
        verification = self.verifier.verify(tokens, draft, sampling)
        verification.seconds = self.target_seconds
        return verification


class Recording(FixedK):
    """FixedK that keeps what each step fed it."""

    def __init__(self, k: int):
        super().__init__(k)
        self.fed = []

    def update(self, *args):
        self.fed.append(args)


@pytest.mark.parametrize(("reported", "timed"), [((60.0, 30.0), (60.0, 30.0)), ((0.0, 0.0), (0.5, 0.5))])
def test_a_calls_time_is_what_the_model_reports_else_what_the_loop_measured(reported, timed, monkeypatch):
    """A model that times its own call (the engine's figure, or a process's) is believed; one that says nothing
    is timed around the call. The clock here is the test's: each reading is 0.5 s after the last. The adaptive
    controller is fed each step's counts and both times."""
    from types import SimpleNamespace

    from specbuild.speculative import loop

    clock = iter(0.5 * n for n in range(10_000))
    monkeypatch.setattr(loop, "time", SimpleNamespace(perf_counter=lambda: next(clock)))
    both = Reports(random_model(V, seed=1), *reported)
    controller = Recording(3)
    request = GenerationRequest(max_tokens=12, num_draft_tokens=3, adaptive=True)
    steps = list(generate(PROMPT, both, both, request, controller=controller))
    assert {(s.draft_seconds, s.target_seconds) for s in steps} == {timed}
    assert controller.fed == [(s.drafted, s.accepted, *timed) for s in steps]


def test_steps_are_counted_by_drafter_a_duck_typed_draft_as_the_draft_models_and_plain_steps_by_none():
    """The Drafter protocol asks for tokens, probs and seconds: a draft without `source` is a draft model's."""
    from types import SimpleNamespace

    target = random_model(V, seed=1)

    class Duck:
        def __init__(self):
            self.inner = ToyDrafter(target)

        def propose(self, tokens, k, sampling):
            draft = self.inner.propose(tokens, k, sampling)
            return SimpleNamespace(tokens=draft.tokens, probs=draft.probs, seconds=draft.seconds)

    drafted = run(PROMPT, Duck(), ToyVerifier(target), GenerationRequest(max_tokens=12, num_draft_tokens=3))
    assert set(drafted.stats.by_drafter) == {"model"}
    assert drafted.stats.by_drafter["model"]["steps"] == drafted.stats.steps and drafted.stats.fallback_steps == 0
    plain = run(PROMPT, Duck(), ToyVerifier(target), GenerationRequest(max_tokens=12, num_draft_tokens=0))
    assert plain.stats.by_drafter == {} and plain.stats.steps == 12
    one = run(PROMPT, Duck(), ToyVerifier(target), GenerationRequest(max_tokens=12, num_draft_tokens=1))
    assert one.stats.by_drafter["model"]["steps"] == one.stats.steps  # K = 1 drafts too


def test_token_id_0_is_a_valid_end_id():
    """Some vocabularies put their end token at id 0; only negative ids are refused."""
    GenerationRequest(max_tokens=4, end_id=0, other_end_ids=(0,)).validate()
    with pytest.raises(RequestError, match="end_id = -1 is invalid"):
        GenerationRequest(max_tokens=4, other_end_ids=(-1,)).validate()


def test_a_request_at_the_edges_of_its_rules():
    """Token id 0 may open a stop sequence, a cost ratio of 0 means a free draft; a token that is no integer, though
    not negative, is refused."""
    GenerationRequest(max_tokens=4, stop_sequences=[[0, 3]], cost_ratio=0.0).validate()
    with pytest.raises(RequestError, match=r"stop sequence \[1\.5\] is invalid"):
        GenerationRequest(max_tokens=4, stop_sequences=[[1.5]]).validate()


def test_generate_refuses_a_bad_call_before_the_first_step_with_the_exact_reason():
    target = random_model(V, seed=1)
    drafter, verifier = ToyDrafter(target), ToyVerifier(target, max_draft_len=2)
    with pytest.raises(RequestError, match=r"^prompt_ids = \[0, 1, 2, 3, 4, 5, 6, 1\.5\] is invalid: give at least"):
        run([0, 1, 2, 3, 4, 5, 6, 1.5, 8, 9], drafter, verifier, GenerationRequest(max_tokens=2))  # the first 8 shown
    with pytest.raises(
        GenerationError, match=r"^verifier\.max_draft_len = None is invalid: it must be an integer >= 0\.$"
    ):
        run([1], drafter, object(), GenerationRequest(max_tokens=2))
    expected = (
        r"^num_draft_tokens = 3 exceeds the verifier's max_draft_len = 2: resolve K first "
        r"\(decode\.request\.RequestRules, or speculative\.draft_len\.resolve_k\)\.$"
    )
    with pytest.raises(GenerationError, match=expected):
        run([1], drafter, verifier, GenerationRequest(max_tokens=2, num_draft_tokens=3))
    with pytest.raises(
        GenerationError,
        match=r"^a guided request needs a verifier that can step with banned tokens \(step_banning\)\.$",
    ):
        run([1], drafter, verifier, GenerationRequest(max_tokens=2, num_draft_tokens=1), guide=object())


@pytest.mark.parametrize(
    ("sampling", "cost_ratio", "expected"),
    [
        (SamplingParams(temperature=0.8, seed=5), None, "seeded"),  # K must not follow wall-clock timings
        (SamplingParams(temperature=0.8, seed=5), 0.1, 0.1),  # the request's own ratio wins
        (SamplingParams(temperature=0.8), None, None),  # unseeded: measured
        (SamplingParams(seed=5), None, None),  # greedy text never depends on K: measured
    ],
)
def test_an_adaptive_requests_cost_ratio_is_fixed_only_for_seeded_sampling(sampling, cost_ratio, expected, monkeypatch):
    from specbuild.speculative import loop

    made = []
    monkeypatch.setattr(loop, "AdaptiveK", lambda k_max, cost_ratio=None: made.append(cost_ratio) or FixedK(k_max))
    target = random_model(V, seed=1)
    request = GenerationRequest(
        max_tokens=3, num_draft_tokens=2, sampling=sampling, adaptive=True, cost_ratio=cost_ratio
    )
    run(PROMPT, ToyDrafter(target), ToyVerifier(target), request)
    assert made == [loop.SEEDED_COST_RATIO if expected == "seeded" else expected]


def test_a_deployments_schedule_is_used_only_by_auto():
    """The BLS hands every request its deployment's AutoSchedule; `overlap = True` drafts ahead on every step and never
    reads it (a schedule that cannot be read would fail the request here)."""
    target = random_model(V, seed=1)
    request = GenerationRequest(max_tokens=12, num_draft_tokens=3, overlap=True)
    steps = list(generate(PROMPT, ToyDrafter(target), ToyVerifier(target), request, schedule=object()))
    assert steps[-1].stats.early_drafts > 0  # drafted ahead, on no schedule


class ChoosesPerStep(ToyDrafter):
    """A drafter that, as the hybrid, names the drafter of its early drafts and is told of each one taken."""

    def __init__(self, model, early_drafter):
        super().__init__(model)
        self.early_drafter, self.adopted = early_drafter, []

    def adopt(self, tokens, draft):
        self.adopted.append((list(tokens), list(draft.tokens)))


class Threads(ToyDrafter):
    """Records the thread of each call."""

    def __init__(self, model):
        super().__init__(model)
        self.threads = []

    def propose(self, tokens, k, sampling):
        self.threads.append(threading.get_ident())
        return super().propose(tokens, k, sampling)


def test_a_drafter_that_names_its_early_drafter_drafts_ahead_with_it_and_is_told_of_each_hit():
    model = NGramModel(random_model(12, order=2, scale=2.0, seed=1).table)
    early = Threads(model)
    drafter = ChoosesPerStep(model, early)
    prompt = [1, 2]
    steps = list(
        generate(
            prompt, drafter, ToyVerifier(model), GenerationRequest(max_tokens=24, num_draft_tokens=2, overlap=True)
        )
    )
    hits = [step for step in steps if step.early_hit]
    assert hits and early.threads and threading.get_ident() not in early.threads  # the early drafter, on the worker
    assert drafter.calls == len(steps) - len(hits) - sum(step.k == 0 for step in steps)
    output, contexts = [], {}
    for step in steps:
        contexts[step.index] = prompt + output
        output += step.tokens
    assert drafter.adopted == [(contexts[step.index], drafter.adopted[i][1]) for i, step in enumerate(hits)]
    assert [len(tokens) for _, tokens in drafter.adopted] == [step.drafted for step in hits]
