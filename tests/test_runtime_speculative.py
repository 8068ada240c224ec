"""Exact greedy equality on the tiny example pair: speculative == target-only == Hugging Face generate.

The pair runs through the same path as `generate --local` and the Triton BLS: the draft/verify
loop -> ContractDrafter / ContractVerifier -> the tensorrt_llm tensor contract -> the reference
engine. Equality is exact (token for token); the batch-invariant forward (reference/model.py) is
what makes a k + 1-token verification see the same numbers as one-token steps.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch
from runtime_models import single_thread  # noqa: F401 (autouse fixture)

from specbuild.contract.adapters import ContractDraft, ContractDrafter, ContractVerifier
from specbuild.contract.tensors import LLM_INPUTS, NUMPY_DTYPES
from specbuild.errors import GenerationError
from specbuild.reference.contract_model import ContractModel, Limits
from specbuild.reference.engine import ReferenceEngine
from specbuild.reference.model import LlamaModel
from specbuild.speculative.interfaces import Draft, SamplingParams
from specbuild.speculative.loop import GenerationRequest, run

MAX_TOKENS = 24


def tiny_prompts(tokenizer, n_per_kind):
    from specbuild.corpus import heldout_prompts

    texts = [t for kind in ("code", "prose", "json") for t in heldout_prompts(kind, n_per_kind, chars=120)]
    return [tokenizer(t)["input_ids"] for t in texts]


@pytest.fixture(scope="module")
def pair(example_tiny):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(example_tiny.target), local_files_only=True)

    def build(use_cache=True, logits_dtype="float32"):
        target = ContractModel(
            ReferenceEngine(LlamaModel.from_folder(example_tiny.target), use_cache=use_cache),
            Limits(max_draft_len=8, logits_dtype=logits_dtype),
        )
        draft = ContractModel(
            ReferenceEngine(LlamaModel.from_folder(example_tiny.draft), use_cache=use_cache),
            Limits(logits_dtype=logits_dtype),
        )
        eos = tokenizer.eos_token_id
        return ContractDrafter(draft, end_id=eos), ContractVerifier(target, max_draft_len=8, end_id=eos)

    return tokenizer, build


def test_speculative_equals_target_only_for_60_prompts_and_k_1_2_4_8(pair):
    tokenizer, build = pair
    drafter, verifier = build()
    eos = tokenizer.eos_token_id
    cases = tiny_prompts(tokenizer, 20)
    assert len(cases) >= 50
    accepted = drafted = 0
    for ids in cases:
        baseline = run(ids, drafter, verifier, GenerationRequest(max_tokens=MAX_TOKENS, num_draft_tokens=0, end_id=eos))
        assert baseline.stats.drafted == 0
        for k in (1, 2, 4, 8):
            spec = run(ids, drafter, verifier, GenerationRequest(max_tokens=MAX_TOKENS, num_draft_tokens=k, end_id=eos))
            assert spec.tokens == baseline.tokens, f"K = {k} diverged for prompt {tokenizer.decode(ids)!r}"
            assert spec.finish_reason == baseline.finish_reason
            accepted, drafted = accepted + spec.stats.accepted, drafted + spec.stats.drafted
    assert 0 < accepted < drafted  # real speculation: some drafts accepted, some rejected


def test_caches_off_gives_the_same_output(pair):
    tokenizer, build = pair
    eos = tokenizer.eos_token_id
    cached, uncached = build(True), build(False)
    for ids in tiny_prompts(tokenizer, 2):
        for k in (0, 3):
            request = GenerationRequest(max_tokens=16, num_draft_tokens=k, end_id=eos)
            assert run(ids, *cached, request).tokens == run(ids, *uncached, request).tokens


def test_sampling_is_reproducible_with_a_seed(pair):
    tokenizer, build = pair
    ids = tiny_prompts(tokenizer, 1)[0]
    drafter, verifier = build()
    drafter.use_logits = True
    request = GenerationRequest(
        max_tokens=20,
        num_draft_tokens=3,
        end_id=tokenizer.eos_token_id,
        sampling=SamplingParams(temperature=0.9, top_p=0.95, seed=11),
    )
    first, second = run(ids, drafter, verifier, request), run(ids, *build(), request)
    assert first.tokens == second.tokens and first.stats.drafted > 0


@pytest.mark.parametrize("logits_dtype", ["float32", "float16"])
def test_target_only_equals_transformers_generate_on_the_hf_checkpoint(pair, example_tiny, logits_dtype):
    """Greedy through engines whose logits are float16 (what modelopt's checkpoints ask for): the adapters must
    send TensorRT-LLM's greedy (runtime_top_k = 1), not temperature 0, which scales float16 logits by 1e6 into
    ties and samples among them."""
    from transformers import AutoModelForCausalLM

    tokenizer, build = pair
    drafter, verifier = build(logits_dtype=logits_dtype)
    hf = AutoModelForCausalLM.from_pretrained(str(example_tiny.target), dtype=torch.float32).eval()
    for ids in tiny_prompts(tokenizer, 4):
        with torch.no_grad():
            theirs = hf.generate(
                torch.tensor([ids]),
                attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                max_new_tokens=MAX_TOKENS,
                do_sample=False,
                eos_token_id=None,
            )[0, len(ids) :]
        for k in (0, 4):
            ours = run(ids, drafter, verifier, GenerationRequest(max_tokens=MAX_TOKENS, num_draft_tokens=k)).tokens
            assert ours == theirs.tolist(), (k, logits_dtype)


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


# -- the adapters against hand-written responses (no model) ------------------------------------


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


def test_speculative_equals_target_only_on_a_random_pair_with_varied_output(tmp_path):
    """A second pair whose greedy output varies a lot (the tiny example pair repeats itself often):
    a random target, and a draft made from it by adding noise, so drafts are often right, often not."""
    from runtime_models import make_llama, prompts

    target_hf = make_llama(tmp_path / "target", seed=5, vocab=61, layers=2)
    with torch.no_grad():
        for p in target_hf.parameters():
            p.add_(0.02 * torch.randn_like(p))
    target_hf.save_pretrained(tmp_path / "draft")
    target = ContractModel(ReferenceEngine(LlamaModel.from_folder(tmp_path / "target")), Limits(max_draft_len=8))
    draft = ContractModel(ReferenceEngine(LlamaModel.from_folder(tmp_path / "draft")))
    drafter, verifier = ContractDrafter(draft, end_id=2), ContractVerifier(target, max_draft_len=8, end_id=2)
    accepted = drafted = 0
    distinct = set()
    for ids in prompts(50, 61, seed=9):
        baseline = run(ids, drafter, verifier, GenerationRequest(max_tokens=16, num_draft_tokens=0, end_id=2)).tokens
        distinct.update(baseline)
        for k in (1, 2, 4, 8):
            spec = run(ids, drafter, verifier, GenerationRequest(max_tokens=16, num_draft_tokens=k, end_id=2))
            assert spec.tokens == baseline, f"K = {k} diverged for prompt {ids}"
            accepted, drafted = accepted + spec.stats.accepted, drafted + spec.stats.drafted
    assert len(distinct) > 30
    assert 0.2 < accepted / drafted < 0.95


def test_stateless_verify_calls_reuse_the_kv_of_earlier_calls(tmp_path):
    """The loop sends the whole sequence on every call (as the Triton BLS does); with the prefix cache the
    target computes each position about once, instead of re-reading the whole sequence every step."""
    from runtime_models import make_llama, prompts

    make_llama(tmp_path / "m", seed=3, vocab=61)
    counts = {}
    for use_cache in (True, False):
        target = ContractModel(
            ReferenceEngine(LlamaModel.from_folder(tmp_path / "m"), use_cache=use_cache), Limits(max_draft_len=4)
        )
        drafter, verifier = ContractDrafter(target), ContractVerifier(target, max_draft_len=4)  # self-drafting
        ids = prompts(1, 61, seed=4, min_len=20, max_len=20)[0]
        result = run(ids, drafter, verifier, GenerationRequest(max_tokens=40, num_draft_tokens=4))
        counts[use_cache] = (target.engine.computed_rows, result.tokens)
    cached_rows, tokens = counts[True]
    assert tokens == counts[False][1]
    # every drafted position is computed once by the drafter and once more in verification
    assert cached_rows <= 20 + 2 * 40 + 8
    assert counts[False][0] > 5 * cached_rows


# -- the overlapped schedule: the draft model on another thread ----------------------------------


class Watch:
    """Wraps engines' forward passes: how many run at once per engine, and whether draft and target overlapped."""

    def __init__(self, draft_delay_s: float = 0.0):
        self.lock, self.draft_delay_s = threading.Lock(), draft_delay_s
        self.active = {"draft": 0, "target": 0}
        self.most = {"draft": 0, "target": 0}
        self.together = 0  # forward passes that started while the other model's was running

    def wrap(self, engine, role):
        real = engine._forward

        def forward(*args, **kwargs):
            with self.lock:
                self.active[role] += 1
                self.most[role] = max(self.most[role], self.active[role])
                self.together += self.active["target" if role == "draft" else "draft"] > 0
            try:
                if role == "draft" and self.draft_delay_s:
                    time.sleep(self.draft_delay_s)  # a slow drafter: early drafts still running at the next step
                return real(*args, **kwargs)
            finally:
                with self.lock:
                    self.active[role] -= 1

        engine._forward = forward


def test_overlapped_equals_sequential_with_the_draft_model_on_another_thread(pair):
    tokenizer, build = pair
    drafter, verifier = build()
    watch = Watch(draft_delay_s=0.002)
    watch.wrap(drafter.call.engine, "draft")
    watch.wrap(verifier.call.engine, "target")
    eos = tokenizer.eos_token_id
    hits = 0
    for ids in tiny_prompts(tokenizer, 3):
        for k in (2, 4):
            sequential = run(
                ids, drafter, verifier, GenerationRequest(max_tokens=MAX_TOKENS, num_draft_tokens=k, end_id=eos)
            )
            overlapped = run(
                ids,
                drafter,
                verifier,
                GenerationRequest(max_tokens=MAX_TOKENS, num_draft_tokens=k, end_id=eos, overlap=True),
            )
            assert overlapped.tokens == sequential.tokens, (k, tokenizer.decode(ids))
            assert (overlapped.stats.drafted, overlapped.stats.accepted) == (
                sequential.stats.drafted,
                sequential.stats.accepted,
            )
            hits += overlapped.stats.early_draft_hits
    assert hits > 0
    assert watch.together > 0  # the draft model really ran beside the target
    assert watch.most == {"draft": 1, "target": 1}  # and each model's caches saw one call at a time


def test_even_without_the_engine_lock_the_loop_never_sends_the_draft_model_two_calls_at_once(pair):
    """After a miss the stale early draft and the step's own draft both want the draft model: the loop waits for
    a started early draft before it drafts again (overlap.EarlyDraft.take), so the two never meet even with the
    engine's lock taken away (they did, before that rule: this test then saw 2). The same rule keeps one BLS
    request from meeting itself at a Triton model."""
    import contextlib

    tokenizer, build = pair
    drafter, verifier = build()
    drafter.call.engine._lock = contextlib.nullcontext()
    watch = Watch(draft_delay_s=0.003)
    watch.wrap(drafter.call.engine, "draft")
    misses = 0
    for ids in tiny_prompts(tokenizer, 3):
        result = run(
            ids,
            drafter,
            verifier,
            GenerationRequest(max_tokens=MAX_TOKENS, num_draft_tokens=4, end_id=tokenizer.eos_token_id, overlap=True),
        )
        misses += result.stats.early_drafts - result.stats.early_draft_hits
    assert misses > 0  # early drafts missed: each time the loop wanted the draft model while it had one
    assert watch.most["draft"] == 1


def test_seeded_sampling_overlapped_equals_sequential_on_the_tiny_pair(pair):
    tokenizer, build = pair
    drafter, verifier = build()
    drafter.use_logits = True
    hits = 0
    for seed, ids in enumerate(tiny_prompts(tokenizer, 2)):
        sampling = SamplingParams(temperature=0.9, top_p=0.95, seed=seed)
        request = GenerationRequest(max_tokens=20, num_draft_tokens=3, end_id=tokenizer.eos_token_id, sampling=sampling)
        sequential = run(ids, drafter, verifier, request)
        overlapped = run(ids, drafter, verifier, GenerationRequest(**{**vars(request), "overlap": True}))
        assert overlapped.tokens == sequential.tokens, seed
        hits += overlapped.stats.early_draft_hits
    assert hits > 0


@pytest.mark.parametrize("sampled", [False, True])
def test_a_draft_that_ends_early_at_end_id_still_gives_the_targets_output(pair, example_tiny, sampled):
    """NVIDIA's BLS sets min_tokens = K on the draft request; specbuild does not: a draft that stops at end_id before
    K tokens is a shorter draft, which the target verifies like any other (TensorRT-LLM takes 0..max_draft_len draft
    tokens). The end id here is a token the draft proposes where the target says something else, so the draft ends
    early while the target goes on: greedy, the output is target-only decoding's (ending at that id) token for
    token; sampled with a seed, the target's verification of every short draft goes through and the text is
    reproducible."""
    tokenizer, _ = pair
    target = ContractModel(ReferenceEngine(LlamaModel.from_folder(example_tiny.target)), Limits(max_draft_len=8))
    draft = ContractModel(ReferenceEngine(LlamaModel.from_folder(example_tiny.draft)), Limits())

    def greedy(model, prompt, n):
        out = model(
            {
                "input_ids": np.array(prompt, np.int32),
                "input_lengths": np.array([len(prompt)], np.int32),
                "request_output_len": np.array([n], np.int32),
            }
        )
        return out["output_ids"][0].tolist()[len(prompt) :]

    for prompt in tiny_prompts(tokenizer, 5):  # one where the draft, decoding alone, says what the target does not
        by_target, by_draft = greedy(target, prompt, MAX_TOKENS), greedy(draft, prompt, MAX_TOKENS)
        end = next((d for t, d in zip(by_target, by_draft) if d != t), None)
        if end is not None:
            break
    expected = by_target[: by_target.index(end)] if end in by_target else by_target  # target-only, ending at end
    drafter, verifier = ContractDrafter(draft, end_id=end), ContractVerifier(target, max_draft_len=8, end_id=end)
    short = []
    real_propose = drafter.propose

    def propose(tokens, k, sampling):
        proposal = real_propose(tokens, k, sampling)
        short.append(len(proposal.tokens) < k)
        return proposal

    drafter.propose = propose
    sampling = SamplingParams(temperature=0.8, seed=3) if sampled else SamplingParams()
    request = GenerationRequest(max_tokens=MAX_TOKENS, num_draft_tokens=4, sampling=sampling, end_id=end)
    first = run(prompt, drafter, verifier, request).tokens
    assert any(short), "no draft ended early: the test proved nothing"
    if sampled:
        assert run(prompt, drafter, verifier, request).tokens == first  # the same seed, the same text
    else:
        assert first == expected


@pytest.mark.parametrize("name", ["lookup", "hybrid"])
def test_every_drafter_equals_target_only_on_held_out_and_input_grounded_prompts(pair, name):
    """Prompt lookup (with the pool across requests) and the hybrid, on the example pair: greedy output token for token
    K = 0's, on the held-out code, prose and JSON prompts and on the input-grounded sets (bench.workloads)."""
    from specbuild.bench.workloads import grounded
    from specbuild.decode.drafting import Drafting
    from specbuild.drafters import LookupSettings

    tokenizer, build = pair
    model, verifier = build()
    eos = tokenizer.eos_token_id
    drafting = Drafting.create(name, model, LookupSettings(max_matching_ngram_size=3, is_public_pool=True))
    cases = tiny_prompts(tokenizer, 4) + [
        tokenizer(t)["input_ids"] for t in grounded("mixed", 6) + grounded("quote", 2)
    ]
    proposals = 0
    for ids in cases:
        baseline = run(ids, model, verifier, GenerationRequest(max_tokens=MAX_TOKENS, num_draft_tokens=0, end_id=eos))
        for k in (2, 8):
            out = run(
                ids,
                drafting.drafter(name),
                verifier,
                GenerationRequest(max_tokens=MAX_TOKENS, num_draft_tokens=k, end_id=eos),
            )
            assert out.tokens == baseline.tokens, f"{name} K = {k} diverged for {tokenizer.decode(ids)!r}"
            proposals += out.stats.by_drafter.get("lookup", {}).get("proposals", 0)
        drafting.remember(name, ids, baseline.tokens, out.stats)
    assert proposals > 0 and drafting.pool.figures()["sequences"] == len(cases)


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
    import time

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
