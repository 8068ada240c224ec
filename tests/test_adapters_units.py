"""The contract adapters (specbuild.contract.adapters) over fake model calls: what ContractDrafter and
ContractVerifier send (every tensor, its dtype, greedy against sampling steps, the banning step) and how they read
an answer (accepted prefix plus one token, end_id, the target's own acceptance figure cross-checked, answers that
break the contract refused with the model named). The same adapters run the example pair's real engines in
tests/test_runtime_speculative.py; here each rule runs in milliseconds, which is what the mutation run of
contract/adapters.py uses (scripts/mutation.py)."""

from __future__ import annotations

import time

import numpy as np
import pytest

from specbuild.contract.adapters import ContractDraft, ContractDrafter, ContractVerifier
from specbuild.contract.tensors import LLM_INPUTS, NUMPY_DTYPES
from specbuild.errors import GenerationError
from specbuild.speculative.interfaces import Draft, SamplingParams


def test_greedy_steps_send_tensorrt_llms_greedy_and_sampling_steps_send_all_three():
    call, seen = fake_model([5, 6], accepted=1)
    ContractDrafter(call, end_id=2).propose([1, 3], 2, SamplingParams())
    ContractVerifier(call, max_draft_len=4, end_id=2).verify([1, 3], Draft(tokens=[5]), SamplingParams(temperature=0.0))
    for request in seen:
        assert request["runtime_top_k"].tolist() == [1] and request["runtime_top_k"].dtype == np.int32
        assert not {"temperature", "runtime_top_p", "seed"} & set(request)
    call, seen = fake_model([5, 6])
    ContractDrafter(call, end_id=2, use_logits=False).propose([1, 3], 2, SamplingParams(temperature=0.8, seed=4))
    assert {
        k: v.tolist() for k, v in seen[0].items() if k in ("temperature", "runtime_top_k", "runtime_top_p", "seed")
    } == {"temperature": [pytest.approx(0.8)], "runtime_top_k": [0], "runtime_top_p": [1.0], "seed": [4]}


def test_verifier_sends_draft_logits_in_the_declared_dtype():
    call, seen = fake_model([5, 6], accepted=1)
    draft = ContractDraft(tokens=[5], logits=np.zeros((1, 10), np.float32))
    ContractVerifier(call, max_draft_len=4, end_id=2, logits_dtype="float16").verify([1], draft, SamplingParams(1.0))
    assert seen[0]["draft_logits"].dtype == np.float16 and seen[0]["draft_logits"].shape == (1, 10)


def fake_model(new_tokens, accepted=None):
    """A `call` that answers with the request's input followed by new_tokens, and with `accepted` as its
    total_accepted_draft_tokens when the request asks for the acceptance outputs (return_perf_metrics)."""
    seen = []

    def call(request):
        seen.append(request)
        ids = request["input_ids"].tolist() + list(new_tokens)
        response = {"output_ids": np.array([ids], np.int32), "sequence_length": np.array([len(ids)], np.int32)}
        asked = request.get("return_perf_metrics")
        if accepted is not None and asked is not None and asked[0]:
            response["total_accepted_draft_tokens"] = np.array([accepted], np.int32)
        return response

    return call, seen


def test_verifier_maps_responses_to_accepted_plus_one_token():
    draft = Draft(tokens=[5, 6, 7])
    greedy = SamplingParams()
    cases = [  # new tokens, the target's total_accepted_draft_tokens, then what the loop gets
        ([5, 6, 7, 8], 3, 3, [5, 6, 7, 8]),  # all accepted + bonus
        ([5, 9], 1, 1, [5, 9]),  # rejected at position 1, recovered 9
        ([5, 6], 2, 2, [5, 6, 2]),  # only accepted tokens came back: stopped at end_id (left out)
        ([], 0, 0, [2]),  # end_id right away
        ([5, 2], 1, 1, [5, 2]),  # a model that keeps end_id in output_ids
    ]
    for new, reported, accepted, tokens in cases:
        call, seen = fake_model(new, accepted=reported)
        v = ContractVerifier(call, max_draft_len=4, end_id=2).verify([1, 4], draft, greedy)
        assert (v.accepted, v.tokens) == (accepted, tokens)
        assert seen[0]["draft_input_ids"].tolist() == [5, 6, 7] and seen[0]["return_perf_metrics"].tolist() == [True]
        assert seen[0]["request_output_len"].tolist() == [4] and seen[0]["input_ids"].dtype == np.int32


def test_an_end_id_accepted_from_the_draft_ends_the_step():
    """The target may count draft tokens accepted past an end_id that was itself a draft token: it stops there."""
    call, _ = fake_model([5], accepted=3)
    v = ContractVerifier(call, max_draft_len=4, end_id=2).verify([1], Draft(tokens=[5, 2, 7]), SamplingParams())
    assert (v.accepted, v.tokens) == (1, [5, 2])


@pytest.mark.parametrize(
    "new, reported, accepted, tokens",
    [
        ([5, 9], 2, 1, [5, 9]),  # says 2 accepted, but the second token differs from the draft
        ([5, 6, 7, 8], 2, 3, [5, 6, 7, 8]),  # says 2 accepted, but the whole draft and a bonus token came back
        ([5], 3, 1, [5, 2]),  # stopped, and the token after the last one back is not end_id: the figure overcounts
        ([5, 9], None, 1, [5, 9]),  # a model that ignores return_perf_metrics
    ],
)
def test_the_tokens_decide_the_acceptance_and_the_targets_own_figure_is_only_cross_checked(
    new, reported, accepted, tokens
):
    """A performance figure never fails a request: the accepted count comes from the tokens (as NVIDIA's BLS reads
    it), and a missing or different total_accepted_draft_tokens is reported for the log and the metrics."""
    call, _ = fake_model(new, accepted=reported)
    told = []
    verifier = ContractVerifier(call, max_draft_len=4, end_id=2, on_disagreement=told.append)
    v = verifier.verify([1], Draft(tokens=[5, 6, 7]), SamplingParams())
    assert (v.accepted, v.tokens) == (accepted, tokens)
    assert verifier.disagreements == 1 and len(told) == 1
    assert (
        "no total_accepted_draft_tokens" if reported is None else f"total_accepted_draft_tokens = {reported}"
    ) in told[0] and f"accept {accepted}: the tokens decide" in told[0]


def test_an_agreeing_figure_is_not_reported():
    call, _ = fake_model([5, 9], accepted=1)
    verifier = ContractVerifier(call, max_draft_len=4, end_id=2, on_disagreement=pytest.fail)
    assert verifier.verify([1], Draft(tokens=[5, 6]), SamplingParams()).accepted == 1 and verifier.disagreements == 0


def test_verifier_without_end_id_reports_a_short_answer():
    call, _ = fake_model([5], accepted=1)
    with pytest.raises(GenerationError, match=r"no end_id is known: pass end_id to ContractVerifier\.$"):
        ContractVerifier(call, max_draft_len=4).verify([1], Draft(tokens=[5, 6]), SamplingParams())


def test_verifier_refuses_an_answer_that_breaks_the_contract():
    call, _ = fake_model([9, 9, 9], accepted=0)  # three tokens after a rejection at position 0
    with pytest.raises(GenerationError, match="expected the accepted draft prefix plus one token"):
        ContractVerifier(call, max_draft_len=4, end_id=2).verify([1], Draft(tokens=[5, 6]), SamplingParams())


def test_drafter_sends_the_contract_tensors_and_reads_logits():
    sampling = SamplingParams(temperature=0.5, top_k=3, seed=7)
    logits = np.random.default_rng(0).normal(size=(2, 10)).astype(np.float32)

    def call(request):
        ids = request["input_ids"].tolist() + [4, 8]
        return {
            "output_ids": np.array([ids], np.int32),
            "sequence_length": np.array([len(ids)], np.int32),
            "generation_logits": logits[None],
        }

    calls = []
    draft = ContractDrafter(lambda r: calls.append(r) or call(r), end_id=2).propose([1, 3], 2, sampling)
    r = calls[0]
    assert r["request_output_len"].tolist() == [2] and r["return_generation_logits"].tolist() == [True]
    assert r["seed"].dtype == np.uint64 and r["seed"].tolist() == [7]
    assert r["runtime_top_k"].tolist() == [3] and r["temperature"].dtype == np.float32
    assert draft.tokens == [4, 8] and np.array_equal(draft.logits, logits) and draft.logits.dtype == np.float32
    assert draft.probs.shape == (2, 10) and np.allclose(draft.probs.sum(axis=1), 1.0)
    assert (draft.probs > 0).sum(axis=1).tolist() == [3, 3]  # top-k applied


def test_a_banning_step_sends_each_id_as_a_one_token_bad_word_and_reads_one_token():
    """step_banning (a guided request's constrained token): one plain step, bad_words_list [2, n] int32 (the ids, then
    each word's end offset), never draft tokens; the target's token, or end_id when it returned none."""
    call, seen = fake_model([7, 8])
    verifier = ContractVerifier(call, max_draft_len=4, end_id=2, pad_id=0)
    assert verifier.step_banning([1, 3], np.array([9, 4, 11]), SamplingParams()) == 7
    request = seen[0]
    assert request["bad_words_list"].dtype == np.int32 and request["bad_words_list"].tolist() == [[9, 4, 11], [1, 2, 3]]
    assert request["request_output_len"].tolist() == [1] and request["input_ids"].tolist() == [1, 3]
    assert request["end_id"].tolist() == [2] and request["pad_id"].tolist() == [0] and "draft_input_ids" not in request
    call, _ = fake_model([])
    assert ContractVerifier(call, max_draft_len=4, end_id=2).step_banning([1], np.array([5]), SamplingParams()) == 2
    with pytest.raises(GenerationError, match=r"^the target returned no token and no end_id is known: pass end_id to "):
        ContractVerifier(call, max_draft_len=4).step_banning([1], np.array([5]), SamplingParams())
    with pytest.raises(GenerationError, match=r"pass end_id to ContractVerifier\.$"):
        ContractVerifier(call, max_draft_len=4).step_banning([1], np.array([5]), SamplingParams())
    with pytest.raises(GenerationError, match=r"^the target model's response lacks usable"):
        ContractVerifier(lambda r: {}, max_draft_len=4, end_id=2).step_banning([1], np.array([5]), SamplingParams())


@pytest.mark.parametrize(
    "response, error",
    [
        ({"sequence_length": np.array([3], np.int32)}, "target model's response lacks usable output_ids"),
        ({"output_ids": np.array([[1, 3, 5]], np.int32)}, "lacks usable output_ids / sequence_length"),
        ({"output_ids": np.array([[1, 3, 5]]), "sequence_length": np.array([], np.int32)}, "lacks usable"),
        ({"output_ids": np.array([[1, 3, 5]]), "sequence_length": np.array([1])}, "sequence_length = 1 for a 2-token"),
        (
            {"output_ids": np.array([[1, 3, 5]]), "sequence_length": np.array([4])},
            r"input and 3 output ids: it must return the input followed by the new tokens \(exclude_input_in_output = "
            r"false\)\.$",
        ),
    ],
)
def test_a_response_without_usable_output_ids_is_a_generation_error(response, error):
    with pytest.raises(GenerationError, match=error):
        ContractVerifier(lambda request: response, max_draft_len=4, end_id=2).verify(
            [1, 3], Draft([]), SamplingParams()
        )


def tensors_of(request):
    """A request as {name: (dtype, values)}: what a test compares exactly."""
    return {name: (str(value.dtype), value.tolist()) for name, value in request.items()}


def test_every_request_carries_exactly_the_contracts_tensors_in_their_declared_types():
    """The drafter's and the verifier's requests, name by name with the dtypes NVIDIA's tensorrt_llm config declares
    (contract.tensors.LLM_INPUTS): int32 ids and lengths, end_id and pad_id when known, the sampling tensors."""
    call, seen = fake_model([5, 6], accepted=1)
    sampled = SamplingParams(temperature=0.5, top_k=3, top_p=0.9, seed=11)
    ContractDrafter(call, end_id=2, pad_id=0, use_logits=False).propose([1, 3], 2, sampled)
    ContractVerifier(call, max_draft_len=4, end_id=2, pad_id=0).verify([1, 3], Draft(tokens=[5, 7]), SamplingParams())
    common = {"input_ids": ("int32", [1, 3]), "input_lengths": ("int32", [2]), "end_id": ("int32", [2])}
    common["pad_id"] = ("int32", [0])
    assert tensors_of(seen[0]) == {
        **common,
        "request_output_len": ("int32", [2]),
        "temperature": ("float32", [0.5]),
        "runtime_top_k": ("int32", [3]),
        "runtime_top_p": ("float32", [pytest.approx(0.9)]),
        "seed": ("uint64", [11]),
        "return_generation_logits": ("bool", [False]),
    }
    assert tensors_of(seen[1]) == {
        **common,
        "request_output_len": ("int32", [3]),
        "runtime_top_k": ("int32", [1]),
        "draft_input_ids": ("int32", [5, 7]),
        "return_perf_metrics": ("bool", [True]),
    }
    declared = {t.name: NUMPY_DTYPES.get(t.dtype) for t in LLM_INPUTS}  # the types are the config's, not this test's
    assert all(str(value.dtype) == declared[name] for request in seen for name, value in request.items())
    call, seen = fake_model([5])  # neither id known: neither sent
    ContractDrafter(call).propose([1], 1, SamplingParams())
    ContractVerifier(call, max_draft_len=4).verify([1], Draft(tokens=[]), SamplingParams())
    assert not {"end_id", "pad_id"} & (set(seen[0]) | set(seen[1]))


def test_a_greedy_draft_has_no_distribution_and_its_logits_are_never_sent():
    """A greedy step needs no q: the drafter asks for no logits and returns none, and the verifier sends no
    draft_logits even when the draft carries them (the target's greedy acceptance compares tokens)."""
    call, seen = fake_model([5, 6], accepted=2)
    draft = ContractDrafter(call, end_id=2).propose([1], 2, SamplingParams())
    assert draft.logits is None and draft.probs is None and draft.tokens == [5, 6]
    with_logits = ContractDraft(tokens=[5, 6], logits=np.zeros((2, 10), np.float32))
    ContractVerifier(call, max_draft_len=4, end_id=2).verify([1], with_logits, SamplingParams())
    assert "draft_logits" not in seen[1]
    ContractVerifier(call, max_draft_len=4, end_id=2).verify([1], Draft(tokens=[5, 6]), SamplingParams(1.0, seed=3))
    assert "draft_logits" not in seen[2]  # a sampled draft from a drafter without logits (prompt lookup): none


def test_each_call_times_its_own_wait():
    """Draft.seconds and Verification.seconds: the wall time of the call, read from the same clock around it."""

    inner, _ = fake_model([5], accepted=1)

    def slow(request):
        time.sleep(0.02)
        return inner(request)

    # Holds on any machine, however slow or busy: each call's time lies inside this wall time, read from the same
    # monotonic clock around both calls, and sleep(0.02) never returns sooner.
    t0 = time.perf_counter()
    draft = ContractDrafter(slow, end_id=2).propose([1], 1, SamplingParams())
    verification = ContractVerifier(slow, max_draft_len=4, end_id=2).verify([1], draft, SamplingParams())
    wall = time.perf_counter() - t0
    assert 0.02 <= draft.seconds <= wall and 0.02 <= verification.seconds <= wall
    assert draft.seconds + verification.seconds <= wall


@pytest.mark.parametrize(
    "draft, new, expected",
    [
        pytest.param(
            [5, 2, 7], [5, 2], (1, [5, 2]), id="the draft's own end_id accepted and kept: the step ends there"
        ),
        pytest.param([5, 6, 7], [5, 2], (1, [5, 2]), id="the recovered token is end_id, kept"),
    ],
)
def test_a_model_that_keeps_end_id_in_its_output_ends_the_step_at_it(draft, new, expected):
    call, _ = fake_model(new)
    v = ContractVerifier(call, max_draft_len=4, end_id=2, on_disagreement=lambda said: None).verify(
        [1], Draft(tokens=draft), SamplingParams()
    )
    assert (v.accepted, v.tokens) == expected


@pytest.mark.parametrize("new", [[9, 9], [5, 9, 2], [5, 9, 9]])
def test_more_than_one_token_past_the_accepted_prefix_is_refused(new):
    call, _ = fake_model(new)
    with pytest.raises(GenerationError, match=r"\(TensorRT-LLM draft_tokens_external semantics\)\.$"):
        ContractVerifier(call, max_draft_len=4, end_id=2).verify([1], Draft(tokens=[5, 6]), SamplingParams())


def test_the_cross_check_counts_every_disagreement_and_never_fails_on_a_whole_accepted_draft():
    """Two disagreeing steps count two; a whole draft accepted, then stopped, with a figure above it is a
    disagreement (told), not an error; an end_id accepted from the draft with the target counting on past it agrees."""
    told = []
    call, _ = fake_model([5, 9], accepted=2)
    verifier = ContractVerifier(call, max_draft_len=4, end_id=2, on_disagreement=told.append)
    verifier.verify([1], Draft(tokens=[5, 6]), SamplingParams())
    verifier.verify([1], Draft(tokens=[5, 6]), SamplingParams())
    assert verifier.disagreements == 2 and told[0].startswith("the target sent total_accepted_draft_tokens = 2 for")
    assert told[0].endswith("but its tokens [5, 9] accept 1: the tokens decide")
    call, _ = fake_model([5, 6], accepted=3)
    whole = ContractVerifier(call, max_draft_len=4, end_id=2, on_disagreement=told.append)
    assert whole.verify([1], Draft(tokens=[5, 6]), SamplingParams()).tokens == [5, 6, 2] and whole.disagreements == 1
    call, _ = fake_model([5], accepted=None)
    missing = ContractVerifier(call, max_draft_len=4, end_id=2, on_disagreement=told.append)
    missing.verify([1], Draft(tokens=[5, 6]), SamplingParams())
    assert told[-1].startswith("the target sent no total_accepted_draft_tokens for draft [5, 6]")
    call, _ = fake_model([5], accepted=3)
    past_end = ContractVerifier(call, max_draft_len=4, end_id=2, on_disagreement=pytest.fail)
    assert past_end.verify([1], Draft(tokens=[5, 2, 7]), SamplingParams()).accepted == 1
    assert past_end.disagreements == 0


def test_a_draft_models_unusable_answer_names_the_draft():
    with pytest.raises(GenerationError, match=r"^the draft model's response lacks usable output_ids"):
        ContractDrafter(lambda request: {}, end_id=2).propose([1], 2, SamplingParams())
