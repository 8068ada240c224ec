"""The committed full example pair has its documented qualities, re-measured here (not read from its
record): the draft agrees with the target, the target is stronger (lower held-out loss) and costlier
(decode cost ratio c about 0.2), and its greedy text is not one repeated token."""

from __future__ import annotations

import pytest
import torch
from runtime_models import single_thread  # noqa: F401 (autouse fixture: one torch thread)

from specbuild import corpus
from specbuild.example import ensure_example
from specbuild.example.recipe import VARIANTS


@pytest.fixture(scope="module")
def full_models(example_cache_dir):
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    pair = ensure_example("full", progress=False)
    models = [
        AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
        for folder in (pair.target, pair.draft)
    ]
    return pair, Tokenizer.from_file(str(pair.target / "tokenizer.json")), *models


@pytest.mark.slow
def test_full_pair_agrees_and_the_target_is_stronger(full_models):
    from specbuild.example import train

    pair, tok, target, draft = full_models
    measured = train.measure_agreement(target, draft, tok, VARIANTS["full"])
    assert measured["agreement"] >= 0.6, measured["agreement_by_kind"]
    assert min(measured["agreement_by_kind"].values()) >= 0.4, measured["agreement_by_kind"]
    assert measured["heldout_loss"]["target"] < measured["heldout_loss"]["draft"]
    assert measured["continuation_distinct_ratio"] >= 0.3  # greedy text, not a single repeated token
    assert pair.info["params"]["target"] >= 4 * pair.info["params"]["draft"]
    if corpus.describe()["fingerprint"] == pair.info["corpus"]["fingerprint"]:
        # Same held-out prompts as the build: the record holds what these weights give (up to kernel
        # differences between CPUs, which may flip a near-tie argmax).
        assert measured["agreement"] == pytest.approx(pair.info["agreement"], abs=0.03)
        assert measured["heldout_loss"]["target"] == pytest.approx(pair.info["heldout_loss"]["target"], abs=0.02)


@pytest.mark.slow
def test_full_pair_draft_is_much_cheaper_than_the_target_on_this_cpu(full_models):
    from specbuild.example import train

    _, _, target, draft = full_models
    cost = train.measure_cost_ratio(target, draft)
    # About 0.2 at batch 1 with a KV cache; generous bounds because other work may share the machine.
    assert 0.05 <= cost["cost_ratio"] <= 0.45, cost
