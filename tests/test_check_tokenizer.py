"""Tokenizer equivalence: full id -> token map, added and special tokens, first difference named."""

from __future__ import annotations

import json

import pytest
from check_fixtures import words, write_tokenizer

from specbuild.check.tokenizer import compare_tokenizers, first_differing_id, load_tokenizer_facts
from specbuild.errors import CheckpointError


def facts(folder, tokens, **kwargs):
    write_tokenizer(folder, tokens, **kwargs)
    return load_tokenizer_facts(folder)


def test_identical_tokenizers(tmp_path):
    a, b = facts(tmp_path / "a", words(50)), facts(tmp_path / "b", words(50))
    result = compare_tokenizers(a, b)
    assert result.identical and result.first_difference is None and result.differences == []
    assert a.size == 50 and a.source == "tokenizer.json"
    assert a.special_tokens == {"bos": "<s>", "eos": "</s>", "pad": None, "unk": "<unk>"}
    assert a.special_ids == {"bos": 1, "eos": 2, "pad": None, "unk": 0}


def test_one_token_differs_and_is_named(tmp_path):
    tokens = words(50)
    changed = list(tokens)
    changed[17], changed[30] = "hello", "world"
    result = compare_tokenizers(facts(tmp_path / "a", tokens), facts(tmp_path / "b", changed))
    assert not result.identical
    assert result.first_difference == {"id": 17, "target": "w17", "draft": "hello"}
    assert result.differences[0] == (
        "vocabulary differs at 2 id(s), the first is id 17: target has 'w17', draft has 'hello'"
    )


def test_token_missing_on_one_side(tmp_path):
    result = compare_tokenizers(facts(tmp_path / "a", words(50)), facts(tmp_path / "b", words(48)))
    assert result.first_difference == {"id": 48, "target": "w48", "draft": None}
    assert "id 48: target has 'w48', draft has no token" in result.differences[0]


def test_same_tokens_with_swapped_ids(tmp_path):
    tokens = words(20)
    swapped = list(tokens)
    swapped[5], swapped[6] = swapped[6], swapped[5]
    result = compare_tokenizers(facts(tmp_path / "a", tokens), facts(tmp_path / "b", swapped))
    assert result.first_difference == {"id": 5, "target": "w5", "draft": "w6"}


def test_added_tokens_differ(tmp_path):
    a = facts(tmp_path / "a", words(20), added=["<tool>"])
    b = facts(tmp_path / "b", words(20), added=["<call>"])
    result = compare_tokenizers(a, b)
    assert not result.identical
    assert result.first_difference == {"id": 20, "target": "<tool>", "draft": "<call>"}
    assert (
        "added tokens differ, the first is id 20: target has '<tool> (special=True)', draft has '<call> (special=True)'"
    ) in result.differences


def test_eos_differs(tmp_path):
    a = facts(tmp_path / "a", words(20))
    b = facts(tmp_path / "b", words(20), eos="<unk>")
    result = compare_tokenizers(a, b)
    assert not result.identical
    assert result.first_difference is None  # same vocabulary ...
    assert result.differences == ["eos token differs: target '</s>' (id 2), draft '<unk>' (id 0)"]


def test_generation_config_eos_ids_are_compared(tmp_path):
    a = facts(tmp_path / "a", words(20))
    write_tokenizer(tmp_path / "b", words(20))
    (tmp_path / "b" / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 7]}))
    b = load_tokenizer_facts(tmp_path / "b")
    assert b.special_ids["eos"] == [2, 7]
    assert not compare_tokenizers(a, b).identical


def test_different_pre_tokenizer_is_only_a_pipeline_difference(tmp_path):
    from tokenizers import pre_tokenizers

    a = facts(tmp_path / "a", words(20))
    write_tokenizer(tmp_path / "b", words(20))
    raw = json.loads((tmp_path / "b" / "tokenizer.json").read_text())
    raw["pre_tokenizer"] = json.loads(pre_tokenizers.WhitespaceSplit().__getstate__())
    (tmp_path / "b" / "tokenizer.json").write_text(json.dumps(raw))
    result = compare_tokenizers(a, load_tokenizer_facts(tmp_path / "b"))
    assert result.identical
    assert result.pipeline_differences == ["pre_tokenizer differs"]


def test_slow_tokenizer_falls_back_to_transformers(tmp_path):
    pytest.importorskip("transformers")
    vocab = {"<|endoftext|>": 0, "a": 1, "b": 2, "ab": 3}
    for name, extra in (("x", {}), ("y", {"c": 4})):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "vocab.json").write_text(json.dumps({**vocab, **extra}))
        (folder / "merges.txt").write_text("#version: 0.2\na b\n")
        (folder / "tokenizer_config.json").write_text(
            json.dumps({"tokenizer_class": "GPT2Tokenizer", "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>"})
        )
    x, y = load_tokenizer_facts(tmp_path / "x"), load_tokenizer_facts(tmp_path / "y")
    assert x.source == "transformers"
    assert x.id_to_token == {0: "<|endoftext|>", 1: "a", 2: "b", 3: "ab"}
    assert x.special_ids["eos"] == 0
    assert compare_tokenizers(x, y).first_difference == {"id": 4, "target": None, "draft": "c"}


def test_no_tokenizer_files(tmp_path):
    with pytest.raises(CheckpointError, match="has no tokenizer"):
        load_tokenizer_facts(tmp_path, role="draft")


def test_broken_tokenizer_json(tmp_path):
    (tmp_path / "tokenizer.json").write_text("{}")
    with pytest.raises(CheckpointError, match="tokenizer .* cannot be loaded"):
        load_tokenizer_facts(tmp_path)


def test_first_differing_id_table():
    assert first_differing_id({}, {}) is None
    assert first_differing_id({0: "a", 1: "b"}, {0: "a", 1: "b"}) is None
    assert first_differing_id({0: "a", 2: "c"}, {0: "a", 1: "b", 2: "c"}) == {"id": 1, "target": None, "draft": "b"}
    assert first_differing_id({5: "x", 9: "y"}, {5: "x", 9: "z"}) == {"id": 9, "target": "y", "draft": "z"}
