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

from specbuild.contract.adapters import ContractDrafter, ContractVerifier
from specbuild.reference.contract_model import ContractModel, Limits
from specbuild.reference.engine import ReferenceEngine
from specbuild.reference.model import LlamaModel
from specbuild.speculative.interfaces import SamplingParams
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


# -- the adapters against hand-written responses (no model) ------------------------------------


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
                verifier,  # the hybrid drafted ahead at K = 8 (its draft model's early drafts), sequentially at 2
                GenerationRequest(
                    max_tokens=MAX_TOKENS, num_draft_tokens=k, end_id=eos, overlap=name == "hybrid" and k == 8
                ),
            )
            assert out.tokens == baseline.tokens, f"{name} K = {k} diverged for {tokenizer.decode(ids)!r}"
            proposals += out.stats.by_drafter.get("lookup", {}).get("proposals", 0)
        drafting.remember(name, ids, baseline.tokens, out.stats)
    assert proposals > 0 and drafting.pool.figures()["sequences"] == len(cases)
