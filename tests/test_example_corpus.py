"""The example corpus: deterministic, held-out text disjoint from training text."""

from __future__ import annotations

import json

import pytest

from specbuild import corpus
from specbuild.example.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID, train_tokenizer


def test_code_split_is_disjoint_and_stable():
    train, heldout = corpus.code_texts("train"), corpus.code_texts("heldout")
    assert len(train) > 3 * len(heldout) > 0
    assert not set(train) & set(heldout)
    assert corpus.code_texts("train") == train
    names = corpus.describe()["heldout_files"]
    assert names == sorted(names) and len(names) == len(heldout)


def test_json_records_are_seeded_json_and_heldout_differs():
    records = corpus.json_records(50, seed=3)
    assert records == corpus.json_records(50, seed=3)
    assert records != corpus.json_records(50, seed=4)
    parsed = [json.loads(r) for r in records]
    assert [p["id"] for p in parsed] == list(range(1, 51))
    assert {p["type"] for p in parsed} == {"user", "order", "event", "log"}
    train = set(corpus.json_records(400, seed=corpus.TRAIN_JSON_SEED))
    held = corpus.heldout_prompts("json", 3)
    assert all(line not in train for prompt in held for line in prompt.splitlines() if line.endswith("}"))


@pytest.mark.parametrize("kind", corpus.KINDS)
def test_heldout_prompts_come_from_heldout_text(kind):
    prompts = corpus.heldout_prompts(kind, 5, chars=300)
    assert len(prompts) == 5 and len(set(prompts)) == 5
    assert all(0 < len(p) <= 300 for p in prompts)
    assert prompts == corpus.heldout_prompts(kind, 5, chars=300)
    if kind != "json":
        source = corpus.code_texts("heldout") if kind == "code" else corpus.prose_texts("heldout")
        assert all(any(p in text for text in source) for p in prompts)
        training = corpus.code_texts("train") if kind == "code" else corpus.prose_texts("train")
        assert not any(prompts[0] in text for text in training)


def test_bad_kind_and_split_are_rejected():
    with pytest.raises(ValueError, match="kind must be one of"):
        corpus.heldout_prompts("poetry", 1)
    with pytest.raises(ValueError, match="split must be"):
        corpus.code_texts("test")


def test_tokenizer_training_is_deterministic_with_llama_special_ids():
    texts = corpus.code_texts("train")[:6] + corpus.json_records(50)
    first, second = train_tokenizer(texts, 400), train_tokenizer(texts, 400)
    assert first.to_str() == second.to_str()
    assert first.get_vocab_size() == 400
    assert [first.token_to_id(t) for t in ("<unk>", "<s>", "</s>", "<pad>")] == [UNK_ID, BOS_ID, EOS_ID, PAD_ID]
    assert first.encode("x = 1").ids[0] == BOS_ID
