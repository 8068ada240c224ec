"""Drafters without a draft model: prompt lookup's rules, the pool's bound, the hybrid's choice, and exactness (greedy
output equal to K = 0, sampled output distributed as the target's) on the toy pair; the example pair's held-out
prompts are in tests/test_runtime_speculative.py, every family's in tests/test_families.py, the server's in
tests/test_bls_server.py."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from test_speculative_distribution import P_CORRECT, P_WRONG, chi_square_pvalue, exact_joint
from toy_model import NGramModel, ToyDrafter, ToyVerifier, random_model

from specbuild import drafters
from specbuild.decode.drafting import Drafting
from specbuild.decode.generation import Options
from specbuild.drafters import LookupSettings
from specbuild.errors import RequestError, SpecError
from specbuild.session.local import LocalSession
from specbuild.speculative.interfaces import SamplingParams, Verification
from specbuild.speculative.lookup import HybridDrafter, LookupDrafter, LookupPool, find_match
from specbuild.speculative.loop import GenerationRequest, run
from specbuild.speculative.sampling import process_logits

GREEDY = SamplingParams()


# ---- prompt lookup's rules ---------------------------------------------------------------------------------------
def test_the_longest_ngram_is_tried_first_and_its_continuation_proposed():
    context = [5, 6, 7, 8, 9, 1, 7, 3, 4, 6, 7]  # ends with "6 7": found at 1; "7" alone also at 2 and 6
    found = find_match(context, 3, LookupSettings(max_matching_ngram_size=3))
    assert (found.tokens, found.ngram, found.where) == ([8, 9, 1], 2, "request")
    assert find_match(context, 3, LookupSettings(max_matching_ngram_size=1)).tokens == [8, 9, 1]  # "7" at 2, oldest


def test_oldest_or_newest_match_as_nvidia_names_them():
    context = [1, 2, 10, 1, 2, 20, 1, 2]
    assert find_match(context, 1, LookupSettings(is_use_oldest=True)).tokens == [10]
    assert find_match(context, 1, LookupSettings(is_use_oldest=False)).tokens == [20]
    assert find_match(context, 1, LookupSettings(is_keep_all=False)).tokens == [20]  # one match kept: the newest


def test_no_match_is_no_proposal_and_the_tail_never_matches_itself():
    assert find_match([1, 2, 3, 4], 4, LookupSettings()) is None
    assert find_match([7], 4, LookupSettings()) is None
    assert find_match([3, 3], 4, LookupSettings()).tokens == [3]  # the first 3, followed by the second
    found = find_match([1, 2, 3, 1, 2], 8, LookupSettings())
    assert found.tokens == [3, 1, 2]  # up to k, and never past the context's end
    draft = LookupDrafter(LookupSettings()).propose([1, 2, 3, 4], 4, GREEDY)
    assert (draft.tokens, draft.probs, draft.source) == ([], None, "lookup")


def test_the_pool_serves_other_requests_text_newest_first_within_its_cap():
    pool = LookupPool(max_tokens=10)
    pool.add([1, 2, 3, 4, 5])
    pool.add([1, 2, 9, 9])
    settings = LookupSettings(is_public_pool=True)
    found = find_match([7, 1, 2], 2, settings, pool)
    assert (found.tokens, found.where) == ([9, 9], "pool")  # the newest request first
    assert find_match([7, 8, 1, 2, 6, 1, 2], 2, settings, pool).where == "request"  # its own text first
    pool.add([4, 4, 4])  # 12 tokens would exceed 10: the oldest sequence goes
    figures = pool.figures()
    assert figures == {"sequences": 2, "tokens": 7, "max_tokens": 10, "added": 3, "evicted": 1}
    assert find_match([0, 3], 2, settings, pool) is None  # what went is gone
    pool.add(list(range(30)))  # longer than the cap: its last 10 tokens stay
    assert pool.tokens <= pool.max_tokens and pool.sequences()[0].tolist() == list(range(20, 30))


def test_the_hybrid_looks_up_on_a_long_match_and_asks_the_model_otherwise():
    model = ToyDrafter(random_model(8, seed=3))
    hybrid = HybridDrafter(LookupDrafter(LookupSettings(max_matching_ngram_size=3, hybrid_min_match=2)), model)
    looked_up = hybrid.propose([1, 2, 3, 5, 1, 2], 2, GREEDY)
    assert (looked_up.tokens, looked_up.source, model.calls) == ([3, 5], "lookup", 0)  # the model was not called
    modelled = hybrid.propose([1, 2, 3, 5, 6, 2], 2, GREEDY)  # only "2" matches: one token is not enough
    assert (modelled.source, model.calls, len(modelled.tokens)) == ("model", 1, 2)


@pytest.mark.parametrize("lookup_right", [True, False])
def test_the_hybrid_keeps_the_drafter_whose_proposals_the_text_follows(lookup_right):
    """The hybrid learns from how the text went on after each proposal: it keeps looking up while the lookup's tokens
    are the text's, and turns to the draft model when they are not (seeded sampling: the rule uses no timings)."""
    model = ToyDrafter(random_model(16, seed=4))
    hybrid = HybridDrafter(LookupDrafter(LookupSettings(max_matching_ngram_size=3)), model)
    seeded = SamplingParams(temperature=1.0, seed=1)
    context, sources = [1, 2, 3, 4, 5, 6, 1, 2, 3], []
    for _ in range(6):
        draft = hybrid.propose(context, 3, seeded)
        sources.append(draft.source)
        followed = draft.source == "model" or lookup_right
        context = context + (list(draft.tokens) if followed else [15]) + [1, 2, 3]  # then the n-gram again
    assert sources[0] == "lookup"  # before anything is measured, a long match is taken
    assert sources[-3:] == (["lookup"] * 3 if lookup_right else ["model"] * 3), sources
    assert hybrid.acceptance("lookup") > 0.5 if lookup_right else hybrid.acceptance("lookup") < 0.5


def test_the_hybrid_drafts_ahead_with_its_draft_model_and_learns_from_the_hits():
    """Drafting ahead, the hybrid's early drafts are its draft model's, proposed on the worker thread; a hit is taken
    as a model step would take it, and the hybrid counts it as the model's proposal (its acceptance rises with it)."""
    model = ToyDrafter(TARGET)  # the target's own model: every early draft hits
    hybrid = HybridDrafter(LookupDrafter(LookupSettings(max_matching_ngram_size=3)), model)
    calls = []
    hybrid.propose = lambda tokens, k, sampling, own=hybrid.propose: (
        calls.append(threading.get_ident()) or own(tokens, k, sampling)
    )
    prompt = repeating_prompts(1)[0]
    request = GenerationRequest(max_tokens=30, num_draft_tokens=3, overlap=True)
    out = run(prompt, hybrid, ToyVerifier(TARGET, max_draft_len=8), request)
    baseline = run(prompt, model, ToyVerifier(TARGET, max_draft_len=8), GenerationRequest(max_tokens=30))
    assert out.tokens == baseline.tokens
    assert out.stats.early_draft_hits > 0 and set(calls) == {threading.get_ident()}
    proposals = sum(entry["proposals"] for entry in out.stats.by_drafter.values())
    assert len(calls) == proposals - out.stats.early_draft_hits  # the hits asked the hybrid nothing
    accepted, drafted = hybrid.counts["model"]
    assert drafted - HybridDrafter.PRIOR[1] >= 3 * (out.stats.early_draft_hits - 1)  # hits learned as model proposals
    assert accepted / drafted > 0.9


def test_the_spec_takes_a_drafter_and_lookup_settings_and_refuses_nonsense(tiny_spec_path):
    from specbuild.config import load_spec

    text = tiny_spec_path.read_text()
    assert 'drafter = "model"' in text and "[lookup]" in text  # init writes every key, with its reason
    tiny_spec_path.write_text(text.replace('drafter = "model"', 'drafter = "hybrid"'))
    assert load_spec(tiny_spec_path).speculative.drafter == "hybrid"
    tiny_spec_path.write_text(text.replace('drafter = "model"', 'drafter = "lookahead"'))
    with pytest.raises(SpecError, match=r"speculative.drafter = 'lookahead' is not supported.*model, lookup, hybrid"):
        load_spec(tiny_spec_path)
    tiny_spec_path.write_text(text.replace("hybrid_min_match = 2", "hybrid_min_match = 3"))
    with pytest.raises(SpecError, match="hybrid_min_match = 3 exceeds max_matching_ngram_size = 2"):
        load_spec(tiny_spec_path)


# ---- exactness on the toy pair -----------------------------------------------------------------------------------
VOCAB = 12
TARGET = random_model(VOCAB, order=2, scale=2.0, seed=21)
DRAFT = NGramModel(TARGET.table + np.random.default_rng(22).normal(0.0, 0.7, size=TARGET.table.shape))


def repeating_prompts(n: int, seed: int = 5) -> list[list[int]]:
    """Prompts that quote themselves (an edit of a given text), so lookup has something to find."""
    rng = np.random.default_rng(seed)
    prompts = []
    for _ in range(n):
        body = rng.integers(0, VOCAB, size=int(rng.integers(6, 14))).tolist()
        prompts.append(body + rng.integers(0, VOCAB, size=2).tolist() + body[: int(rng.integers(2, 5))])
    return prompts


@pytest.mark.parametrize("overlap", [False, True, "auto"])
@pytest.mark.parametrize("name", drafters.NAMES)
def test_every_drafter_gives_k0s_greedy_output_on_held_out_prompts(name, overlap):
    drafting = Drafting.create(name, ToyDrafter(DRAFT), LookupSettings(max_matching_ngram_size=3, is_public_pool=True))
    verifier = ToyVerifier(TARGET, max_draft_len=8)
    proposals = 0
    for prompt in repeating_prompts(40):
        baseline = run(
            prompt, drafting.drafter("model"), verifier, GenerationRequest(max_tokens=20, num_draft_tokens=0)
        )
        for k in (1, 3, 8):
            request = GenerationRequest(max_tokens=20, num_draft_tokens=k, overlap=overlap)
            out = run(prompt, drafting.drafter(name), verifier, request)
            assert out.tokens == baseline.tokens, (name, k, prompt)
            proposals += sum(entry["proposals"] for entry in out.stats.by_drafter.values())
            assert set(out.stats.by_drafter) <= {"model", "lookup"}
        drafting.remember(name, prompt, baseline.tokens, out.stats)
    assert proposals > 0
    assert drafting.pool.figures()["sequences"] == (40 if name != "model" else 0)  # filled by the lookup's requests


class AcceptEveryLookupToken(ToyVerifier):
    """A wrong rule: takes a deterministic draft's tokens whatever the target thinks of them."""

    def verify(self, tokens, draft, sampling):
        if draft.probs is None and draft.tokens:
            p = process_logits(self.model.positions(tokens, draft.tokens), sampling)
            extra = int(np.random.default_rng(sampling.seed).choice(p.shape[1], p=p[-1]))
            return Verification(len(draft.tokens), [*draft.tokens, extra])
        return super().verify(tokens, draft, sampling)


def lookup_samples(verifier: ToyVerifier, prompt: list[int], n: int) -> np.ndarray:
    drafter = LookupDrafter(LookupSettings(max_matching_ngram_size=2))
    sampling = SamplingParams(temperature=1.0)
    out = np.zeros((n, 3), dtype=np.int64)
    for i in range(n):
        request = GenerationRequest(max_tokens=3, num_draft_tokens=2, sampling=SamplingParams(temperature=1.0, seed=i))
        out[i] = run(prompt, drafter, verifier, request).tokens
    assert sampling.temperature == 1.0
    return out


def test_sampling_with_lookup_proposals_follows_the_targets_distribution():
    """A lookup proposal is a one-hot q: the chi-square test of test_speculative_distribution.py passes with the real
    rule and catches a rule that keeps lookup tokens unchecked."""
    target = random_model(4, order=2, scale=1.5, seed=10)
    prompt = [2, 3, 1, 2, 3, 0, 3, 2, 3]  # "3" and "2 3" recur: most steps get a proposal
    joint = exact_joint(target, prompt, 3, SamplingParams(temperature=1.0))
    assert chi_square_pvalue(lookup_samples(ToyVerifier(target), prompt, 12_000), joint) > P_CORRECT
    assert chi_square_pvalue(lookup_samples(AcceptEveryLookupToken(target), prompt, 6_000), joint) < P_WRONG


# ---- per request, in a session -----------------------------------------------------------------------------------
def toy_session(default: str = "model", **settings) -> LocalSession:
    model = ToyDrafter(DRAFT)
    return LocalSession(
        model,
        ToyVerifier(TARGET, max_draft_len=4),
        encode=lambda text: [ord(ch) % VOCAB for ch in text],
        drafting=Drafting.create(default, model, LookupSettings(**settings)),
    )


def test_a_request_chooses_its_drafter_and_the_stats_say_who_proposed():
    session = toy_session(is_public_pool=True)
    prompt = "abcdefgh-abcdefgh-abcd"
    by_default = session.generate(prompt, Options(max_tokens=12, num_draft_tokens=4, adaptive=False))
    looked_up = session.generate(prompt, Options(max_tokens=12, num_draft_tokens=4, adaptive=False, drafter="lookup"))
    assert by_default.drafter == "model" and looked_up.drafter == "lookup"
    assert looked_up.output_ids == by_default.output_ids
    assert set(looked_up.stats.by_drafter) == {"lookup"} and set(by_default.stats.by_drafter) == {"model"}
    document = looked_up.to_dict()
    assert document["drafter"] == "lookup" and document["by_drafter"]["lookup"]["steps"] == looked_up.stats.steps
    assert document["lookup_pool"]["sequences"] == 1  # only the request the lookup drafted for fills the pool
    assert document["overlap_reason"].startswith("overlap off")
    ahead = {
        name: Options(max_tokens=12, num_draft_tokens=4, adaptive=False, drafter=name, overlap=True)
        for name in ("hybrid", "lookup")
    }
    hybrid, alone = session.generate(prompt, ahead["hybrid"]), session.generate(prompt, ahead["lookup"])
    assert hybrid.output_ids == alone.output_ids == by_default.output_ids
    assert (hybrid.overlap, hybrid.to_dict()["overlap_reason"]) == (True, "overlap True as asked")  # its draft model's
    assert (alone.overlap, alone.to_dict()["overlap_reason"]) == (False, "overlap off: drafter lookup (decode.request)")
    with pytest.raises(RequestError, match="drafter = 'ngram' is unknown. Use one of: model, lookup, hybrid"):
        session.generate(prompt, Options(max_tokens=4, drafter="ngram"))


def test_a_deployment_without_a_draft_model_refuses_the_model_drafters_by_name():
    session = LocalSession(
        None,
        ToyVerifier(TARGET, max_draft_len=4),
        encode=lambda text: [ord(ch) % VOCAB for ch in text],
        drafting=Drafting.create("lookup", None, LookupSettings()),
    )
    assert session.generate("abcabcab", Options(max_tokens=6, num_draft_tokens=4)).drafter == "lookup"
    with pytest.raises(RequestError, match="drafter = 'hybrid' cannot run here: this deployment has no draft model"):
        session.generate("abcabcab", Options(max_tokens=6, drafter="hybrid"))


def test_check_says_before_anything_is_built_where_a_path_cannot_run_the_drafter(tiny_spec_path):
    import json

    from click.testing import CliRunner

    from specbuild.cli import main

    text = tiny_spec_path.read_text()
    tiny_spec_path.write_text(text.replace('drafter = "model"', 'drafter = "hybrid"'))
    base = ["check", "-c", str(tiny_spec_path), "--no-weight-scan", "--json"]
    refused = CliRunner().invoke(main, [*base, "--backend", "llmapi"])
    assert refused.exit_code != 0
    problems = {p["code"]: p for p in json.loads(refused.stdout)["problems"]}
    assert "has no equivalent on the LLM API path" in problems["drafter_not_on_path"]["message"]
    converted = CliRunner().invoke(main, ["convert", "-c", str(tiny_spec_path), "--backend", "llmapi"])
    assert converted.exit_code != 0 and "has no equivalent on the LLM API path" in converted.output  # refused there too
    taken = CliRunner().invoke(main, [*base, "--backend", "reference"])
    assert "drafter_not_on_path" not in taken.stdout
